"""GSO/GRO sizes, per-interface sysctls, eBPF detachment and VRF through the real hooks (real
namespaces and veths; the "host" is a throwaway namespace). Issue 16 part B."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from driver.netlink import offload_sizes, vrf
from driver.netlink.rtnl import NetnsOpError, Rtnl
from driver.netlink_channel import netlink_socket, open_netns
from driver.nri.hook_context import HookError
from tests.nri.test_pod_rules import Node, sh
from tests.plugins.netns import NetnsFactory
from tests.plugins.nri import link_facts, prepare_claim
from tests.support import bpf_progs

pytestmark = pytest.mark.root


def sysctl(netns: str, path: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", netns, "cat", f"/proc/sys/net/{path}"], capture_output=True, text=True)
    return int(out.stdout)


def sizes(netns: str, ifname: str) -> dict[str, int]:
    fd = open_netns(netns)
    rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE, fd))
    try:
        link = rtnl.link(ifname)
        assert link is not None
        return offload_sizes.read(rtnl, link.index)[0]
    finally:
        rtnl.close()
        os.close(fd)


def run(node: Node, interface: dict[str, object]) -> None:
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [{"interface": interface}]}}])
    node.hooks.run_pod_sandbox(node.pod)


def test_sysctls_are_set_in_the_pod_and_the_hosts_come_back(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "link", "set", node.nic, "mtu", "1500")
    subprocess.run(["ip", "netns", "exec", node.host, "sysctl", "-qw", f"net.ipv4.conf.{node.nic}.arp_ignore=2"])
    host_forwarding = sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding")
    run(node, {"name": "net1", "forwarding": not host_forwarding, "arpIgnore": 1, "arpAnnounce": 2})
    assert sysctl(node.pod_ns, "ipv4/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv6/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_ignore") == 1
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_announce") == 2
    stored = node.store.read(lambda s: s.pods[node.uid].devices[0].host_sysctls)
    assert stored["ipv4/arp_ignore"] == 2 and stored["ipv4/forwarding"] == host_forwarding
    node.hooks.stop_pod_sandbox(node.pod)
    # The kernel gave the NIC the host's defaults on its way back; the recorded values are set again.
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/arp_ignore") == 2
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding") == host_forwarding


def test_offload_sizes_travel_with_the_move_and_the_hosts_come_back(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    before = sizes(node.host, node.nic)
    want = {"gsoMaxSize": 131072, "groMaxSize": 196608, "gsoIPv4MaxSize": 98304, "groIPv4MaxSize": 98304}
    run(node, {"name": "net1", **want})
    assert sizes(node.pod_ns, "net1") == want
    node.hooks.stop_pod_sandbox(node.pod)
    assert sizes(node.host, node.nic) == before


def test_offload_sizes_above_the_nic_maximum_are_refused_before_the_move(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    with pytest.raises(HookError) as info:
        run(node, {"gsoMaxSize": 600000, "groMaxSize": 600000})
    msg = str(info.value)
    assert "offload sizes failed" in msg and "gsoMaxSize: 600000 is above the NIC's maximum TSO size 524280" in msg
    assert "groMaxSize: 600000 is above the kernel's maximum GRO size 524280" in msg
    assert link_facts(node.nic, node.host) == before, "nothing moved"


def test_ebpf_programs_are_detached_and_recorded(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_all(node.host, node.nic)
    try:
        run(node, {"name": "net1", "disableEbpfPrograms": True})
        link = json.loads(
            subprocess.run(
                ["ip", "-j", "-n", node.pod_ns, "-d", "link", "show", "net1"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )[0]
        assert "xdp" not in link, link
        assert bpf_progs.tcx_count(node.pod_ns, "net1") == 0
        record = node.store.read(lambda s: s.pods[node.uid].devices[0].ebpf_detached)
        assert sorted((r["hook"], r["how"]) for r in record) == [
            ("tc-ingress", "removed by the namespace move"),
            ("tcx-ingress", "detached"),
            ("xdp-generic", "detached"),
        ]
        assert all(isinstance(r["id"], int) and r["id"] > 0 for r in record)
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)


def test_without_the_setting_programs_stay(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_all(node.host, node.nic)
    try:
        run(node, {"name": "net1"})
        assert bpf_progs.tcx_count(node.pod_ns, "net1") == 1
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)


def test_vrf_is_refused_clearly_where_the_kernel_has_none(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    probe = netns_factory.netns()
    has_vrf = subprocess.run(["ip", "-n", probe, "link", "add", "v0", "type", "vrf", "table", "10"]).returncode == 0
    if has_vrf:
        pytest.skip("this kernel has VRF support: the refusal path cannot be shown here")
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    with pytest.raises(HookError) as info:
        run(node, {"name": "net1", "addresses": ["10.63.0.5/24"], "vrf": {"name": "vrf-a", "table": 10}})
    assert "vrf create failed: vrf vrf-a table 10: this kernel cannot create VRF devices" in str(info.value)
    assert link_facts(node.nic, node.host) == before, "rolled back: the NIC is home as it was"
    assert node.store.read(lambda s: s.pods) == {}


def test_vrf_messages_byte_by_byte() -> None:
    req = vrf.newvrf("dev0", "vrf-a", 10)
    assert req.kind == 16 and req.flags == 0x400 | 0x200  # RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL
    name = b"vrf-a\0"
    ifname = struct.pack("=HH", 4 + len(name), 3) + name + b"\0\0"  # IFLA_IFNAME, padded to 4
    kind = struct.pack("=HH", 7, 1) + b"vrf" + b"\0"  # IFLA_INFO_KIND "vrf" (3 bytes + 1 pad)
    data = struct.pack("=HH", 12, 0x8000 | 2) + struct.pack("=HHI", 8, 1, 10)  # IFLA_INFO_DATA{IFLA_VRF_TABLE 10}
    linkinfo = struct.pack("=HH", 4 + len(kind) + len(data), 0x8000 | 18) + kind + data  # IFLA_LINKINFO
    assert req.body == struct.pack("=BxHiII", 0, 0, 0, 0, 0) + ifname + linkinfo
    enslave = vrf.release("dev0", 7)
    assert enslave.body == struct.pack("=BxHiII", 0, 0, 7, 0, 0) + struct.pack("=HHI", 8, 10, 0)  # IFLA_MASTER 0
    delete = vrf.dellink("dev0", 9, "vrf-a")
    assert (delete.kind, delete.body) == (17, struct.pack("=BxHiII", 0, 0, 9, 0, 0))


def test_before_return_releases_the_nic_and_deletes_its_master(netns_factory: NetnsFactory) -> None:
    """The VRF enslave and teardown paths on a real master device: a bridge stands in for the VRF this
    kernel lacks (enslave and release are ``IFLA_MASTER``, delete ``RTM_DELLINK``, whatever the kind).
    Only what the hooks recorded as created (ifindex and kind) is deleted: a record whose index now
    holds a link of another kind (the pod's own) deletes nothing."""
    from driver.checkpoint.state import MovedDevice
    from driver.netlink import nic_moves
    from driver.netlink.namespaces import Namespaces
    from driver.netlink.nic_moves import PodLinkConfig
    from driver.nri.pod_extras import PodExtras

    pod = netns_factory.netns()
    nic, _ = netns_factory.veth(netns=pod, peer_netns=netns_factory.netns())
    if subprocess.run(["ip", "-n", pod, "link", "add", "vrf-a", "type", "bridge"]).returncode != 0:
        pytest.skip("no bridge devices in this kernel")
    ns = Namespaces("/proc/self/ns/net")
    try:
        with ns.pod(f"/run/netns/{pod}") as (rtnl, _):  # enslaved as configure_pod_links does for a VRF
            master, own = rtnl.link("vrf-a"), rtnl.link(nic)
            assert master is not None and own is not None
            nic_moves.configure_pod_links(rtnl, {"d0": PodLinkConfig(nic, master=master.index)})
        assert (
            json.loads(
                subprocess.run(["ip", "-j", "-n", pod, "link", "show", nic], capture_output=True, text=True).stdout
            )[0]["master"]
            == "vrf-a"
        )
        created = [
            {"kind": "bridge", "index": master.index, "name": "vrf-a"},
            {"kind": "vrf", "index": own.index, "name": nic},  # the index holds a veth now: kept
        ]
        moved = MovedDevice("d0", "eth0", nic, vrf="vrf-a", pod_index=own.index)
        PodExtras(ns).before_return(f"/run/netns/{pod}", [moved], created)
    finally:
        ns.close()
    link = json.loads(
        subprocess.run(["ip", "-j", "-n", pod, "link", "show", nic], capture_output=True, text=True).stdout
    )
    assert "master" not in link[0]
    assert subprocess.run(["ip", "-n", pod, "link", "show", "vrf-a"], capture_output=True).returncode != 0
    assert subprocess.run(["ip", "-n", pod, "link", "show", nic], capture_output=True).returncode == 0


def test_a_program_held_by_a_bpf_link_is_left_attached_and_recorded(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    fds = bpf_progs.attach_xdp_link(node.host, node.nic)
    try:
        run(node, {"name": "net1", "disableEbpfPrograms": True})  # the pod starts
        (record,) = node.store.read(lambda s: s.pods[node.uid].devices[0].ebpf_detached)
        assert record["hook"] == "xdp-generic" and str(record["how"]).startswith("left attached: ")
        assert "Device or resource busy" in str(record["how"])
        node.hooks.stop_pod_sandbox(node.pod)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_vrf_refused_by_the_kernel_is_named_once_and_nothing_is_recorded(netns_factory: NetnsFactory) -> None:
    """A VRF whose name is taken (here by the pod's own link): one clear message naming the VRF and its
    table once, nothing recorded as created, the pod's link untouched."""
    from driver.netlink.namespaces import Namespaces

    pod = netns_factory.netns()
    netns_factory.veth("vrf-a", netns=pod, peer_netns=pod)
    recorded: list[dict[str, object]] = []
    ns = Namespaces("/proc/self/ns/net")
    try:
        with ns.pod(f"/run/netns/{pod}") as (rtnl, _), pytest.raises(NetnsOpError) as info:
            vrf.create(rtnl, {"vrf-a": ("d0", 10)}, recorded.append)
    finally:
        ns.close()
    assert str(info.value) == "device d0: vrf create failed: vrf vrf-a table 10: File exists"
    assert recorded == []
    assert subprocess.run(["ip", "-n", pod, "link", "show", "vrf-a"], capture_output=True).returncode == 0
