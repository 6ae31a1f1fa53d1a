"""A NIC's VRF: the tables a pod's NICs share, the names refused up front, the messages byte by byte,
the refusal where the kernel has no VRF (real hooks, real namespaces and veths) and the teardown of
only what the hooks created (a bridge stands in for the VRF this kernel lacks)."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.checkpoint.state import MovedDevice, PreparedClaim, PreparedDevice
from driver.model.device import Device
from driver.netlink.namespaces import Namespaces
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings import vrf
from driver.nic_settings.setting import HostNetns, Nic, PodNetns, SettingRefused
from driver.nri.claim_reports import HookError
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.support import kernel
from tests.support.hook_node import Node, NoKernel, ipj

pytestmark = pytest.mark.kernel

HOST = LinkState(ifname="eth5", mtu=1500, mac="02:00:00:00:00:05", index=7)


def nic(params: dict[str, object], name: str = "d0", host: LinkState = HOST, ifname: str = "net1") -> Nic:
    device = PreparedDevice("nic", "node", name, Device(name), decode_config(params, "p"))
    return Nic(PreparedClaim("c", "ns", "c"), device, host, PodLinkConfig(ifname))


def test_nics_sharing_a_vrf_share_its_table() -> None:
    other = LinkState("eth6", 1500, "02:00:00:00:00:06", index=9)
    first = nic({"interface": {"name": "a", "vrf": {"name": "v"}}})
    second = nic({"interface": {"vrf": {"name": "v"}}}, "d1", other)
    assert vrf.pod_vrfs([first, second]) == {"v": ("d0", 107)}  # 100 + the first NIC's ifindex
    pinned = nic({"interface": {"vrf": {"name": "v", "table": 30}}}, "d2", other)
    assert vrf.pod_vrfs([first, pinned]) == {"v": ("d0", 30)}


def test_one_vrf_two_tables_in_a_pod_is_refused_before_anything_moves() -> None:
    a = nic({"interface": {"name": "a", "vrf": {"name": "v", "table": 10}}})
    b = nic({"interface": {"vrf": {"name": "v", "table": 11}}}, "d1", ifname="b")
    with pytest.raises(SettingRefused) as info:
        vrf.Vrf().plan([a, b], NoKernel(), NoKernel())  # type: ignore[arg-type]
    assert info.value.step == "vrf create" and "table 11 here, 10 for device d0" in info.value.reason


def test_the_plan_puts_every_route_in_the_vrfs_table() -> None:
    a = nic({"interface": {"name": "a", "vrf": {"name": "blue"}}})
    plain = nic({"interface": {"name": "b"}}, "d1", ifname="b")
    vrf.Vrf().plan([a, plain], NoKernel(), NoKernel(("eth0",)))  # type: ignore[arg-type]
    assert (a.pod.table, a.records) == (107, {"vrf": "blue"})
    assert (plain.pod.table, plain.records) == (None, {})


@pytest.mark.parametrize(
    ("name", "why"),
    [("eth0", "the pod already has an interface 'eth0'"), ("b", "'b' is the interface name of device d1")],
)
def test_a_vrf_named_like_a_link_of_the_pod_is_refused(name: str, why: str) -> None:
    a = nic({"interface": {"name": "a", "vrf": {"name": name}}})
    b = nic({"interface": {"name": "b"}}, "d1", ifname="b")
    with pytest.raises(SettingRefused) as info:
        vrf.Vrf().plan([a, b], NoKernel(), NoKernel(("eth0", "lo")))  # type: ignore[arg-type]
    assert info.value.step == "vrf" and why in info.value.reason


@pytest.mark.root
def test_vrf_is_refused_clearly_where_the_kernel_has_none(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    probe = netns_factory.netns()
    kernel.skip_if(kernel.has_link_kind(probe, "vrf", "table", "10"), "VRF links", "the refusal path cannot be shown")
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    with pytest.raises(HookError) as info:
        node.run({"name": "net1", "addresses": ["10.63.0.5/24"], "vrf": {"name": "vrf-a", "table": 10}})
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


@pytest.mark.root
def test_before_return_releases_the_nic_and_deletes_its_master(netns_factory: NetnsFactory) -> None:
    """The VRF enslave and teardown paths on a real VRF where the kernel has them (the stock-kernel
    tier), else on a bridge standing in for it (enslave and release are ``IFLA_MASTER``, delete
    ``RTM_DELLINK``, whatever the kind). Only what the hooks recorded as created (ifindex and kind)
    is deleted: a record whose index now holds a link of another kind (the pod's own) deletes nothing."""
    pod = netns_factory.netns()
    link, _ = netns_factory.veth(netns=pod, peer_netns=netns_factory.netns())
    kind = "vrf" if kernel.has_link_kind(pod, "vrf", "table", "10") else "bridge"
    extra = ["table", "10"] if kind == "vrf" else []
    if subprocess.run(["ip", "-n", pod, "link", "add", "vrf-a", "type", kind, *extra]).returncode != 0:
        pytest.skip(f"kernel {kernel.release()} has neither VRF nor bridge devices")
    host = HostNetns(Namespaces("/proc/self/ns/net"))
    try:
        with host.ns.pod(f"/run/netns/{pod}") as (rtnl, _):  # enslaved as the configuration batch does
            master, own = rtnl.link("vrf-a"), rtnl.link(link)
            assert master is not None and own is not None
            planned = Nic(
                PreparedClaim("c", "ns", "c"),
                PreparedDevice("nic", "node", "d0", Device("d0")),
                HOST,
                PodLinkConfig(link, master=master.index),
                link=own,
            )
            rtnl.run(vrf.Vrf().requests(planned))
        assert (
            json.loads(
                subprocess.run(["ip", "-j", "-n", pod, "link", "show", link], capture_output=True, text=True).stdout
            )[0]["master"]
            == "vrf-a"
        )
        created = [
            {"kind": kind, "index": master.index, "name": "vrf-a"},
            {"kind": "vrf", "index": own.index, "name": link},  # the index holds a veth now: kept
        ]
        moved = MovedDevice("d0", "eth0", link, pod_index=own.index, records={"vrf": "vrf-a"})
        source = PodNetns(host, f"/run/netns/{pod}", created=created)
        try:
            vrf.Vrf().before_return([moved], source)
        finally:
            source.close()
    finally:
        host.ns.close()
    facts = json.loads(
        subprocess.run(["ip", "-j", "-n", pod, "link", "show", link], capture_output=True, text=True).stdout
    )
    assert "master" not in facts[0]
    assert subprocess.run(["ip", "-n", pod, "link", "show", "vrf-a"], capture_output=True).returncode != 0
    assert subprocess.run(["ip", "-n", pod, "link", "show", link], capture_output=True).returncode == 0


@pytest.mark.root
def test_a_vrf_refused_by_the_kernel_is_named_once_and_nothing_is_recorded(netns_factory: NetnsFactory) -> None:
    """A VRF whose name is taken (here by the pod's own link): one clear message naming the VRF and its
    table once; its record (written before the create) points at nothing, so nothing is ever deleted
    for it; the pod's link untouched."""
    pod = netns_factory.netns()
    netns_factory.veth("vrf-a", netns=pod, peer_netns=pod)
    recorded: list[dict[str, object]] = []
    ns = Namespaces("/proc/self/ns/net")
    try:
        with ns.pod(f"/run/netns/{pod}") as (rtnl, _), pytest.raises(NetnsOpError) as info:
            vrf.create(rtnl, {"vrf-a": ("d0", 10)}, recorded.append)
    finally:
        ns.close()
    # A kernel with VRF refuses the name (EEXIST); one without refuses the kind first (NO_VRF).
    why = "File exists" if kernel.has_link_kind(netns_factory.netns(), "vrf", "table", "10") else vrf.NO_VRF
    assert str(info.value) == f"device d0: vrf create failed: vrf vrf-a table 10: {why}"
    (record,) = recorded
    assert record["kind"] == "vrf" and record["name"] == "vrf-a"
    ns = Namespaces("/proc/self/ns/net")
    try:
        with ns.pod(f"/run/netns/{pod}") as (rtnl, _):
            assert vrf.delete_created(rtnl, "vrf", recorded) == []
    finally:
        ns.close()
    assert subprocess.run(["ip", "-n", pod, "link", "show", "vrf-a"], capture_output=True).returncode == 0


@pytest.mark.root
def test_a_real_vrf_end_to_end_its_table_its_routes_and_the_nic_home_intact(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """A claim's VRF on a kernel that has them (the stock-kernel tier's 6.1): made in the pod on its
    table, the NIC enslaved with its addresses and routes in that table, a neighbor reached through
    it; at the return the NIC leaves it, the VRF is deleted and the NIC is home as it was."""
    node = Node(netns_factory, tmp_path)
    kernel.skip_unless(kernel.has_link_kind(node.pod_ns, "vrf", "table", "10"), "VRF links (the vrf module)")
    before = link_facts(node.nic, node.host)
    route = {"destination": "10.64.0.0/16", "gateway": "10.63.0.1"}
    interface = {"name": "net1", "addresses": ["10.63.0.5/24"], "vrf": {"name": "vrf-a", "table": 10}}
    config = {"interface": interface, "routes": [route]}
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [config]}}])
    node.hooks.run_pod_sandbox(node.pod)
    (dev,) = ipj(node.pod_ns, "-d", "link", "show", "vrf-a")
    assert dev["linkinfo"]["info_kind"] == "vrf" and dev["linkinfo"]["info_data"]["table"] == 10
    (net1,) = ipj(node.pod_ns, "link", "show", "net1")
    assert net1["master"] == "vrf-a"
    table = {(r["dst"], r.get("gateway")) for r in ipj(node.pod_ns, "route", "show", "table", "10")}
    assert ("10.64.0.0/16", "10.63.0.1") in table and ("10.63.0.0/24", None) in table, table
    assert not any(r["dst"] == "10.64.0.0/16" for r in ipj(node.pod_ns, "route", "show")), "not in main"
    # The fabric end answers ARP: the pod reaches it through the VRF.
    subprocess.run(["ip", "-n", node.fabric, "addr", "add", "10.63.0.1/24", "dev", node.peer], check=True)
    ping = ["ip", "netns", "exec", node.pod_ns, "busybox", "ping", "-c1", "-W2", "-I", "vrf-a", "10.63.0.1"]
    assert subprocess.run(ping, capture_output=True).returncode == 0
    node.hooks.stop_pod_sandbox(node.pod)
    assert subprocess.run(["ip", "-n", node.pod_ns, "link", "show", "vrf-a"], capture_output=True).returncode != 0
    assert link_facts(node.nic, node.host) == before
