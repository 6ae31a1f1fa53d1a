"""driver.netlink.nic_moves on real veth NICs and namespaces (netlink through pyroute2).

The "pod netns gone" path: a veth is destroyed with its namespace (only physical NICs are
handed back to init_net), so the tests simulate what the kernel does for a physical NIC:
move it back to the host as ``devN`` from inside the pod netns, then delete the netns.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.netlink import nic_moves
from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import NetnsOpError, Route
from tests.plugins.nri import configure_host_nic, ip, link_facts

pytestmark = pytest.mark.root


@pytest.fixture
def ns() -> Iterator[Namespaces]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    n = Namespaces("/proc/self/ns/net")
    try:
        yield n
    finally:
        n.close()


def _nic(netns_factory) -> tuple[str, str]:
    a, pa = netns_factory.veth()
    configure_host_nic(
        a,
        pa,
        "10.41.0.1/24",
        [
            ["10.42.0.0/16", "via", "10.41.0.254"],
            ["10.43.0.0/16", "via", "10.41.0.254", "table", "4321"],
            ["10.44.0.0/16", "via", "10.41.0.254", "metric", "99"],
        ],
        mtu=1450,
    )
    ip("-6", "addr", "add", "fd41::1/64", "dev", a, "nodad")
    ip("-6", "route", "add", "fd42::/64", "via", "fd41::fe", "dev", a)
    return a, pa


def test_record_host_keeps_what_the_kernel_does_not_recreate(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    state = nic_moves.record_host(ns, [a])[a]
    assert (state.ifname, state.mtu) == (a, 1450)
    assert state.mac == link_facts(a)["mac"]
    assert sorted(state.addresses) == ["10.41.0.1/24", "fd41::1/64"]  # no fe80:: (link scope)
    got = sorted((r.dst, r.gateway, r.table, r.priority) for r in state.routes if r.family == socket.AF_INET)
    assert got == [
        ("10.42.0.0/16", "10.41.0.254", 254, None),
        ("10.43.0.0/16", "10.41.0.254", 4321, None),
        ("10.44.0.0/16", "10.41.0.254", 254, 99),
    ]
    v6 = [r for r in state.routes if r.family == socket.AF_INET6]
    assert [(r.dst, r.gateway) for r in v6] == [("fd42::/64", "fd41::fe")]  # no proto-kernel prefix routes
    with pytest.raises(KeyError, match="nosuch"):
        nic_moves.record_host(ns, [f"nosuch{secrets.token_hex(2)}"])


def test_move_configure_return_round_trip(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = nic_moves.record_host(ns, [a])[a]
    cfg = PodLinkConfig(
        ifname="eth7",
        mtu=1280,
        mac="02:00:00:00:07:07",
        addresses=["192.168.7.2/24"],
        routes=[Route(dst="172.16.0.0/12", gateway="192.168.7.1")],
    )
    with ns.pod(f"/run/netns/{pod_ns}") as (pod_rtnl, pod_fd):
        nic_moves.move_link(ns.host_rtnl(), "nic-a", a, pod_fd, cfg.ifname, cfg.mtu, cfg.mac)
        res = nic_moves.configure_pod_links(pod_rtnl, {"nic-a": cfg})
    assert res["nic-a"].mac == "02:00:00:00:07:07" and res["nic-a"].addresses == ["192.168.7.2/24"]
    inside = link_facts("eth7", netns=pod_ns)
    assert (inside["mtu"], inside["mac"], inside["up"], inside["addresses"]) == (
        1280,
        "02:00:00:00:07:07",
        True,
        ["192.168.7.2/24"],
    )
    assert ("172.16.0.0/12", "192.168.7.1", "main", None) in inside["routes"]
    assert link_facts(a) is None

    how = nic_moves.return_link(ns, "nic-a", f"/run/netns/{pod_ns}", "eth7", state, extra_macs=("02:00:00:00:07:07",))
    assert how == "pod"
    assert link_facts(a) == before
    # Idempotent: a second return finds it on the host and changes nothing.
    assert nic_moves.return_link(ns, "nic-a", f"/run/netns/{pod_ns}", "eth7", state) == "host"
    assert link_facts(a) == before


def test_return_when_pod_netns_is_gone_finds_renamed_nic_by_mac(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = nic_moves.record_host(ns, [a])[a]
    with ns.pod(f"/run/netns/{pod_ns}") as (_, pod_fd):
        nic_moves.move_link(ns.host_rtnl(), "nic-a", a, pod_fd, "net1", 1300)
    # What the kernel does to a physical NIC when its netns dies: back to init_net as devN.
    dev = f"dev{secrets.randbelow(10**6)}"
    netns_factory.host_links.append(dev)  # cleanup if the test fails before the rename back
    subprocess.run(
        ["ip", "-n", pod_ns, "link", "set", "net1", "netns", f"/proc/{os.getpid()}/ns/net", "name", dev], check=True
    )
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    assert link_facts(dev) is not None

    how = nic_moves.return_link(ns, "nic-a", f"/run/netns/{pod_ns}", "net1", state)
    assert how == "netns-gone"
    assert link_facts(a) == before
    assert link_facts(dev) is None


def test_missing_everywhere_is_a_clear_error(ns: Namespaces, netns_factory) -> None:
    pod_ns = netns_factory.netns()
    state = LinkState(ifname=f"gone{secrets.token_hex(2)}", mtu=1500, mac="02:de:ad:00:00:01")
    with pytest.raises(NetnsOpError) as err:
        nic_moves.return_link(ns, "nic-x", f"/run/netns/{pod_ns}", "net1", state)
    assert err.value.device == "nic-x" and err.value.step == "find" and state.ifname in str(err.value)


def test_regular_file_is_not_a_netns(ns: Namespaces, tmp_path: Path) -> None:
    fake = tmp_path / "netns"
    fake.write_text("")
    with pytest.raises(NetnsGone), ns.pod(str(fake)):
        pass


def test_find_host_link_by_pci_address(ns: Namespaces, netns_factory, tmp_path: Path) -> None:
    a, _ = netns_factory.veth()
    pci = "0000:3b:00.1"
    dev_dir = tmp_path / "devices" / "pci0000:3a" / pci
    dev_dir.mkdir(parents=True)
    (tmp_path / "class" / "net" / a).mkdir(parents=True)
    os.symlink(f"../../../devices/pci0000:3a/{pci}", tmp_path / "class" / "net" / a / "device")
    # Neither the name nor any MAC matches: only the PCI address identifies it.
    state = LinkState(ifname="renamed0", mtu=1500, mac="02:00:00:00:00:99", pci_address=pci)
    found = nic_moves.find_host_link(ns.host_rtnl(), state, sysfs_root=str(tmp_path))
    assert found is not None and found.ifname == a


def test_move_of_missing_link_names_device_and_step(ns: Namespaces, netns_factory) -> None:
    pod_ns = netns_factory.netns()
    with ns.pod(f"/run/netns/{pod_ns}") as (_, fd):
        with pytest.raises(NetnsOpError, match="device nic-z: move failed"):
            nic_moves.move_link(ns.host_rtnl(), "nic-z", f"nx{secrets.token_hex(3)}", fd, "net1")
