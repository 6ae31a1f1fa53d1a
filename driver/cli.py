"""The ``dranet`` command line: one subcommand per job, each handled by the module that owns it.

Handlers are imported lazily so ``dranet discover`` does not pay for grpc,
kopf or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from collections.abc import Callable, Sequence

from driver.config import default

# subcommand -> "module:function"; the function takes the parsed args and returns an exit code.
HANDLERS: dict[str, str] = {
    "run": "driver.daemon:cli_run",
    "discover": "driver.inventory.discovery_cli:cli_discover",
    "validate": "driver.claims.validation:cli_validate",
    "webhook": "driver.webhook:cli_webhook",
    "topology": "driver.inventory.topology:cli_topology",
    "templates": "driver.inventory.topology:cli_templates",
}


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    parser = argparse.ArgumentParser(
        prog="dranet",
        description=f"Kubernetes DRA driver for network interfaces and RDMA NICs ({default('driver_name')})",
    )
    parser.add_argument(
        "--log-level",
        default=_env("DRANET_LOG_LEVEL", str(default("log_level"))),
        choices=["debug", "info", "warning", "error"],
    )
    parser.add_argument(
        "--log-format", default=_env("DRANET_LOG_FORMAT", str(default("log_format"))), choices=["json", "text"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the node driver daemon (kubelet plugin, NRI plugin, slices)")
    run.add_argument("--node-name", default=_env("NODE_NAME", socket.gethostname()))
    run.add_argument("--driver-name", default=default("driver_name"))
    run.add_argument("--sysfs-root", default=default("sysfs_root"))
    run.add_argument("--kubelet-root", default=default("kubelet_root"))
    run.add_argument("--state-dir", default=default("state_dir"), help="prepared-claims checkpoint (on disk)")
    run.add_argument(
        "--runtime-dir",
        default=default("runtime_dir"),
        help="pod network state (tmpfs: survives driver restarts, cleared by reboots)",
    )
    run.add_argument(
        "--host-netns",
        default=default("host_netns"),
        help="the host network namespace NICs return to (hostNetwork pod: its own)",
    )
    run.add_argument("--nri-socket", default=default("nri_socket"))
    run.add_argument(
        "--no-nri",
        dest="nri_enabled",
        action="store_false",
        help="do not connect to the container runtime (tests, discovery-only nodes)",
    )
    run.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    run.add_argument(
        "--filter",
        default=default("filter"),
        help="CEL expression over `device` (DeviceClass syntax); empty disables filtering",
    )
    run.add_argument(
        "--exclude-interfaces",
        default="",
        help="comma-separated interfaces treated like the uplink (never published, with their slaves)",
    )
    run.add_argument("--bind-address", default=default("bind_address"), help="address of /healthz and /metrics")
    run.add_argument(
        "--publish-interval",
        type=float,
        default=default("publish_interval"),
        help="seconds: at most one ResourceSlice write per interval",
    )
    run.add_argument(
        "--resync-interval", type=float, default=default("resync_interval"), help="seconds between full rescans"
    )

    disc = sub.add_parser("discover", help="print the devices this node would publish")
    disc.add_argument("--sysfs-root", default=default("sysfs_root"))
    disc.add_argument("--output", "-o", default="table", choices=["json", "table"])
    disc.add_argument("--filter", default=default("filter"))
    disc.add_argument("--exclude-interfaces", default="")

    val = sub.add_parser("validate", help="validate dra.net configs in ResourceClaim(Template) files")
    val.add_argument("files", nargs="+")

    hook = sub.add_parser("webhook", help="run the validating admission webhook")
    hook.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    hook.add_argument("--port", type=int, default=9443)
    hook.add_argument("--host", default=None, help="address the apiserver uses to reach the webhook")
    hook.add_argument("--tls-cert", default=None)
    hook.add_argument("--tls-key", default=None)
    hook.add_argument(
        "--manage-configuration", action="store_true", help="create/patch the ValidatingWebhookConfiguration itself"
    )
    hook.add_argument("--failure-policy", default="Fail", choices=["Fail", "Ignore"])

    topo = sub.add_parser("topology", help="GPU/NIC/NUMA matrix of this node")
    topo.add_argument("--sysfs-root", default=default("sysfs_root"))
    topo.add_argument("--output", "-o", default="table", choices=["json", "table"])
    topo.add_argument("--exclude-interfaces", default="", help="comma-separated uplinks to leave out")

    tmpl = sub.add_parser("templates", help="print NUMA-aligned ResourceClaimTemplates for this node")
    tmpl.add_argument("--gpus", type=int, required=True)
    tmpl.add_argument("--sysfs-root", default=default("sysfs_root"))
    tmpl.add_argument("--exclude-interfaces", default="", help="comma-separated uplinks to leave out")
    return parser


def _handler(command: str) -> Callable[[argparse.Namespace], int]:
    module, func = HANDLERS[command].split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dranet`` console script."""
    from driver.logs import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    return int(_handler(args.command)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
