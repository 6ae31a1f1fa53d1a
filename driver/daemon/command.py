"""``dranet run``: check the flags, set the process up, load the checkpoint and run the daemon.

The checkpoint must load before anything starts (fail if unreadable or from a newer driver:
never drop state; a corrupt file is moved aside). SIGTERM/SIGINT stop the daemon
(:meth:`Daemon.shutdown`: gRPC servers stopped, sockets removed) and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
from dataclasses import replace

from driver.checkpoint import location
from driver.checkpoint.errors import CheckpointError
from driver.checkpoint.store import CheckpointStore
from driver.claims.profile import check_at_start, profile_resolver
from driver.config import DriverConfig, config_from_args
from driver.daemon.lifecycle import Daemon
from driver.daemon.probe_server import parse_bind_address
from driver.inventory.device_filter import FilterError
from driver.inventory.discovery_cli import sysfs_root_error
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)


async def _main(config: DriverConfig) -> int:
    try:
        state_dir = location.resolve(config.state_dir, config.legacy_state_dir, runtime_dir=config.runtime_dir)
        config = replace(config, state_dir=state_dir)
    except (OSError, ValueError) as exc:
        log.error("cannot choose the state directory", extra={"kv": {"error": str(exc)}})
        return 1
    try:
        store = CheckpointStore(config.state_dir, config.runtime_dir)
    except CheckpointError as exc:
        log.error("cannot load checkpoint; refusing to start without it", extra={"kv": {"error": str(exc)}})
        return 1
    problem = store.writable_problem()
    if problem:  # every claim would fail at its first write: say so once, now
        log.error("cannot save driver state; refusing to start", extra={"kv": {"error": problem}})
        return 1
    try:
        kube = KubeClient.from_kubeconfig(config.kubeconfig)
    except Exception as exc:  # noqa: BLE001 - any client setup failure stops the daemon with its reason
        log.error(
            "cannot configure the Kubernetes client",
            extra={"kv": {"kubeconfig": config.kubeconfig or "<in-cluster>", "error": str(exc)}},
        )
        return 1
    try:
        daemon = Daemon(config, kube, store)
    except (FilterError, ValueError) as exc:  # --filter, --sharing-filter, --sharing-pools, --sriov-vfs
        log.error("invalid flag", extra={"kv": {"error": str(exc)}})
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopping.set)
    log.info(
        "dranet starting",
        extra={
            "kv": {
                "node": config.node_name,
                "driver": config.driver_name,
                "sysfs": config.sysfs_root,
                "state_dir": config.state_dir,
                "nri": config.nri_enabled,
                "cloud_provider": config.cloud_provider,
                "feature_gates": {k: v for k, v in config.feature_gates.items() if v},
            }
        },
    )
    return await daemon.run()


def cli_run(args: argparse.Namespace) -> int:
    """Entry point of ``dranet run``."""
    config = config_from_args(args)
    try:
        if not config.node_name:
            raise ValueError("--node-name: must not be empty (set NODE_NAME)")
        if config.resync_interval <= 0 or config.publish_interval <= 0 or config.health_interval <= 0:
            raise ValueError("--resync-interval/--publish-interval/--health-interval: must be > 0 seconds")
        if "/" in config.instance_id or len(config.instance_id) > 64:
            raise ValueError(f"--instance-id {config.instance_id!r}: at most 64 characters, no '/'")
        parse_bind_address(config.bind_address)
        problem = sysfs_root_error(config.sysfs_root)
        if problem:
            raise ValueError(problem)
        profiles = profile_resolver(config)
        problem = check_at_start(profiles) if profiles is not None else ""
        if problem:
            raise ValueError(f"--webhook-url: {problem}")
    except ValueError as exc:
        log.error("invalid configuration", extra={"kv": {"error": str(exc)}})
        return 2
    _raise_nofile_limit()
    return asyncio.run(_main(config))


def _raise_nofile_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (as Go programs do at start): discovery keeps the
    sysfs files it rereads open (:mod:`driver.inventory.scan_replay`), several per device."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.info("cannot raise the open files limit", extra={"kv": {"soft": soft, "error": str(exc)}})
