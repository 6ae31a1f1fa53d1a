"""The NIC health check on real veths, run by the kit's HealthWatch: a NIC in the host and one "in a
pod" (the checkpoint says where); and what makes a device healthy."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from driver.checkpoint.state import MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.config import HOST_NETNS
from driver.dra.health import HealthWatch
from driver.dra.protocol import DeviceHealthState
from driver.health.links import LinkFacts
from driver.health.monitor import (
    LINK_DOWN,
    NETDEV_MISSING,
    PF_LINK_DOWN,
    PORT_NOT_ACTIVE,
    HealthMonitor,
    assess,
    device_health_states,
)
from driver.model.device import Device, HostFacts

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

    monitor = HealthMonitor(store, lambda: devices, "node", str(tmp_path), HOST_NETNS)
    task = asyncio.create_task(HealthWatch(monitor.check, 0.05, changed).run())

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


def test_health_from_sysfs(tmp_path: Path) -> None:
    """Without link facts: a netdev present, missing (or in a pod), RDMA ports ACTIVE or DOWN."""
    (tmp_path / "class/net/eth0").mkdir(parents=True)
    port = tmp_path / "class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    down = tmp_path / "class/infiniband/mlx5_1/ports/1"
    down.mkdir(parents=True)
    (down / "state").write_text("1: DOWN\n")
    root = str(tmp_path)
    assert assess(Device("a", host=HostFacts(ifname="eth0")), root, False) == (True, "", "")
    assert assess(Device("b", host=HostFacts(ifname="eth9")), root, False)[:2] == (False, NETDEV_MISSING)
    assert assess(Device("b", host=HostFacts(ifname="eth9")), root, True)[0] is True
    assert assess(Device("c", host=HostFacts(rdma_device="mlx5_0")), root, False) == (True, "", "")
    healthy, reason, message = assess(Device("d", host=HostFacts(rdma_device="mlx5_1")), root, False)
    assert (healthy, reason) == (False, PORT_NOT_ACTIVE) and "mlx5_1" in message and "DOWN" in message


def test_netlink_says_a_netdev_is_gone_where_sysfs_does_not_follow() -> None:
    """With ``--sysfs-root`` a mounted or fixture tree, ``class/net/eth0`` may outlive the link: the
    host's links asked over netlink (no link named so) win: missing, unless a pod holds it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "class/net/eth0").mkdir(parents=True)
        dev = Device("a", host=HostFacts(ifname="eth0"))
        assert assess(dev, tmp, False)[0] is True  # sysfs alone: present
        assert assess(dev, tmp, False, None, netlink=True)[:2] == (False, NETDEV_MISSING)
        assert assess(dev, tmp, True, None, netlink=True)[0] is True  # in a pod's namespace
        up = LinkFacts("eth0", admin_up=True, carrier=True, operstate="up")
        assert assess(dev, tmp, False, up, netlink=True) == (True, "", "")
        # a netdev the host's netlink never showed (a fixture tree's) is judged by the tree
        states = device_health_states({"a": dev}, "p", tmp, lambda _n: False, {}, netlink_seen=set())
        assert [s.healthy for s in states] == [True]
        states = device_health_states({"a": dev}, "p", tmp, lambda _n: False, {}, netlink_seen={"a"})
        assert [(s.healthy, s.reason) for s in states] == [(False, NETDEV_MISSING)]


def test_a_vf_is_unhealthy_while_its_pf_is_down_published_or_not(netns_factory, tmp_path: Path) -> None:
    """A VF's PF found by its PCI function (the tree's ``bus/pci/devices/<pf>/net``; here a veth
    stands for the PF's netdev, unpublished): PF administratively down, then without carrier, makes
    the VF ``PfLinkDown`` though its own link is up; the PF up again, the VF is healthy."""
    fabric = netns_factory.netns()
    pf_nic, pf_peer = netns_factory.veth(peer_netns=fabric)
    vf_nic, vf_peer = netns_factory.veth(peer_netns=fabric)
    for nic in (pf_nic, vf_nic):
        ip("link", "set", nic, "up")
    for peer in (pf_peer, vf_peer):
        ip("-n", fabric, "link", "set", peer, "up")
    (tmp_path / "bus/pci/devices/0000:41:00.0/net" / pf_nic).mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:41:00.1").mkdir()  # the VF's own function (its absence: DeviceRemoved)
    devices = {"vf": Device("vf", host=HostFacts(ifname=vf_nic, pci_address="0000:41:00.1", sriov_pf="0000:41:00.0"))}
    monitor = HealthMonitor(
        CheckpointStore(tmp_path / "s", tmp_path / "r"), lambda: devices, "node", str(tmp_path), HOST_NETNS
    )

    def vf() -> DeviceHealthState:
        (state,) = monitor.evaluate()
        return state

    assert (vf().healthy, vf().reason) == (True, "")
    ip("link", "set", pf_nic, "down")
    down = vf()
    assert (down.healthy, down.reason) == (False, PF_LINK_DOWN)
    assert f"its PF 0000:41:00.0 ({pf_nic}) is down (administratively)" in down.message
    ip("link", "set", pf_nic, "up")
    ip("-n", fabric, "link", "set", pf_peer, "down")
    cut = vf()
    assert (cut.reason, f"({pf_nic}) has no carrier" in cut.message) == (PF_LINK_DOWN, True), cut
    ip("-n", fabric, "link", "set", pf_peer, "up")
    assert (vf().healthy, vf().reason) == (True, "")
    ip("-n", fabric, "link", "set", vf_peer, "down")
    assert vf().reason == LINK_DOWN, "the VF's own link first"
