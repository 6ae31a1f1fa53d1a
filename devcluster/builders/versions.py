"""The Kubernetes releases the dev cluster and the e2e suite run: the default and the oldest.

One :class:`K8sRelease` per supported minor says everything that differs between them: the
patch release built from the Go module proxy, the wrapper module's ``go``/``godebug`` lines
(upstream's own go.mod values), the staging modules k8s.io/kubernetes requires at ``v0.0.0``,
the containerd paired with it, and the feature gates and API groups the cluster turns on.

``DRANET_K8S_VERSION`` picks one (``v1.34.10``, ``1.34`` or ``v1.34``; default :data:`DEFAULT`),
e.g. ``DRANET_K8S_VERSION=v1.34.10 make test`` runs the whole suite on the oldest supported
release. Every binary is cached per version (``~/.cache/dranet/k8s/<version>``), so switching
back and forth builds each release once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

ENV = "DRANET_K8S_VERSION"

# Every staging module k8s.io/kubernetes v1.34 requires at v0.0.0 (its go.mod's replace block).
_STAGING_1_34 = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
)


class VersionError(ValueError):
    """``DRANET_K8S_VERSION`` names a release this project does not support."""


@dataclass(frozen=True)
class K8sRelease:
    """One supported Kubernetes minor and how the dev cluster runs it."""

    version: str  # the patch release built, e.g. "v1.37.2"
    go_line: str  # k/k's go.mod ``go`` line at that release
    staging: tuple[str, ...]
    containerd: str
    # Gates the node tests need that are not on by default in this release (every component).
    feature_gates: dict[str, bool] = field(default_factory=dict)
    runtime_config: dict[str, str] = field(default_factory=dict)

    @property
    def minor(self) -> str:
        """``"1.37"``."""
        return ".".join(self.version.lstrip("v").split(".")[:2])

    @property
    def staging_version(self) -> str:
        """The staging modules' tag for this release: ``v0.37.2`` for ``v1.37.2``."""
        return "v0." + self.version[len("v1.") :]

    @property
    def godebug(self) -> str:
        """Upstream's ``godebug default=`` value: the Go minor of its go line (``go1.26``)."""
        return "go" + ".".join(self.go_line.split(".")[:2])

    @property
    def fail_cgroup_v1(self) -> bool | None:
        """The kubelet's ``failCgroupV1``: from 1.35 it defaults to true, and this machine is
        cgroup v1 (1.37's kubelet still supports v1 when told not to refuse it)."""
        return False if tuple(map(int, self.minor.split("."))) >= (1, 35) else None


RELEASES: dict[str, K8sRelease] = {
    "1.34": K8sRelease(
        version="v1.34.10",  # newest 1.34 patch the proxy serves AND sum.golang.org verifies
        go_line="1.24.0",
        staging=_STAGING_1_34,
        # containerd's own support table lists 2.1/2.0 for 1.34; CRI v1 is unchanged and the
        # node tests pass with 2.4, so one containerd build serves both releases.
        containerd="v2.4.2",
        feature_gates={
            # Device taints in ResourceSlices (dra.net/unhealthy) and the scheduler honouring them.
            "DRADeviceTaints": True,
            # The kubelet's per-device health (DRAResourceHealth stream).
            "ResourceHealthStatus": True,
        },
        # With DRADeviceTaints the 1.34 scheduler waits for its DeviceTaintRule informer
        # (resource.k8s.io/v1alpha3) to sync before it schedules anything.
        runtime_config={"resource.k8s.io/v1alpha3": "true"},
    ),
    "1.37": K8sRelease(
        version="v1.37.2",
        go_line="1.26.0",
        # 1.36 added k8s.io/streaming, 1.37 k8s.io/cri-streaming.
        staging=tuple(sorted((*_STAGING_1_34, "cri-streaming", "streaming"))),
        containerd="v2.4.2",
        # DRADeviceTaints is GA (DeviceTaintRule in resource.k8s.io/v1) and ResourceHealthStatus
        # beta and on by default: nothing to turn on.
    ),
}
DEFAULT = "1.37"
OLDEST = "1.34"


def release(spec: str | None = None) -> K8sRelease:
    """The release ``spec`` names (``v1.34.10``, ``1.34``, ``v1.34``), else ``$DRANET_K8S_VERSION``,
    else the default. A patch other than the pinned one is built as asked."""
    spec = (spec if spec is not None else os.environ.get(ENV, "")).strip()
    if not spec:
        return RELEASES[DEFAULT]
    m = re.fullmatch(r"v?(1\.\d+)(?:\.(\d+))?", spec)
    if not m or m.group(1) not in RELEASES:
        raise VersionError(
            f"{ENV}={spec!r}: supported Kubernetes releases are "
            + ", ".join(f"v{k}.x" for k in sorted(RELEASES))
            + f" (default {RELEASES[DEFAULT].version})"
        )
    base = RELEASES[m.group(1)]
    if m.group(2) is None:
        return base
    return K8sRelease(
        version=f"v{m.group(1)}.{m.group(2)}",
        go_line=base.go_line,
        staging=base.staging,
        containerd=base.containerd,
        feature_gates=dict(base.feature_gates),
        runtime_config=dict(base.runtime_config),
    )


def selected() -> K8sRelease:
    """:func:`release` for module constants: a bad ``DRANET_K8S_VERSION`` stops with one line."""
    try:
        return release()
    except VersionError as exc:
        raise SystemExit(f"error: {exc}") from None


def supported_range() -> str:
    """``v1.34 - v1.37`` (the README and the chart say the same)."""
    return f"v{OLDEST} - v{DEFAULT}"
