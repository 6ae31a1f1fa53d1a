"""Pods on the real node, and what they see from inside (``kubectl exec``).

Shared by ``make demo``, the real-node tests (tests/e2e/) and the pod start benchmark: pod
manifests for the workload image, and parsers for what busybox's ``ip -o link``/``ip -o addr``,
``stat`` and ``env`` print inside a container.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.builders.images import WORKLOAD_IMAGE


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message has its stderr."""


@dataclass(frozen=True)
class Kubectl:
    """The cluster's kubectl with its kubeconfig."""

    binary: Path
    kubeconfig: Path

    def run(self, *args: str, timeout: float = 60, stdin: str | None = None) -> str:
        """Run ``kubectl <args>``; return stdout or raise `KubectlError`."""
        out = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args[:4])}: {out.stderr.strip()[-800:]}")
        return out.stdout

    def exec(self, namespace: str, pod: str, *cmd: str, timeout: float = 30) -> str:
        """``kubectl exec`` a command in the pod's (first) container; returns its stdout."""
        return self.run("exec", "-n", namespace, pod, "--", *cmd, timeout=timeout)


def workload_pod(
    name: str,
    node: str,
    template: str | None = None,
    *,
    claim: str | None = None,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod running the workload image on ``node``, with one claim from ``template`` (or the
    existing claim ``claim``), or no claim at all. Unscheduled: the scheduler allocates."""
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "dnsPolicy": "Default",  # no cluster DNS on the dev node
        "containers": [{"name": "trainer", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never"}],
    }
    if template or claim:
        ref = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
        spec["resourceClaims"] = [{"name": "devices", **ref}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "devices"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
    }


@dataclass
class PodInterface:
    """One interface as the pod sees it."""

    name: str
    mtu: int
    mac: str
    state: str
    addresses: list[str] = field(default_factory=list)


_LINK_RE = re.compile(r"^\d+:\s+([^:@]+)(?:@\S+)?:\s+<([^>]*)>.*?\bmtu (\d+).*?link/\S+\s+([0-9a-f:]+)")


def parse_ip_link(text: str) -> dict[str, PodInterface]:
    """busybox/iproute2 ``ip -o link`` output -> interfaces by name."""
    out = {}
    for line in text.splitlines():
        m = _LINK_RE.search(line.replace("\\", " "))
        if m:
            flags = m.group(2).split(",")
            out[m.group(1)] = PodInterface(m.group(1), int(m.group(3)), m.group(4), "UP" if "UP" in flags else "DOWN")
    return out


def parse_ip_addr(text: str, links: dict[str, PodInterface]) -> dict[str, PodInterface]:
    """Add ``ip -o addr`` addresses (``inet``/``inet6``, with prefix length) to ``links``."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6") and parts[1] in links:
            links[parts[1]].addresses.append(parts[3])
    return links


@dataclass
class PodView:
    """What a pod sees: interfaces, routes, RDMA device nodes, environment."""

    interfaces: dict[str, PodInterface]
    routes: list[str]
    rdma_nodes: dict[str, tuple[int, int]]  # path -> (major, minor)
    env: dict[str, str]


def pod_view(kubectl: Kubectl, namespace: str, pod: str) -> PodView:
    """Look inside the pod's first container (its network namespace, /dev, environment)."""
    out = kubectl.exec(
        namespace,
        pod,
        "sh",
        "-c",
        "ip -o link; echo ===; ip -o addr; echo ===; ip route; echo ===; "
        'for f in /dev/infiniband/*; do [ -e "$f" ] && stat -c \'%n %t %T\' "$f"; done; '
        "echo ===; env",
    )
    link, addr, route, dev, env = (out.split("===\n") + ["", "", "", "", ""])[:5]
    links = parse_ip_addr(addr, parse_ip_link(link))
    nodes = {}
    for line in dev.splitlines():
        parts = line.split()
        if len(parts) == 3:
            nodes[parts[0]] = (int(parts[1], 16), int(parts[2], 16))
    env_map = dict(ln.split("=", 1) for ln in env.splitlines() if "=" in ln)
    return PodView(links, [r for r in route.splitlines() if r.strip()], nodes, env_map)


def format_view(view: PodView) -> list[str]:
    """Human-readable lines (the demo prints these)."""
    lines = ["  interfaces (inside the pod's network namespace):"]
    for i in sorted(view.interfaces.values(), key=lambda x: x.name):
        lines.append(f"    {i.name:<10} mtu {i.mtu:<6} {i.state:<4} {i.mac:<17} {' '.join(i.addresses) or '-'}")
    lines.append("  RDMA device nodes in the container:")
    for path, (major, minor) in sorted(view.rdma_nodes.items()):
        lines.append(f"    {path:<28} char {major}:{minor}")
    if not view.rdma_nodes:
        lines.append("    (none)")
    for key in ("NCCL_IB_HCA", "DRANET_RDMA_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        lines.append(f"  {key}={view.env.get(key, '(unset)')}")
    return lines
