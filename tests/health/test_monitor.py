"""HealthMonitor on real veths: a NIC in the host and one "in a pod" (the checkpoint says where)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from driver.checkpoint.state import MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.config import HOST_NETNS
from driver.kubelet.device_health import LINK_DOWN, DeviceHealthState, assess
from driver.kubelet.health_monitor import HealthMonitor
from driver.model.device import Device, HostFacts
from driver.netlink.link_health import LinkFacts

pytestmark = pytest.mark.root


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


async def test_link_down_and_up_are_reported_wherever_the_nic_is(netns_factory, tmp_path: Path) -> None:
    fabric, pod = netns_factory.netns(), netns_factory.netns()
    host_nic, host_peer = netns_factory.veth(peer_netns=fabric)
    pod_nic, pod_peer = netns_factory.veth(netns=pod, peer_netns=fabric)
    ip("link", "set", host_nic, "up")
    ip("-n", pod, "link", "set", pod_nic, "up")
    for peer in (host_peer, pod_peer):
        ip("-n", fabric, "link", "set", peer, "up")
    devices = {
        "nic-a": Device("nic-a", host=HostFacts(ifname=host_nic)),
        "nic-b": Device("nic-b", host=HostFacts(ifname="was-" + pod_nic[:8])),  # its host name; now in the pod
    }
    store = CheckpointStore(tmp_path / "s", tmp_path / "r")
    claim = PreparedClaim("c1", "ns", "c", ["p1"], [PreparedDevice("nic", "node", "nic-b", devices["nic-b"])])
    pod_state = PodNetState(
        "p1",
        namespace="ns",
        name="trainer",
        netns_path=f"/run/netns/{pod}",
        devices=[MovedDevice("nic-b", "was-" + pod_nic[:8], pod_nic, step="in-pod")],
    )
    store.update(lambda s: (s.claims.__setitem__("c1", claim), s.pods.__setitem__("p1", pod_state)))
    seen: list[list[DeviceHealthState]] = []

    async def changed(states: list[DeviceHealthState]) -> None:
        seen.append(states)

    monitor = HealthMonitor(store, lambda: devices, "node", str(tmp_path), HOST_NETNS, 0.05, changed)
    task = asyncio.create_task(monitor.run())

    async def state(name: str, healthy: bool) -> DeviceHealthState:
        for _ in range(200):
            if seen:
                s = next(x for x in seen[-1] if x.device == name)
                if s.healthy is healthy:
                    return s
            await asyncio.sleep(0.02)
        raise AssertionError(f"{name} never became healthy={healthy}: {seen[-1] if seen else None}")

    try:
        assert (await state("nic-a", True)).reason == ""
        await state("nic-b", True)
        ip("-n", fabric, "link", "set", pod_peer, "down")
        b = await state("nic-b", False)
        assert b.reason == LINK_DOWN and "trainer" in b.message and pod_nic in b.message
        assert next(x for x in seen[-1] if x.device == "nic-a").healthy
        ip("-n", fabric, "link", "set", host_peer, "down")
        assert (await state("nic-a", False)).reason == LINK_DOWN
        ip("-n", fabric, "link", "set", pod_peer, "up")
        ip("-n", fabric, "link", "set", host_peer, "up")
        await state("nic-a", True)
        await state("nic-b", True)
        n = len(seen)
        await asyncio.sleep(0.3)
        assert len(seen) == n, "an unchanged state is not reported again"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_an_administratively_down_link_says_nothing_about_its_cable(tmp_path: Path) -> None:
    dev = Device("d", host=HostFacts(ifname="eth7"))
    down = LinkFacts("eth7", admin_up=False, carrier=False, operstate="down")
    assert assess(dev, str(tmp_path), False, down)[0] is True
    cut = LinkFacts("eth7", admin_up=True, carrier=False, operstate="lowerlayerdown")
    assert assess(dev, str(tmp_path), False, cut)[:2] == (False, LINK_DOWN)
