"""The real node's components: kubelet and kubectl, containerd 2.x, runc and the CNI plugins.

kubelet and kubectl come from the same wrapper module as the control plane
(`devcluster.builders.binaries.build_k8s`); containerd, ``containerd-shim-runc-v2`` and ``ctr`` are
built from the Go module proxy with `build_go_tool` (cached under
``~/.cache/dranet/containerd/<version>/bin``); runc and the CNI plugins are Debian's packages,
installed by ``hack/install-deps.sh``.

Why Debian's runc 1.1.5 and not a build of runc 1.3 (what containerd 2.2 is tested with):
Debian's package is security-patched (``+deb12u1``), links Debian's libseccomp, costs no build
time, and everything a pod here needs (namespaces, cgroup v1 with cgroupfs, device nodes, the
devices cgroup) is runc 1.1 functionality; runc 1.3's go.mod carries an ``exclude`` block, so
building it needs another wrapper module plus cgo and libseccomp-dev for no feature we use.

    python -m devcluster.builders.components      # build or find everything, print the paths
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders.binaries import K8S_RELEASE, GoBuild, Progress, _print_progress, build_go_tool, build_k8s

# The containerd paired with the Kubernetes release (devcluster/builders/versions.py): the newest 2.x the
# module proxy lists and the checksum database verifies (`go mod download` checks sum.golang.org).
CONTAINERD_VERSION = K8S_RELEASE.containerd
# containerd's own go.mod ``go`` line per minor (the wrapper keeps upstream's GODEBUG defaults).
CONTAINERD_GO_LINE = {"v2.2": "1.25.0", "v2.4": "1.26.6"}
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")

# Debian's package locations (hack/install-deps.sh installs them).
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
CNI_PLUGINS = ("bridge", "host-local", "loopback")


class ComponentError(RuntimeError):
    """A node component is missing and cannot be built; the message says how to get it."""


def containerd_gomod(version: str = CONTAINERD_VERSION) -> str:
    """Wrapper go.mod: containerd 2.2+'s own go.mod has no replace/exclude, so a plain require
    works; ``go`` and ``godebug`` as containerd's go.mod (upstream's GODEBUG defaults, not
    those of the newer local toolchain)."""
    go_line = CONTAINERD_GO_LINE[".".join(version.split(".")[:2])]
    godebug = "go" + ".".join(go_line.split(".")[:2])
    tools = "\n".join(f"\t{CONTAINERD_MODULE}/cmd/{b}" for b in CONTAINERD_BINARIES)
    return (
        f"module example.invalid/containerdbins\n\ngo {go_line}\n\ngodebug default={godebug}\n\n"
        f"tool (\n{tools}\n)\n\nrequire {CONTAINERD_MODULE} {version}\n"
    )


def build_containerd(version: str = CONTAINERD_VERSION, progress: Progress = _print_progress) -> Path:
    """Build (or reuse) containerd, the runc v2 shim and ctr; returns their ``bin`` directory.

    Tags and flags as upstream's Makefile: static (CGO off: the btrfs snapshotter is the only
    cgo user, hence ``no_btrfs``), ``urfave_cli_no_docs``; the shim also ``no_grpc``.
    """
    ld = (
        f"-s -w -X {CONTAINERD_MODULE}/version.Version={version} "
        f"-X {CONTAINERD_MODULE}/version.Package={CONTAINERD_MODULE}"
    )
    builds = [
        GoBuild(
            packages=(f"{CONTAINERD_MODULE}/cmd/containerd", f"{CONTAINERD_MODULE}/cmd/ctr"),
            tags=("no_btrfs", "urfave_cli_no_docs"),
            ldflags=ld,
        ),
        GoBuild(
            packages=(f"{CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2",),
            output="containerd-shim-runc-v2",
            tags=("no_btrfs", "urfave_cli_no_docs", "no_grpc"),
            ldflags=ld,
        ),
    ]
    return build_go_tool(
        "containerd", version, containerd_gomod(version), builds, expect=CONTAINERD_BINARIES, progress=progress
    )


def _need(path: str | None, what: str) -> Path:
    if not path:
        raise ComponentError(f"{what} not found; run `make deps` (hack/install-deps.sh installs it)")
    return Path(path)


def cni_bin_dir() -> Path:
    """The directory holding Debian's bridge, host-local and loopback CNI plugins."""
    for d in CNI_BIN_DIRS:
        if all((d / p).is_file() for p in CNI_PLUGINS):
            return d
    raise ComponentError(
        f"CNI plugins {', '.join(CNI_PLUGINS)} not found in "
        f"{', '.join(map(str, CNI_BIN_DIRS))}; run `make deps` (containernetworking-plugins)"
    )


@dataclass(frozen=True)
class NodeBinaries:
    """Every binary the real node runs."""

    kubelet: Path
    kubectl: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    runc: Path
    cni_bin_dir: Path

    @property
    def path_dirs(self) -> list[str]:
        """Directories containerd needs on PATH (it finds the shim and runc there)."""
        return sorted({str(self.containerd_shim.parent), str(self.runc.parent)})


def ensure_node_binaries(progress: Progress = _print_progress) -> NodeBinaries:
    """Find or build every node binary (each at most once per version, cached)."""
    k8s = build_k8s(progress=progress)
    ctr_dir = build_containerd(progress=progress)
    return NodeBinaries(
        kubelet=k8s / "kubelet",
        kubectl=k8s / "kubectl",
        containerd=ctr_dir / "containerd",
        containerd_shim=ctr_dir / "containerd-shim-runc-v2",
        ctr=ctr_dir / "ctr",
        runc=_need(shutil.which("runc"), "runc"),
        cni_bin_dir=cni_bin_dir(),
    )


def main() -> int:
    """CLI: build or find all node binaries and print their paths."""
    t0 = time.monotonic()
    try:
        b = ensure_node_binaries()
    except ComponentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for k, v in vars(b).items():
        print(f"{k}: {v}")
    print(f"node binaries ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
