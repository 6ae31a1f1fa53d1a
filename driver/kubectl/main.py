"""``kubectl dranet`` (the ``kubectl-dranet`` console script): commands, flags, exit codes.

Exit codes: 0 done; 1 the answer is "no" (``doctor`` found a failure, ``templates`` found no NUMA
node that fits or no GPU/NIC pairs, a claim is not allocated yet); 2 a usage or API error (the
message says which).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from driver import __version__
from driver.cli_flags import EnvError, HelpFormatter, add_global_flags, apply_env
from driver.config import DEVICE_CLASS, DRIVER_NAME
from driver.inventory.topology import (
    PAIR_MODES,
    PCIE_ROOT,
    PCIE_SWITCH,
    NoAlignmentError,
    NoPairingError,
    aligned_choices,
    pair_templates,
    render_pair_template,
    render_template,
)
from driver.kube.client import KubeClient
from driver.kube.errors import KubeConfigError, KubeError, NotFound
from driver.kubectl import claims, cluster, doctor, output
from driver.kubectl.topology import topology_of

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def kubeconfig_path(flag: str | None, environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """As kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; None:
    in-cluster credentials."""
    if flag:
        return flag
    if environ.get("KUBECONFIG"):
        return environ["KUBECONFIG"]
    home = Path(environ.get("HOME", "~")).expanduser() / ".kube" / "config"
    return str(home) if home.is_file() else None


def default_namespace(kubeconfig: str | None) -> str:
    """The current context's namespace (kubectl's default), else ``default``."""
    try:
        if kubeconfig is None:
            return Path(IN_CLUSTER_NAMESPACE).read_text().strip() or "default"
        config = yaml.safe_load(Path(kubeconfig.split(os.pathsep)[0]).read_text()) or {}
        current = config.get("current-context")
        for ctx in config.get("contexts") or []:
            if ctx.get("name") == current:
                return str((ctx.get("context") or {}).get("namespace") or "default")
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return "default"


def build_parser(environ: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """Flags of every command (each also from ``DRANET_<FLAG>``)."""
    parser = argparse.ArgumentParser(
        prog="kubectl dranet",
        description="NICs and GPUs by node and NUMA node, what a pod got, and whether dranet works: from the API.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kubectl-dranet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    nodes = sub.add_parser("nodes", help="per node: NICs (NUMA, RDMA, link, allocated to) and GPUs' NUMA nodes")
    nodes.add_argument("--node", default=None, help="only this node")
    topo = sub.add_parser("topology", help="the GPU/NIC NUMA matrix of one node (like `dranet topology`)")
    topo.add_argument("--node", required=True, help="the node")
    tmpl = sub.add_parser("templates", help="NUMA-aligned (or GPU-NIC pair) ResourceClaimTemplates for one node")
    tmpl.add_argument("--node", required=True, help="the node")
    tmpl.add_argument("--gpus", type=int, default=None, help="GPUs and RDMA NICs per claim; default: the most that fit")
    pair_help = (
        f"one RDMA NIC per GPU: {PCIE_ROOT} (matchAttribute on resource.kubernetes.io/pcieRoot per pair); "
        f"{PCIE_SWITCH} needs the PCIe switches, which slices lack (run `dranet templates` on the node)"
    )
    tmpl.add_argument("--pair", choices=PAIR_MODES, default=None, help=pair_help)
    tmpl.add_argument("--nic-class", default=DEVICE_CLASS, help="DeviceClass of the NIC request")
    tmpl.add_argument("--gpu-class", default="", help="DeviceClass of the GPU request; empty: the GPUs' driver name")
    claim = sub.add_parser("claim", help="what a ResourceClaim got: interfaces, addresses, RDMA devices, NUMA")
    claim.add_argument("name", help="ResourceClaim name")
    pod = sub.add_parser("pod", help="what a pod got, from its claims")
    pod.add_argument("name", help="Pod name")
    doc = sub.add_parser("doctor", help="driver pods, slices, webhook, DeviceClass, feature gates")
    doc.add_argument("--driver-namespace", default="kube-system", help="namespace the chart was installed in")
    doc.add_argument("--device-class", default=DEVICE_CLASS, help="the DeviceClass claims name")
    doc.add_argument("--selector", default=doctor.DRIVER_POD_SELECTOR, help="labels of the driver pods")
    subs = [nodes, topo, tmpl, claim, pod, doc]
    for p in subs:
        p.formatter_class = HelpFormatter
    add_global_flags(parser, subs, _global_flags)
    apply_env(parser, environ)
    return parser


def _global_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, top: bool) -> None:
    """Flags of every command, before or after it (as kubectl takes ``-n`` and ``-o`` anywhere)."""

    def flag(*names: str, default: Any, **kwargs: Any) -> None:
        parser.add_argument(*names, default=default if top else argparse.SUPPRESS, **kwargs)

    flag("--kubeconfig", default=None, help="kubeconfig file: $KUBECONFIG, else ~/.kube/config")
    flag("-n", "--namespace", default=None, help="namespace: the current context's, else default")
    flag("--driver-name", default=DRIVER_NAME, help="the driver's name in the ResourceSlices")
    gpu_help = "a DRA driver whose devices are GPUs (repeatable; devices whose type is gpu count too)"
    flag("--gpu-driver", action="append", default=None, help=f"{gpu_help}; default {','.join(cluster.GPU_DRIVERS)}")
    flag("-o", "--output", default="table", choices=["table", "json", "yaml"], help="output format")


def _node_view(kube: KubeClient, args: argparse.Namespace, node: str) -> cluster.NodeView:
    devices = cluster.read_slices(kube, node)
    views = cluster.node_views(
        devices, cluster.read_allocations(kube, args.namespace), args.driver_name, args.gpu_driver, node
    )
    if not views:
        raise LookupError(f"node {node}: no ResourceSlice of {args.driver_name} or of a GPU driver")
    return views[0]


def cmd_nodes(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    allocations = cluster.read_allocations(kube, args.namespace)
    devices = cluster.read_slices(kube, args.node)
    views = cluster.node_views(devices, allocations, args.driver_name, args.gpu_driver, args.node)
    if args.output == "table":
        output.nodes_table(views, allocations.scope, out)
    else:
        output.dump({"claimsScope": allocations.scope, "nodes": [v.to_json() for v in views]}, args.output, out)
    return 0


def cmd_topology(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    topo = topology_of(_node_view(kube, args, args.node))
    if args.output == "table":
        output.topology_table(args.node, topo, out)
    else:
        output.dump(topo.to_json() | {"node": args.node}, args.output, out)
    return 0


def cmd_templates(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    if getattr(args, "pair", None) == PCIE_SWITCH:
        sys.stderr.write(
            f"kubectl dranet templates: --pair {PCIE_SWITCH} needs the PCIe switches between GPUs and NICs, which "
            f"ResourceSlices do not carry: run `dranet templates --pair {PCIE_SWITCH}` on the node (the driver "
            f"pod has it), or use --pair {PCIE_ROOT}\n"
        )
        return 2
    view = _node_view(kube, args, args.node)
    topo = topology_of(view)
    gpu_class = args.gpu_class or next((g.driver for g in view.gpus), "")
    gpus = args.gpus
    try:
        if getattr(args, "pair", None) == PCIE_ROOT:
            if gpus is None:  # every GPU that has an RDMA NIC under its own root
                gpus = max(1, pair_templates(topo, 1, PCIE_ROOT)[0].available)
            source = f"kubectl dranet templates --node {args.node}"
            docs = [
                render_pair_template(t, args.nic_class, gpu_class, source, switches_known=False)
                for t in pair_templates(topo, gpus, PCIE_ROOT)
            ]
        else:
            if gpus is None:  # the most GPUs (each with an RDMA NIC) one NUMA node holds
                gpus = max((min(s["gpus"], s["rdmaNics"]) for s in view.numa_summary()), default=0)
            docs = [render_template(c, gpus, args.nic_class, gpu_class) for c in aligned_choices(topo, gpus)]
    except (NoAlignmentError, NoPairingError) as err:
        sys.stderr.write(f"kubectl dranet templates: node {args.node}: {err}\n")
        return 1
    if args.output == "table":
        out.write("---\n".join(docs))
    else:
        output.dump([yaml.safe_load(d) for d in docs], args.output, out)
    return 0


def cmd_claim(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    try:
        view = claims.read_claim(kube, args.namespace, args.name, cluster.read_slices(kube), args.driver_name)
    except claims.NotAllocated as exc:
        sys.stderr.write(f"kubectl dranet claim: {exc}\n")
        return 1
    if args.output == "table":
        output.claim_table(view, out)
    else:
        output.dump(view.to_json(), args.output, out)
    return 0


def cmd_pod(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    pod, views, pending = claims.read_pod(kube, args.namespace, args.name, cluster.read_slices(kube), args.driver_name)
    if args.output != "table":
        status = pod.get("status") or {}
        data: dict[str, Any] = {
            "pod": f"{args.namespace}/{args.name}",
            "node": (pod.get("spec") or {}).get("nodeName"),
            "phase": status.get("phase"),
            "claims": [v.to_json() for v in views],
            "pending": pending,
        }
        output.dump(data, args.output, out)
        return 0
    phase = (pod.get("status") or {}).get("phase")
    out.write(f"pod {args.namespace}/{args.name} ({phase}) on node {(pod.get('spec') or {}).get('nodeName') or '-'}\n")
    if not views and not pending:
        out.write("no ResourceClaims\n")
    for view in views:
        out.write("\n")
        output.claim_table(view, out, pod=args.name)
    for reason in pending:
        out.write(f"\n{reason}\n")
    return 0


def cmd_doctor(kube: KubeClient, args: argparse.Namespace, out: TextIO) -> int:
    options = doctor.DoctorOptions(
        namespace=args.namespace,
        driver_name=args.driver_name,
        device_class=args.device_class,
        driver_namespace=args.driver_namespace,
        driver_selector=args.selector,
    )
    checks = doctor.run_checks(kube, options)
    if args.output == "table":
        output.doctor_table(checks, out)
    else:
        output.dump(doctor.to_json(checks), args.output, out)
    return 1 if any(c.status == doctor.FAIL for c in checks) else 0


COMMANDS = {
    "nodes": cmd_nodes,
    "topology": cmd_topology,
    "templates": cmd_templates,
    "claim": cmd_claim,
    "pod": cmd_pod,
    "doctor": cmd_doctor,
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``kubectl-dranet``."""
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
    except EnvError as exc:
        sys.stderr.write(f"kubectl dranet: error: {exc}\n")
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        sys.stderr.write(f"kubectl dranet: error: --kubeconfig {args.kubeconfig}: no such file\n")
        return 2
    kubeconfig = kubeconfig_path(args.kubeconfig)
    args.namespace = args.namespace or default_namespace(kubeconfig)
    args.gpu_driver = tuple(args.gpu_driver or cluster.GPU_DRIVERS)
    try:
        kube = KubeClient.from_kubeconfig(kubeconfig)
        return COMMANDS[args.command](kube, args, out)
    except (KubeConfigError, LookupError) as exc:
        sys.stderr.write(f"kubectl dranet {args.command}: error: {exc}\n")
        return 2
    except NotFound as exc:
        sys.stderr.write(f"kubectl dranet {args.command}: {exc.message}\n")
        return 2
    except KubeError as exc:
        sys.stderr.write(f"kubectl dranet {args.command}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
