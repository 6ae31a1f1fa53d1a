"""How ``kubectl dranet`` prints: kubectl-style aligned columns, or the same data as JSON/YAML."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from driver.inventory.topology import Topology, render_table
from driver.kubectl.claims import ClaimView
from driver.kubectl.cluster import NodeView
from driver.kubectl.doctor import Check

NONE = "-"


def columns(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns, two spaces apart, ``-`` for an empty cell (as ``kubectl get`` prints)."""
    cells = [list(header)] + [[NONE if c is None or c == "" or c == [] else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in cells)


def dump(data: Any, fmt: str, out: TextIO) -> None:
    """``-o json`` (indented, keys sorted) or ``-o yaml``."""
    if fmt == "json":
        json.dump(data, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        yaml.safe_dump(data, out, sort_keys=True, default_flow_style=False)


def nodes_table(views: list[NodeView], claims_scope: str, out: TextIO) -> None:
    """NICs per node, then the GPUs' NUMA nodes, then free counts per NUMA node."""
    if not views:
        out.write("no node publishes devices of this driver or GPUs\n")
        return
    out.write(
        columns(
            ["NODE", "DEVICE", "IFNAME", "NUMA", "RDMA", "LINK", "STATE", "ALLOCATED", "TAINTS"],
            [
                [
                    n.node,
                    n.device,
                    n.ifName,
                    n.numaNode,
                    n.rdmaDevice,
                    n.linkLayer,
                    n.state,
                    n.allocatedTo,
                    ",".join(n.taints),
                ]
                for v in views
                for n in v.nics
            ],
        )
    )
    out.write("\n")
    rows = []
    for v in views:
        for s in v.numa_summary():
            gpus = [g for g in v.gpus if g.numaNode == s["numaNode"]]
            drivers = ",".join(sorted({g.driver for g in gpus}))
            names = ",".join(g.device for g in gpus)
            rows.append(
                [
                    v.name,
                    s["numaNode"],
                    _free(s["freeGpus"], s["gpus"]),
                    _free(s["freeRdmaNics"], s["rdmaNics"]),
                    f"{names} ({drivers})" if gpus else "",
                ]
            )
    out.write(columns(["NODE", "NUMA", "FREE GPUS", "FREE RDMA NICS", "GPUS"], rows))
    if claims_scope != "all namespaces":
        out.write(
            f"\nALLOCATED shows the claims of namespace {claims_scope} only (no permission to list claims in "
            "all namespaces): '?' is free or held by a claim of another namespace.\n"
        )


def _free(free: int | None, total: int) -> str:
    return f"{'?' if free is None else free}/{total}"


def topology_table(node: str, topo: Topology, out: TextIO) -> None:
    """The local ``dranet topology`` matrix, and what slices cannot tell."""
    out.write(f"node {node} (from its ResourceSlices)\n\n")
    render_table(topo, out)
    out.write("  PCIe switches are not in ResourceSlices: devices under one root complex show as PHB.\n")


def claim_table(view: ClaimView, out: TextIO, pod: str | None = None) -> None:
    """A claim's devices and what the pod has of each; then the NUMA verdict."""
    users = f" (pod {pod})" if pod else (f" (reserved for {', '.join(view.reservedFor)})" if view.reservedFor else "")
    out.write(f"claim {view.namespace}/{view.name}{users}, allocated on node {view.node or '?'}\n")
    out.write(
        columns(
            ["REQUEST", "DRIVER", "DEVICE", "IFNAME", "ADDRESSES", "MAC", "RDMA", "PCIBUSID", "NUMA", "READY"],
            [
                [
                    d.request,
                    d.driver,
                    d.device,
                    d.interfaceName,
                    ",".join(d.ips),
                    d.hardwareAddress,
                    d.rdmaDevice,
                    d.pciBusID,
                    d.numaNode,
                    d.ready,
                ]
                for d in view.devices
            ],
        )
    )
    numa = view.numaAligned
    said = "reported by the driver" if numa.get("source") == "driver" else "computed from ResourceSlices"
    out.write(f"NUMAAligned={numa['status']} ({numa['reason']}, {said}): {numa['message']}\n")
    for d in view.devices:
        if d.ready == "False":
            out.write(f"  {d.device}: not ready: {d.readyMessage}\n")


def doctor_table(checks: list[Check], out: TextIO) -> None:
    out.write(columns(["CHECK", "STATUS", "DETAIL"], [[c.name, c.status, c.detail] for c in checks]))
