"""The daemon's own NIC moves cost no inventory work; anyone else's link change costs one device.

The whole daemon runs in-process (``Daemon.run``: link watch, link updates, rescan loop,
publisher, kubelet plugin, NRI plugin) on the host's ``/sys`` and netlink, against the stub API
server; the container runtime is containerd/nri's adaptation (the Go harness). Real veth NICs
are moved into a real pod netns and back by RunPodSandbox/StopPodSandbox.

Counted, not timed: every link change the inventory updater is handed is recorded (a spy on
``LinkUpdater.apply``), and the full scans come from the daemon's own counter. Other engineers'
interfaces on this shared host may appear in the record; only changes naming our NICs (by name
in the host or in the pod, or by ifindex) are asserted on.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.config import DriverConfig
from driver.daemon.lifecycle import Daemon
from driver.inventory.incremental import LinkChange
from driver.inventory.names import netdev_device_name
from driver.kube.client import KubeClient
from driver.netlink.hook_activity import GRACE
from harness.fake_apiserver import FakeAPIServer
from harness.netns import NetnsFactory
from harness.nri import Harness, ip, link_facts, pod_json, prepare_claim

pytestmark = [pytest.mark.root, pytest.mark.slow]

CYCLES = 3
IFNAME = 'device.attributes["dra.net"].ifName'


def _index(ifname: str) -> int:
    out = subprocess.run(["cat", f"/sys/class/net/{ifname}/ifindex"], capture_output=True, text=True, check=True)
    return int(out.stdout)


async def _until(pred: Any, what: str, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _mentions(changes: Iterable[LinkChange], names: set[str], indexes: set[int]) -> list[LinkChange]:
    return [c for c in changes if c.ifname in names or c.index in indexes]


async def test_own_moves_cause_no_rescan_and_no_update(
    nri_harness: Harness, netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    prefix = f"ow{secrets.token_hex(3)}"
    peer_ns, pod_ns = netns_factory.netns(), netns_factory.netns()
    nics = []
    for suffix in "ab":
        name, peer = netns_factory.veth(f"{prefix}{suffix}", f"q{prefix[1:]}{suffix}", peer_netns=peer_ns)
        sub, routed = netns_factory.subnet(), netns_factory.subnet()
        ip("-n", peer_ns, "link", "set", peer, "up")
        ip("link", "set", name, "mtu", "1500", "up")
        ip("addr", "add", sub.cidr(1), "dev", name)
        ip("route", "add", str(routed.v4), "via", sub.ip(254), "dev", name)
        nics.append(name)
    before = {n: link_facts(n) for n in nics}
    indexes = {_index(n) for n in nics}

    api = FakeAPIServer().start()
    work = Path(tempfile.mkdtemp(prefix="dn-own-", dir="/tmp"))  # short: unix socket paths
    config = DriverConfig(
        node_name=f"node-{prefix}",
        sysfs_root="/sys",
        kubelet_root=str(work / "kubelet"),
        cdi_dir=str(work / "cdi"),
        state_dir=str(work / "state"),
        runtime_dir=str(work / "run"),
        nri_socket=nri_harness.socket,
        kubeconfig=str(api.write_kubeconfig(work / "kubeconfig")),
        filter=f'has({IFNAME}) && {IFNAME}.startsWith("{prefix}")',
        bind_address="127.0.0.1:0",
        publish_interval=0.2,
        resync_interval=3600.0,  # no timer scan during the test: any full scan would be caused
    )
    store = CheckpointStore(config.state_dir, config.runtime_dir)
    daemon = Daemon(config, KubeClient.from_kubeconfig(config.kubeconfig), store)
    handed: list[LinkChange] = []
    apply = daemon.device_sync.updater.apply

    def spy(changes: list[LinkChange], pause: Any = None) -> Any:
        handed.extend(changes)
        return apply(changes, pause)

    daemon.device_sync.updater.apply = spy  # type: ignore[method-assign]
    task = asyncio.create_task(daemon.run())
    try:
        await _until(lambda: daemon.device_sync.scanned, "the first scan")
        res = await asyncio.to_thread(nri_harness.cmd, "wait-sync", count=1, timeout=20)
        assert res["ok"], res
        pod_uid = f"uid-{secrets.token_hex(4)}"
        cfg = {"opaque": [{"interface": {"mtu": 1400, "addresses": ["192.168.77.2/24"]}}]}
        prepare_claim(
            store,
            pod_uid,
            [
                {"ifname": nics[0], "device": netdev_device_name(nics[0]), "config": cfg},
                {"ifname": nics[1], "device": netdev_device_name(nics[1])},
            ],
        )
        pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
        await asyncio.sleep(0.3)  # let the test's own setup events drain
        handed.clear()
        scans = daemon.metrics.inventory_update_count("full_scan")
        own = daemon.hook_activity.own_events
        pod_names = {"net1", "net2", *nics}

        for _ in range(CYCLES):
            assert (await asyncio.to_thread(nri_harness.cmd, "run", pod=pod))["ok"]
            assert link_facts(nics[0], netns=pod_ns)["mtu"] == 1400
            assert (await asyncio.to_thread(nri_harness.cmd, "stop", pod=pod))["ok"]
        await asyncio.sleep(0.5)  # events still queued in the socket are read meanwhile

        assert [link_facts(n) for n in nics] == [before[n] for n in nics]  # nothing lost at home
        assert daemon.metrics.inventory_update_count("full_scan") == scans, "a full scan ran during the pod cycles"
        assert _mentions(handed, pod_names, indexes) == [], "the hooks' own link events reached the updater"
        # Each cycle: every NIC leaves the host (new + del) and comes back (new, under both names).
        assert daemon.hook_activity.own_events - own >= CYCLES * len(nics) * 3

        # Somebody else's change to one of them is seen: one link, one device, no full scan.
        await asyncio.sleep(GRACE)  # our expectations for these NICs have expired
        ip("link", "set", nics[1], "mtu", "1280")
        device = netdev_device_name(nics[1])
        await _until(
            lambda: daemon.device_sync.inventory[device].attributes.get("dra.net/mtu") == 1280,
            "the inventory to see MTU 1280",
        )
        assert {c.ifname for c in _mentions(handed, pod_names, indexes)} == {nics[1]}
        assert daemon.metrics.inventory_update_count("full_scan") == scans
    finally:
        daemon.stopping.set()
        await asyncio.wait_for(task, 30)
        api.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
