"""The ``dranet`` command line: one subcommand per job, each handled by the module that owns it.

Handlers are imported lazily so ``dranet discover`` does not pay for grpc,
aiohttp or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from driver import __version__
from driver.cli_flags import ENV_PREFIX, EnvError, HelpFormatter, add_global_flags, apply_env
from driver.config import DEVICE_CLASS, PROFILE_PROVIDERS, TAINT_EFFECTS, default, parse_feature_gates
from driver.logs import LOG_FORMATS

PAIR_MODES = ("pcie-root", "pcie-switch")
"""``dranet templates --pair``: driver.inventory.topology.PAIR_MODES, named here so that building the
parser does not import the inventory (a test keeps the two equal)."""

GO_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
GO_NO_EFFECT = {
    "db_path": "--db-path: ignored; prepared claims are in --state-dir and pod network state in --runtime-dir",
    "inventory_poll_burst": "--inventory-poll-burst: ignored; link events and rescans are coalesced instead",
    "cloud_provider_options": "--cloud-provider-options: ignored; no provider here takes options",
}
"""Go-driver flags accepted so its command lines and chart values start this driver, with no effect."""


def seconds(text: str) -> float:
    """A duration: seconds (``60``, ``2.5``) or a Go duration (``1m``, ``1m30s``, ``500ms``), as the Go
    driver's ``--inventory-*-poll-interval`` take."""
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _GO_DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * GO_DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (seconds, or e.g. 2s, 1m, 500ms)")
    return total


def cloud_provider(text: str) -> str:
    """``--cloud-provider`` / ``--cloud-provider-hint`` value, normalised (argparse type)."""
    from driver.inventory.cloud.detection import parse_provider

    try:
        return parse_provider(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--cloud-provider: ")) from None


def feature_gates(text: str) -> dict[str, bool]:
    """``--feature-gates`` (argparse type)."""
    try:
        return parse_feature_gates(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--feature-gates: ")) from None


def _configured(parser: argparse.ArgumentParser, *names: str, **kwargs: Any) -> None:
    """A flag whose default is the driver config's of the same name (``--state-dir``: ``state_dir``)."""
    parser.add_argument(*names, default=default(names[0].removeprefix("--").replace("-", "_")), **kwargs)


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    """Which node's devices a command sees: its sysfs, and the interfaces left out like the uplink."""
    sysfs_help = "sysfs tree to discover from; another root (a fixture) turns netlink facts off"
    _configured(parser, "--sysfs-root", help=sysfs_help)
    parser.add_argument(
        "--exclude-interfaces",
        default="",
        help="comma-separated interfaces treated like the uplink: left out, with their slaves",
    )


def _add_output_flag(parser: argparse.ArgumentParser) -> None:
    """``--output``/``-o`` of the commands that print a table or JSON."""
    parser.add_argument("--output", "-o", default="table", choices=["json", "table"], help="output format")


def _add_class_flags(parser: argparse.ArgumentParser) -> None:
    """The DeviceClass names ``templates`` writes into the claims."""
    nic_help = "DeviceClass of the NIC request (the chart's deviceClass.name)"
    parser.add_argument("--nic-class", default=DEVICE_CLASS, help=nic_help)
    gpu_help = "DeviceClass of the GPU request; empty: by the GPUs' vendor (gpu.nvidia.com, gpu.amd.com)"
    parser.add_argument("--gpu-class", default="", help=gpu_help)


def _add_cloud_flags(parser: argparse.ArgumentParser, go_alias: bool) -> None:
    names = ["--cloud-provider", "--cloud-provider-hint"] if go_alias else ["--cloud-provider"]
    provider_help = "auto|none|gce|aws|azure|oke|alibaba (the Go driver's GCE, AZURE, ... hints too)"
    _configured(parser, *names, dest="cloud_provider", type=cloud_provider, help=provider_help)
    url_help = "base URL replacing every metadata service's host (paths and headers unchanged)"
    _configured(parser, "--cloud-metadata-url", help=url_help)
    gates_help = "A=true,B=false: DRAListTypeAttributes, PersistentResourceSliceAttributes"
    parser.add_argument("--feature-gates", default="", type=feature_gates, help=gates_help)


def go_flag_problems(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(warnings, errors) about the Go driver's flags this driver accepts but cannot honour."""
    warnings = [msg for dest, msg in GO_NO_EFFECT.items() if getattr(args, dest, None) is not None]
    errors = []
    if getattr(args, "move_ib_interfaces", "true") not in (None, "true", "True", "1"):
        errors.append("--move-ib-interfaces=false: not supported; IPoIB interfaces always move with their device")
    if getattr(args, "profile_provider", None) == "webhook" and not getattr(args, "webhook_url", None):
        errors.append("--profile-provider=webhook: --webhook-url is required")
    if getattr(args, "webhook_url", None) and getattr(args, "profile_provider", None) != "webhook":
        warnings.append("--webhook-url: no effect without --profile-provider=webhook (no webhook cloud provider here)")
    return warnings, errors


# subcommand -> "module:function"; the function takes the parsed args and returns an exit code.
HANDLERS: dict[str, str] = {
    "run": "driver.daemon.command:cli_run",
    "discover": "driver.inventory.discovery_cli:cli_discover",
    "validate": "driver.api.validate_cli:cli_validate",
    "webhook": "driver.webhook.server:cli_webhook",
    "topology": "driver.inventory.topology:cli_topology",
    "templates": "driver.inventory.topology:cli_templates",
}


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _global_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, top: bool) -> None:
    """``--log-level`` and ``--log-format``: on the top-level parser with defaults, on each
    subcommand without (``SUPPRESS``), so ``dranet discover --log-level debug`` works too."""
    levels = ["debug", "info", "warning", "error"]
    level_help = "least severe log level written"
    fmt_help = "log lines as JSON or text; auto: text on a terminal, JSON in a pod or to a pipe"
    if top:
        parser.add_argument("--log-level", default=default("log_level"), choices=levels, help=level_help)
        parser.add_argument("--log-format", default=default("log_format"), choices=list(LOG_FORMATS), help=fmt_help)
        return
    # No default here: one given before the subcommand must survive; help names the real one.
    for flag, choices, text in (("--log-level", levels, level_help), ("--log-format", list(LOG_FORMATS), fmt_help)):
        env = ENV_PREFIX + flag[2:].upper().replace("-", "_")
        field = flag[2:].replace("-", "_")
        parser.add_argument(
            flag, default=argparse.SUPPRESS, choices=choices, help=f"{text} (default: {default(field)}; env {env})"
        )


def _add_run(sub: Any) -> argparse.ArgumentParser:
    run = sub.add_parser("run", help="run the node driver daemon (kubelet plugin, NRI plugin, slices)", **_SUB)
    node_help = "Node this driver runs on (slices' spec.nodeName and pool): $NODE_NAME, else the hostname"
    run.add_argument(
        "--node-name", "--hostname-override", default=_env("NODE_NAME", socket.gethostname()), help=node_help
    )
    _configured(run, "--driver-name", help="DRA driver name: the slices' driver, the kubelet socket names")
    _add_node_flags(run)
    _configured(run, "--kubelet-root", "--kubelet-root-dir", help="the kubelet's --root-dir (its plugin sockets)")
    _configured(run, "--state-dir", help="prepared-claims checkpoint (tmpfs: survives driver restarts, not reboots)")
    _configured(
        run,
        "--legacy-state-dir",
        help="older drivers' prepared claims on disk: used while written during this boot, else retired ('': none)",
    )
    _configured(run, "--runtime-dir", help="pod network state (tmpfs: survives driver restarts, cleared by reboots)")
    _configured(run, "--host-netns", help="the host network namespace NICs return to (hostNetwork pod: its own)")
    _configured(run, "--nri-socket", help="the container runtime's NRI socket")
    run.add_argument(
        "--no-nri",
        dest="nri_enabled",
        action="store_false",
        help="do not connect to the container runtime (tests, discovery-only nodes)",
    )
    run.add_argument(
        "--no-device-metadata",
        dest="device_metadata",
        action="store_false",
        help="do not write device metadata files for the containers (KEP-5304; see --cdi-dir)",
    )
    cdi_help = "where the runtime reads CDI specs: the device metadata files' bind mounts"
    _configured(run, "--cdi-dir", help=cdi_help)
    kubeconfig_help = "API credentials (--manage-configuration): $KUBECONFIG, else the in-cluster service account"
    run.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help=kubeconfig_help)
    filter_help = "CEL expression over `device` (DeviceClass syntax) or `attributes` (the Go driver's syntax)"
    _configured(run, "--filter", help=f"{filter_help}; empty disables filtering")
    sharing_help = "CEL in --filter's syntax: the NICs many claims may share (consumable capacity); empty: none"
    _configured(run, "--sharing-filter", help=sharing_help)
    max_help = "sub-interfaces one shared NIC carries (its dra.net/interfaces capacity)"
    _configured(run, "--sharing-max-interfaces", type=int, help=max_help)
    pools_help = (
        "address pools of shared NICs' sub-interfaces, IFNAME=CIDR,... (IFNAME=subnet: the NIC's subnet); "
        "the node's dra.net/sharing-pools annotation overrides them, live"
    )
    _configured(run, "--sharing-pools", help=pools_help)
    vfs_help = (
        'VF counts set at start, JSON: [{"nicSelector": {"pfNames": [...], "rootDevices": [...], "vendor": ..., '
        '"deviceID": ...}, "numVfs": N}]; empty: every PF as the admin left it'
    )
    _configured(run, "--sriov-vfs", help=vfs_help)
    _configured(run, "--bind-address", help="address of /healthz, /readyz, /livez and /metrics")
    port_file_help = "file written while this instance serves --bind-address (a container's own: exec startup probe)"
    _configured(run, "--probe-port-file", help=port_file_help)
    publish_help = "seconds (or a Go duration): at most one ResourceSlice write per interval"
    _configured(run, "--publish-interval", "--inventory-min-poll-interval", type=seconds, help=publish_help)
    resync_help = "seconds (or a Go duration) between full rescans"
    _configured(run, "--resync-interval", "--inventory-max-poll-interval", type=seconds, help=resync_help)
    run.add_argument(
        "--instance-id",
        default=_env("POD_UID", str(default("instance_id"))),
        help="this instance's id (the pod UID: $POD_UID): per-instance kubelet sockets for rolling updates",
    )
    health_help = "seconds (or a Go duration) between link and RDMA port health checks"
    _configured(run, "--health-interval", type=seconds, help=health_help)
    taint_help = "device taint effect on unhealthy devices in the ResourceSlice; None: no taints"
    _configured(run, "--unhealthy-taint-effect", choices=TAINT_EFFECTS, help=taint_help)
    _add_cloud_flags(run, go_alias=True)
    provider_help = "who resolves a claim's `profile`: webhook (--webhook-url), cloud or none (no provider)"
    _configured(run, "--profile-provider", choices=PROFILE_PROVIDERS, help=provider_help)
    webhook_help = "the webhook profile provider: http://, https:// or unix:///path (dranet's API)"
    _configured(run, "--webhook-url", help=webhook_help)
    go = run.add_argument_group(
        "Go driver flags", "accepted so its command lines work; see docs/dranet-compatibility.md"
    )
    go.add_argument("--v", "-v", dest="verbosity", type=int, default=None, help="klog verbosity: 4 and up = debug")
    go.add_argument("--db-path", default=None, help="ignored (state is in --state-dir and --runtime-dir)")
    go.add_argument("--inventory-poll-burst", default=None, help="ignored (link events and rescans are coalesced)")
    go.add_argument(
        "--cloud-provider-options", action="append", default=None, help="ignored (no provider takes options)"
    )
    go.add_argument("--move-ib-interfaces", default=None, help="true only: IPoIB interfaces move with their device")
    return run


def _add_webhook(sub: Any) -> None:
    hook = sub.add_parser("webhook", help="run the validating admission webhook", **_SUB)
    kubeconfig_help = "API credentials (--manage-configuration): $KUBECONFIG, else the in-cluster service account"
    hook.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help=kubeconfig_help)
    hook.add_argument("--port", type=int, default=9443, help="HTTPS port of the webhook")
    hook.add_argument("--host", default=None, help="address the apiserver uses to reach the webhook")
    hook.add_argument("--tls-cert", default=None, help="serving certificate (PEM); none: a self-signed one")
    hook.add_argument("--tls-key", default=None, help="the certificate's private key (PEM), with --tls-cert")
    hook.add_argument(
        "--manage-configuration", action="store_true", help="create/patch the ValidatingWebhookConfiguration itself"
    )
    policy_help = "failurePolicy of the managed ValidatingWebhookConfiguration"
    hook.add_argument("--failure-policy", default="Fail", choices=["Fail", "Ignore"], help=policy_help)
    hook.add_argument(
        "--health-port", type=int, default=0, help="serve GET /healthz on this port (plain HTTP; 0: none)"
    )
    _configured(hook, "--driver-name", help="the driver name whose opaque configs are checked")


_SUB: dict[str, Any] = {"formatter_class": HelpFormatter}


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The argument parser for all subcommands, with defaults from ``DRANET_*`` variables
    (``environ``, default the process's). Raises :class:`EnvError` for a variable's bad value."""
    parser = argparse.ArgumentParser(
        prog="dranet",
        description=f"Kubernetes DRA driver for network interfaces and RDMA NICs ({default('driver_name')})",
        epilog=f"Every flag is also read from the environment: {ENV_PREFIX}<FLAG> (--state-dir: "
        f"{ENV_PREFIX}STATE_DIR); the command line wins.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)

    disc = sub.add_parser("discover", help="print the devices this node would publish", **_SUB)
    _add_node_flags(disc)
    _add_output_flag(disc)
    _configured(disc, "--filter", help="CEL filter of `dranet run`; empty: every device")
    _add_cloud_flags(disc, go_alias=False)

    val = sub.add_parser("validate", help="validate dra.net configs in ResourceClaim(Template) files", **_SUB)
    val.add_argument("files", nargs="+", help="YAML files (multi-document), - for standard input")

    _add_webhook(sub)

    topo = sub.add_parser("topology", help="GPU/NIC/NUMA matrix of this node", **_SUB)
    _add_node_flags(topo)
    _add_output_flag(topo)

    tmpl = sub.add_parser("templates", help="print NUMA-aligned (or GPU-NIC pair) ResourceClaimTemplates", **_SUB)
    tmpl.add_argument("--gpus", type=int, required=True, help="GPUs (and as many RDMA NICs) per claim")
    pair_help = (
        "one RDMA NIC per GPU: pcie-root (matchAttribute on resource.kubernetes.io/pcieRoot per pair) or "
        "pcie-switch (by bus ID, pairs under one PCIe switch: PIX/PXB); unset: NUMA-aligned"
    )
    tmpl.add_argument("--pair", choices=PAIR_MODES, default=None, help=pair_help)
    _add_node_flags(tmpl)
    _add_class_flags(tmpl)

    add_global_flags(parser, list(dict.fromkeys(sub.choices.values())), _global_flags)
    apply_env(parser, environ)
    return parser


PATH_FLAGS: dict[str, tuple[str, bool]] = {
    "kubeconfig": ("--kubeconfig", False),
    "tls_cert": ("--tls-cert", False),
    "tls_key": ("--tls-key", False),
}
"""dest -> (flag, is a directory): paths that must exist when given (``--sysfs-root`` is checked
as a sysfs tree)."""


def path_errors(args: argparse.Namespace) -> list[str]:
    """Path flags naming nothing: a typo must stop the command, not run it on nothing."""
    errors = []
    if getattr(args, "sysfs_root", None) is not None:
        from driver.inventory.discovery_cli import sysfs_root_error

        problem = sysfs_root_error(args.sysfs_root)
        if problem:
            errors.append(problem)
    for dest, (flag, is_dir) in PATH_FLAGS.items():
        value = getattr(args, dest, None)
        if value and not (os.path.isdir(value) if is_dir else os.path.isfile(value)):
            errors.append(f"{flag} {value}: no such {'directory' if is_dir else 'file'}")
    return errors


def _handler(command: str) -> Callable[[argparse.Namespace], int]:
    module, func = HANDLERS[command].split(":")
    return getattr(importlib.import_module(module), func)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dranet`` console script."""
    from driver.logs import setup_logging

    try:
        parser = build_parser()
    except EnvError as exc:
        sys.stderr.write(f"dranet: error: {exc}\n")
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "verbosity", None) is not None:  # the Go driver's --v (klog): 4+ is its debug output
        args.log_level = "debug" if args.verbosity >= 4 else "info"
    setup_logging(args.log_level, args.log_format)
    problems = path_errors(args)
    if problems:
        for message in problems:
            sys.stderr.write(f"dranet {args.command}: error: {message}\n")
        return 2
    warnings, errors = go_flag_problems(args)
    log = logging.getLogger("driver.cli")
    for message in warnings:
        log.warning(message)
    if errors:
        for message in errors:
            log.error("invalid configuration", extra={"kv": {"error": message}})
        return 2
    return int(_handler(args.command)(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
