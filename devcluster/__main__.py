"""``python -m devcluster up|down|status|sweep``: a local cluster with real nodes (see cluster.py).

    python -m devcluster up        # 2 nodes; prints KUBECONFIG=... and KUBECTL=..., leaves it running
    python -m devcluster up --nodes 1
    python -m devcluster status    # the same lines if it runs, exit 1 if not
    python -m devcluster down      # removes everything (also after a crashed `up`)
    python -m devcluster sweep     # removes every cluster under --root a killed run left (make test runs it first)

``--name`` (default ``dev``) and ``--root`` (default /var/lib/dranet-dev) choose the cluster,
``--cidr`` its address range (a /20: node network and one pod /24 per node); ``--nic-prefix``
names every node's NICs (``ib`` gives ib0..ib7), ``--runtime`` every node's container runtime
(``containerd``, the default, or ``crio``: CRI-O built by ``python -m devcluster.builders.crio``),
``--ip-family`` its networks' (``ipv4``, the default, ``ipv6`` or ``dual``: see node_layout.py),
``--topology`` the machine every node is (``nd-h100-v5``, the default: Azure ND H100 v5; ``dgx-h100``:
a GPU and an IB NIC under each PCIe switch, as GPU-NIC pair templates need; any bundled topology
with IPoIB NICs, or a YAML path): its fixture sysfs, its IPoIB NICs on the rails, its GPUs in the
GPU double's slice, and the node names (``dgx-h100-0``, ...). ``status`` and ``down`` need only ``--name``.
``DRANET_K8S_VERSION`` picks the Kubernetes release (default the newest supported; see
devcluster/builders/versions.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from devcluster.cluster.node_layout import (
    DEFAULT_BASE,
    DEFAULT_CIDR,
    DEFAULT_IP_FAMILY,
    DEFAULT_NAME,
    DEFAULT_NODES,
    DEFAULT_RUNTIME,
    DEFAULT_TOPOLOGY,
    IP_FAMILIES,
    RUNTIMES,
    LayoutError,
    NodeLayout,
)
from devcluster.doubles.sysfs_fixture import topologies


def _layout(a: argparse.Namespace) -> NodeLayout:
    return NodeLayout(
        name=a.name,
        root=Path(a.root),
        nodes=a.nodes,
        cluster_cidr=a.cidr,
        nic_prefix=a.nic_prefix,
        runtime=a.runtime,
        ip_family=a.ip_family,
        topology=a.topology,
    )


def _print_env(kubeconfig: str, kubectl: str) -> None:
    print(f"KUBECONFIG={kubeconfig}")
    print(f"KUBECTL={kubectl}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["up", "down", "status", "sweep"])
    ap.add_argument("--name", default=os.environ.get("DRANET_DEVCLUSTER_NAME", DEFAULT_NAME))
    ap.add_argument("--root", default=os.environ.get("DRANET_DEVCLUSTER_ROOT", str(DEFAULT_BASE)))
    ap.add_argument("--nodes", type=int, default=int(os.environ.get("DRANET_DEVCLUSTER_NODES", DEFAULT_NODES)))
    ap.add_argument("--cidr", default=os.environ.get("DRANET_DEVCLUSTER_CIDR", DEFAULT_CIDR))
    ap.add_argument("--nic-prefix", default="ib")
    ap.add_argument("--runtime", choices=RUNTIMES, default=os.environ.get("DRANET_DEVCLUSTER_RUNTIME", DEFAULT_RUNTIME))
    ap.add_argument(
        "--ip-family",
        choices=IP_FAMILIES,
        default=os.environ.get("DRANET_DEVCLUSTER_IP_FAMILY", DEFAULT_IP_FAMILY),
        help="the node, pod and service networks and the rails: IPv4, IPv6, or both (IPv4 first)",
    )
    ap.add_argument(
        "--topology",
        default=os.environ.get("DRANET_DEVCLUSTER_TOPOLOGY", DEFAULT_TOPOLOGY),
        metavar="NAME",
        help=f"every node's machine: one of {', '.join(topologies())} (with IPoIB NICs), or a YAML path",
    )
    set_help = "a chart value at install (helm --set), e.g. sharing.filter=...; repeatable"
    ap.add_argument("--set", dest="set_values", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        layout = _layout(a)
    except LayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("error: devcluster needs root (network namespaces, cgroups, mounts)", file=sys.stderr)
        return 2
    from devcluster.cluster import lifecycle as cluster

    if a.command == "status":
        st = cluster.running(layout)
        if not st:
            print(f"cluster {layout.name!r} is not running", file=sys.stderr)
            return 1
        _print_env(st.kubeconfig, st.kubectl)
        return 0
    if a.command == "down":
        report = cluster.down(layout)
        return 1 if report.problems else 0
    if a.command == "sweep":
        cluster.sweep_abandoned(layout.root)
        return 0
    st = cluster.running(layout)
    if st:
        print(
            f"cluster {layout.name!r} is already running ({layout.base}); `python -m devcluster down` stops it",
            file=sys.stderr,
        )
        _print_env(st.kubeconfig, st.kubectl)
        return 0
    t0 = time.monotonic()
    try:
        st = cluster.up(layout, set_values=a.set_values)
    except KeyboardInterrupt:
        print("interrupted; everything started was removed", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line, the cleanup already ran
        print(f"error: devcluster up failed: {exc}", file=sys.stderr)
        return 1
    print(
        f"cluster {layout.name!r} up in {time.monotonic() - t0:.1f}s "
        f"(Kubernetes {st.k8s_version} on {st.runtime}; nodes {', '.join(n.name for n in layout.all_nodes)}; "
        f"driver image {st.driver_image})",
        file=sys.stderr,
    )
    _print_env(st.kubeconfig, st.kubectl)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
