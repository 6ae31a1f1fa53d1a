"""The configuration of a whole driver daemon run in a test's process: a node's paths in a fresh
folder (short, for unix socket paths), the NRI harness's socket, a fake API server's kubeconfig,
the host's /sys with discovery kept to the test's own links."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from driver.config import DriverConfig

IFNAME = 'device.attributes["dra.net"].ifName'


def node_config(node: str, prefix: str, nri_socket: str, kubeconfig: Path, work: Path, **more: Any) -> DriverConfig:
    """A node ``node`` whose claims, pod state, metadata and CDI specs live under ``work/run`` (as
    a node's /run), discovering only the links named ``prefix``..."""
    run_dir = work / "run"
    return DriverConfig(
        node_name=node,
        sysfs_root="/sys",
        kubelet_root=str(work / "kubelet"),
        cdi_dir=str(run_dir / "cdi"),
        state_dir=str(run_dir / "dranet/claims"),
        runtime_dir=str(run_dir / "dranet"),
        legacy_state_dir="",
        nri_socket=nri_socket,
        kubeconfig=str(kubeconfig),
        filter=f'has({IFNAME}) && {IFNAME}.startsWith("{prefix}")',
        bind_address="127.0.0.1:0",
        publish_interval=0.2,
        **more,
    )


def work_dir(tag: str) -> Path:
    """A fresh folder under /tmp (short: unix socket paths); the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=f"dn-{tag}-", dir="/tmp"))
