"""driver.netlink.nic_moves and nic_home on real veth NICs and namespaces (the NIC's addresses and
routes recorded and restored as the hooks do, by the addresses setting).

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
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from driver.checkpoint.state import MovedDevice
from driver.netlink import nic_home, nic_moves
from driver.netlink.kernel_features import MOVE_IFINDEX, detect
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.nic_home import ReturnItem
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import NetnsOpError, Route, Rtnl
from driver.nic_settings import addresses
from harness.netns import NetnsFactory, Subnet
from harness.nri import configure_host_nic, ip, link_facts

pytestmark = [pytest.mark.root, pytest.mark.kernel]
CHOOSE = detect().has(MOVE_IFINDEX)
"""Whether this kernel takes IFLA_NEW_IFINDEX (5.17): the moves here do what the hooks would."""


@pytest.fixture
def ns() -> Iterator[Namespaces]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    n = Namespaces("/proc/self/ns/net")
    try:
        yield n
    finally:
        n.close()


@dataclass(frozen=True)
class HostNic:
    """A host veth (``name``, its ``peer``) on ``sub`` (.1, ::1), with a route via .254 (::fe) to
    ``routed`` in the main table, to ``in_table`` in table 4321, to ``metric`` with metric 99."""

    name: str
    peer: str
    sub: Subnet
    routed: Subnet
    in_table: Subnet
    metric: Subnet


def _host_nic(netns_factory: NetnsFactory) -> HostNic:
    a, pa = netns_factory.veth()
    nic = HostNic(a, pa, *(netns_factory.subnet() for _ in range(4)))
    gateway = nic.sub.ip(254)
    configure_host_nic(
        a,
        pa,
        nic.sub.cidr(1),
        [
            [str(nic.routed.v4), "via", gateway],
            [str(nic.in_table.v4), "via", gateway, "table", "4321"],
            [str(nic.metric.v4), "via", gateway, "metric", "99"],
        ],
        mtu=1450,
    )
    ip("-6", "addr", "add", nic.sub.cidr6(1), "dev", a, "nodad")
    ip("-6", "route", "add", str(nic.routed.v6), "via", nic.sub.ip6(254), "dev", a)
    return nic


def _nic(netns_factory: NetnsFactory) -> tuple[str, str]:
    nic = _host_nic(netns_factory)
    return nic.name, nic.peer


def record(ns: Namespaces, ifname: str) -> LinkState:
    """The NIC as the hooks record it: the link, then its addresses and routes."""
    state = nic_moves.record_links(ns, [ifname])[ifname]
    addresses.record_host(ns.host_rtnl(), [state])
    return state


def item(state: LinkState, pod_ifname: str, **kwargs: object) -> ReturnItem:
    """The return of a recorded NIC, its addresses and routes restored as the hooks do."""
    moved = MovedDevice(
        "nic-a", state.ifname, pod_ifname, records={"addresses": addresses.record(state.addresses, state.routes)}
    )
    restores = lambda index: addresses.Addresses().restore_requests(moved, index)
    return ReturnItem("nic-a", pod_ifname, state, restores=restores, **kwargs)  # type: ignore[arg-type]


def return_one(ns: Namespaces, netns_path: str, returned: ReturnItem) -> str:
    """``return_links`` for one NIC: how it was found; its :class:`NetnsOpError` raised."""
    result = nic_home.return_links(ns, netns_path, [returned], choose_index=CHOOSE)[returned.device]
    if isinstance(result, NetnsOpError):
        raise result
    return result


def configure(rtnl: Rtnl, cfg: PodLinkConfig, link: LinkInfo) -> dict[str, nic_moves.PodLinkResult]:
    """The pod's configuration batch of one NIC (addresses, link up, routes), addresses read back."""
    reqs = addresses.config_requests("nic-a", link.index, cfg.addresses, cfg.routes)
    return nic_moves.configure_pod_links(rtnl, reqs, {"nic-a": (cfg, link)})


def test_record_host_keeps_what_the_kernel_does_not_recreate(ns: Namespaces, netns_factory) -> None:
    nic = _host_nic(netns_factory)
    a, gateway = nic.name, nic.sub.ip(254)
    state = record(ns, a)
    assert (state.ifname, state.mtu) == (a, 1450)
    assert state.mac == link_facts(a)["mac"]
    assert sorted(state.addresses) == [nic.sub.cidr(1), nic.sub.cidr6(1)]  # no fe80:: (link scope)
    got = sorted((r.dst, r.gateway, r.table, r.priority) for r in state.routes if r.family == socket.AF_INET)
    assert got == sorted(
        [
            (str(nic.routed.v4), gateway, 254, None),
            (str(nic.in_table.v4), gateway, 4321, None),
            (str(nic.metric.v4), gateway, 254, 99),
        ]
    )
    v6 = [r for r in state.routes if r.family == socket.AF_INET6]
    assert [(r.dst, r.gateway) for r in v6] == [(str(nic.routed.v6), nic.sub.ip6(254))]  # no proto-kernel prefix routes
    with pytest.raises(KeyError, match="nosuch"):
        nic_moves.record_links(ns, [f"nosuch{secrets.token_hex(2)}"])


def _move(ns: Namespaces, state: LinkState, pod_path: str, cfg: PodLinkConfig) -> tuple[ReturnItem, list]:
    """Move the recorded NIC into the pod as the hook does (to its host ifindex there), configure it;
    its return item and the per-step errors of the move."""
    move = nic_moves.Move("nic-a", state.index or 0, cfg.ifname, state.index or 0, cfg.mtu, cfg.mac)
    returned = item(state, cfg.ifname, pod_index=move.pod_index, identity=state.identity)
    with ns.pod(pod_path) as (pod_rtnl, pod_fd):
        errors = nic_moves.move_links(ns.host_rtnl(), [move], pod_fd, CHOOSE)
        if errors == [None]:
            errors += nic_moves.set_links(pod_rtnl, [move], [])[0]
    return returned, errors


def test_move_configure_return_round_trip(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = record(ns, a)
    assert state.identity is not None and state.identity.kind == "veth" and state.max_mtu
    cfg = PodLinkConfig(
        ifname="eth7",
        mtu=1280,
        mac="02:00:00:00:07:07",
        addresses=["192.168.7.2/24"],
        routes=[Route(dst="172.16.0.0/12", gateway="192.168.7.1")],
    )
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", cfg)
    assert errors == [None, None]
    move = nic_moves.Move("nic-a", state.index or 0, "eth7", state.index or 0, 1280, "02:00:00:00:07:07")
    with ns.pod(f"/run/netns/{pod_ns}") as (pod_rtnl, _):
        links = nic_moves.check_moved([move], {"nic-a": state.identity}, pod_rtnl.links_by_index([move.pod_index]))
        assert links["nic-a"].index == state.index, "the NIC keeps its host ifindex in the pod"
        res = configure(pod_rtnl, cfg, links["nic-a"])
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

    assert return_one(ns, f"/run/netns/{pod_ns}", returned) == "pod"
    assert link_facts(a) == before
    # Idempotent: a second return finds it on the host (at its ifindex) and changes nothing.
    assert return_one(ns, f"/run/netns/{pod_ns}", returned) == "host"
    assert link_facts(a) == before


def test_a_rename_refused_after_the_move_leaves_the_nic_at_its_planned_index(ns: Namespaces, netns_factory) -> None:
    """The kernel applies the namespace change before the rename: a name taken in the pod fails the
    request with the NIC already in the pod under its host name. It is at the ifindex the move asked
    for, and the return finds it there and brings it home whole."""
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    netns_factory.veth("eth0", netns=pod_ns, peer_netns=netns_factory.netns())  # the pod's CNI interface
    before = link_facts(a)
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="eth0"))
    assert errors[0] is not None and "File exists" in errors[0].reason
    assert link_facts(a) is None and link_facts(a, netns=pod_ns) is not None, "moved, not renamed"
    assert return_one(ns, f"/run/netns/{pod_ns}", returned) == "pod"
    assert link_facts(a) == before
    assert link_facts("eth0", netns=pod_ns) is not None, "the pod's own eth0 is untouched"


def test_an_mtu_refused_after_the_move_is_a_second_step(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = record(ns, a)
    returned, errors = _move(
        ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mtu=(state.max_mtu or 0) + 1)
    )
    assert errors[0] is None and errors[1] is not None and errors[1].step == "set link"
    assert link_facts("net1", netns=pod_ns) is not None
    assert return_one(ns, f"/run/netns/{pod_ns}", returned) == "pod"
    assert link_facts(a) == before


def test_a_host_ifindex_taken_while_the_nic_was_away_brings_it_home_at_another(ns: Namespaces, netns_factory) -> None:
    """The return asks for the NIC's own host ifindex first; a link made on the host at that index
    meanwhile makes the kernel refuse it before the move (EBUSY): the NIC comes home whole at a free
    index, and the other link keeps its index."""
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = record(ns, a)
    assert state.index
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mtu=1400))
    assert errors == [None, None]
    squatter = f"sq{secrets.token_hex(3)}"
    ip("link", "add", squatter, "index", str(state.index), "type", "veth", "peer", "name", f"{squatter}p")
    try:
        assert return_one(ns, f"/run/netns/{pod_ns}", returned) == "pod"
        assert link_facts(a) == before
        home = ns.host_rtnl().link(a)
        assert home is not None and home.index != state.index
        squat = ns.host_rtnl().link(squatter)
        assert squat is not None and squat.index == state.index
    finally:
        ip("link", "del", squatter)


def test_a_link_at_the_nics_index_that_is_not_it_is_left_alone(ns: Namespaces, netns_factory) -> None:
    """A pod with NET_ADMIN deletes the NIC (a veth) and makes its own link at the same ifindex, with the
    NIC's pod name and MAC: the return finds it is not the NIC (its peer is in the pod) and touches
    nothing; the NIC is reported missing."""
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mac="02:00:00:00:11:11"))
    assert errors == [None, None]
    with ns.pod(f"/run/netns/{pod_ns}") as (pod_rtnl, _):
        link = pod_rtnl.link("net1")
        assert link is not None
        returned.identity = LinkIdentity.of(link, in_pod=True)  # as the hook records it once the NIC is in
    ip("-n", pod_ns, "link", "del", "net1")
    ip(
        "-n",
        pod_ns,
        "link",
        "add",
        "net1",
        "index",
        str(returned.pod_index),
        "address",
        "02:00:00:00:11:11",
        "type",
        "veth",
        "peer",
        "name",
        "own1",
    )
    with pytest.raises(NetnsOpError) as err:
        return_one(ns, f"/run/netns/{pod_ns}", returned)
    assert err.value.step == "find"
    impostor = link_facts("net1", netns=pod_ns)
    assert impostor is not None and impostor["mac"] == "02:00:00:00:11:11", "the pod's link stays where it is"
    assert link_facts(a) is None


def test_a_veth_whose_peer_moved_into_another_pod_still_comes_home(ns: Namespaces, netns_factory) -> None:
    """A veth pair's two ends claimed by two pods (dranet's PBR and VRF tests): the second pod's
    move takes the peer away from where the first pod saw it. The first NIC is still found at its
    index (its peer is outside the pod) and comes home."""
    a, peer = _nic(netns_factory)
    pod_ns, other_ns = netns_factory.netns(), netns_factory.netns()
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1"))
    assert errors == [None, None]
    with ns.pod(f"/run/netns/{pod_ns}") as (pod_rtnl, _):
        link = pod_rtnl.link("net1")
        assert link is not None
        returned.identity = LinkIdentity.of(link, in_pod=True)
    assert returned.identity.peer is not None
    ip("link", "set", peer, "netns", other_ns)
    return_one(ns, f"/run/netns/{pod_ns}", returned)
    assert link_facts(a) is not None, "home"
    assert link_facts("net1", netns=pod_ns) is None


def test_return_when_pod_netns_is_gone_finds_the_nic_the_kernel_gave_back(ns: Namespaces, netns_factory) -> None:
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mtu=1300))
    assert errors == [None, None]
    # What the kernel does to a physical NIC when its netns dies: back to init_net as devN, at
    # the ifindex it had in the pod.
    dev = f"dev{secrets.randbelow(10**6)}"
    netns_factory.host_links.append(dev)  # cleanup if the test fails before the rename back
    subprocess.run(
        ["ip", "-n", pod_ns, "link", "set", "net1", "netns", f"/proc/{os.getpid()}/ns/net", "name", dev], check=True
    )
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    assert link_facts(dev) is not None

    how = return_one(ns, f"/run/netns/{pod_ns}", returned)
    assert how == "netns-gone"
    assert link_facts(a) == before
    assert link_facts(dev) is None


def test_missing_everywhere_is_a_clear_error(ns: Namespaces, netns_factory) -> None:
    pod_ns = netns_factory.netns()
    state = LinkState(ifname=f"gone{secrets.token_hex(2)}", mtu=1500, mac="02:de:ad:00:00:01", index=1 << 29)
    returned = ReturnItem("nic-x", "net1", state, pod_index=1 << 29, identity=LinkIdentity(kind="veth"))
    with pytest.raises(NetnsOpError) as err:
        return_one(ns, f"/run/netns/{pod_ns}", returned)
    assert err.value.device == "nic-x" and err.value.step == "find" and state.ifname in str(err.value)


def test_a_lost_virtual_nic_is_never_looked_for_by_its_mac(ns: Namespaces, netns_factory) -> None:
    """A claim MAC (or the host MAC) equal to another host link's: that link is never taken for the NIC."""
    a, _ = _nic(netns_factory)
    other, _ = netns_factory.veth()
    other_before = link_facts(other)
    pod_ns = netns_factory.netns()
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mac=other_before["mac"]))
    assert errors == [None, None]
    ip("-n", pod_ns, "link", "del", "net1")  # the NIC is gone (its peer deleted, a VF removed)
    returned.extra_macs = (other_before["mac"],)
    with pytest.raises(NetnsOpError) as err:
        return_one(ns, f"/run/netns/{pod_ns}", returned)
    assert err.value.step == "find"
    assert link_facts(other) == other_before, "a host link with the NIC's MAC is not touched"


def test_regular_file_is_not_a_netns(ns: Namespaces, tmp_path: Path) -> None:
    fake = tmp_path / "netns"
    fake.write_text("")
    with pytest.raises(NetnsGone), ns.pod(str(fake)):
        pass


def test_move_of_missing_link_names_device_and_step(ns: Namespaces, netns_factory) -> None:
    pod_ns = netns_factory.netns()
    with ns.pod(f"/run/netns/{pod_ns}") as (_, fd):
        [err] = nic_moves.move_links(ns.host_rtnl(), [nic_moves.Move("nic-z", 1 << 29, "net1", 1 << 29)], fd)
    assert err is not None and str(err).startswith("device nic-z: move failed")


@pytest.mark.parametrize("cidrs", [["0.0.0.0/0"], ["fd00::5/64", "fd00::5/80"]], ids=["unspecified", "v6-twice"])
def test_an_address_the_kernel_acks_but_does_not_keep_is_an_error_never_a_result(
    ns: Namespaces, netns_factory, cidrs: list[str]
) -> None:
    """Addresses are read back after the configure batch: one the kernel acknowledged without keeping
    (0.0.0.0, an IPv6 address already there at another prefix length) fails the step, so a status
    never lists an address the NIC does not have."""
    pod_ns = netns_factory.netns()
    nic, _ = netns_factory.veth(netns=pod_ns, peer_netns=pod_ns)
    with ns.pod(f"/run/netns/{pod_ns}") as (rtnl, _):
        with pytest.raises(NetnsOpError) as err:
            link = rtnl.link(nic)
            assert link is not None
            configure(rtnl, PodLinkConfig(nic, addresses=cidrs), link)
    assert err.value.step == "configure" and "did not keep" in err.value.reason
    assert cidrs[-1] in err.value.reason


def test_a_record_from_before_identities_is_found_as_it_was_then(ns: Namespaces, netns_factory) -> None:
    """A NIC recorded by an older driver (no ifindexes, no identity; pods.json version 3) is found in
    the pod by its pod name and MAC, as then, and comes home whole."""
    a, _ = _nic(netns_factory)
    pod_ns = netns_factory.netns()
    before = link_facts(a)
    state = record(ns, a)
    returned, errors = _move(ns, state, f"/run/netns/{pod_ns}", PodLinkConfig(ifname="net1", mac="02:00:00:00:22:22"))
    assert errors == [None, None]
    old = item(replace(state, index=None, identity=None), "net1", extra_macs=("02:00:00:00:22:22",))
    assert old.legacy
    assert return_one(ns, f"/run/netns/{pod_ns}", old) == "pod"
    assert link_facts(a) == before
