"""Addresses of sub-interfaces from their NIC's pool: unique, recorded, freed, kept across restarts."""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from pathlib import Path

import pytest

from driver.checkpoint.state import IN_POD, RETURNED, DriverState, MovedDevice, PodNetState
from driver.checkpoint.store import CheckpointStore
from driver.config import parse_sharing_pools
from driver.netlink.sub_interfaces import LEASE, RECORD
from driver.nri.address_pool import LeaseOutside, PoolError, in_use, lease, leases_outside
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from driver.nri.shares import SUB_INTERFACE
from harness.netns import NetnsFactory
from harness.nri import configure_host_nic, link_facts, prepare_claim
from tests.nri.test_sub_interfaces import _links, _pod


def test_the_first_free_address_of_the_pool_with_its_prefix() -> None:
    subnet = parse_sharing_pools("ib0=subnet")  # the NIC's own subnet: a node that is alone on it
    assert subnet == {"ib0": None}
    assert lease("ib0", ["10.1.0.1/24"], {}, subnet) == "10.1.0.2/24"
    assert lease("ib0", ["10.1.0.1/24"], {"10.1.0.2": "x", "10.1.0.3": "y"}, subnet) == "10.1.0.4/24"
    # The admin's pool inside the NIC's subnet: the subnet's prefix (one link with the host).
    pools = parse_sharing_pools("ib0=10.1.0.64/30")
    assert lease("ib0", ["10.1.0.1/24"], {}, pools) == "10.1.0.65/24"
    assert lease("ib0", ["10.1.0.1/24"], {"10.1.0.65": "x"}, pools) == "10.1.0.66/24"
    with pytest.raises(PoolError, match=r"the address pool of ib0 \(10.1.0.64/30\) is exhausted: 2 addresses in use"):
        lease("ib0", ["10.1.0.1/24"], {"10.1.0.65": "x", "10.1.0.66": "y"}, pools)
    # A pool elsewhere: its own prefix.
    assert lease("ib1", [], {}, parse_sharing_pools("ib1=192.0.2.0/28")) == "192.0.2.1/28"
    # An IPv6-only NIC's subnet is its global IPv6 one (its own address skipped); link-local is none.
    assert lease("ib2", ["fe80::1/64", "fd00::1/64"], {}, {"ib2": None}) == "fd00::2/64"
    assert lease("ib2", ["fd00::1/64"], {}, parse_sharing_pools("ib2=fd00::40/122")) == "fd00::41/64"
    with pytest.raises(PoolError, match="ib2 has no IPv4 or global IPv6 address"):
        lease("ib2", ["fe80::1/64"], {}, {"ib2": None})


def test_no_pool_no_lease_and_the_refusal_says_what_to_set() -> None:
    """No default: a subnet spanning nodes, handed out by each, would give one address twice."""
    with pytest.raises(PoolError) as info:
        lease("ib0", ["10.1.0.1/24"], {}, {})
    assert "no address pool for ib0 on this node: annotate the node dra.net/sharing-pools=ib0=<CIDR>" in str(info.value)
    assert "interface.addresses or interface.dhcp" in str(info.value)
    # What the admin will see once they did what it says: no restart, the pod at the kubelet's retry.
    assert "the driver takes it within seconds, without a restart" in str(info.value)
    assert "this pod gets an address of it at the kubelet's next retry" in str(info.value)


def _share(pod: str, parent: str, leased: str, step: str = IN_POD) -> PodNetState:
    """A running pod with one share of ``parent`` holding ``leased`` (its record as the hooks write it)."""
    record = {"kind": "macvlan", "parent": parent, "parentIndex": 7, LEASE: leased}
    device = MovedDevice(device="shared", host_ifname=parent, pod_ifname="net1", step=step, records={RECORD: record})
    return PodNetState(pod_uid=f"uid-{pod}", namespace="ns", name=pod, devices=[device])


def test_a_pool_changed_under_running_shares_never_hands_their_addresses_out() -> None:
    """A lease outside the new range stays its share's; a new range that holds it skips it."""
    state = DriverState(pods={"uid-a": _share("a", "ib0", "10.9.0.2/24"), "uid-b": _share("b", "ib0", "10.9.0.3/24")})
    taken = in_use(state, {})
    # A new range holding a's address (.1, .2): the free one; one holding both (.2, .3): none left.
    assert lease("ib0", [], taken, parse_sharing_pools("ib0=10.9.0.0/30")) == "10.9.0.1/30"
    with pytest.raises(PoolError, match="exhausted: 2 addresses in use"):
        lease("ib0", [], taken, parse_sharing_pools("ib0=10.9.0.2/31"))


def test_leases_outside_the_pools_now_are_named() -> None:
    state = DriverState(
        pods={
            "uid-a": _share("a", "ib0", "10.9.0.2/24"),  # inside the new range
            "uid-b": _share("b", "ib0", "10.8.0.5/24"),  # the range moved away from it
            "uid-c": _share("c", "ib1", "10.7.0.5/24"),  # ib1's pool removed
            "uid-d": _share("d", "ib2", "192.0.2.9/24"),  # a pool of 'subnet': the host's, not judged
            "uid-e": _share("e", "ib0", "10.8.0.6/24", step=RETURNED),  # gone home: no lease held
        }
    )
    pools = parse_sharing_pools("ib0=10.9.0.0/29,ib2=subnet")
    assert leases_outside(state, pools) == [
        LeaseOutside("ns/b", "ib0", "10.8.0.5/24"),
        LeaseOutside("ns/c", "ib1", "10.7.0.5/24"),
    ]
    assert str(leases_outside(state, pools)[0]) == "10.8.0.5/24 of pod ns/b (a share of ib0)"
    assert leases_outside(state, parse_sharing_pools("ib0=10.8.0.0/16,ib1=10.7.0.0/24,ib2=subnet")) == [
        LeaseOutside("ns/a", "ib0", "10.9.0.2/24")
    ]


def test_an_address_answering_on_the_link_is_never_leased() -> None:
    on_the_link = {"10.1.0.65", "10.1.0.66"}
    pools = parse_sharing_pools("ib0=10.1.0.64/29")
    assert lease("ib0", ["10.1.0.1/24"], {}, pools, on_the_link.__contains__) == "10.1.0.67/24"
    with pytest.raises(PoolError, match=r"overlaps addresses in use on its link: 10.1.0.65, 10.1.0.66"):
        lease("ib0", ["10.1.0.1/24"], {}, parse_sharing_pools("ib0=10.1.0.64/30"), on_the_link.__contains__)


@pytest.mark.parametrize(
    ("text", "needle"),
    [("ib0", "expected <interface>=<CIDR>"), ("ib0=10.1.0.1/24", "has host bits set"), ("=10.0.0.0/8", "expected")],
)
def test_bad_pools_name_the_flag(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=f"--sharing-pools: .*{needle}"):
        parse_sharing_pools(text)
    assert parse_sharing_pools("") == {} and parse_sharing_pools("ib0=10.0.0.0/8")["ib0"] == ipaddress.ip_network(
        "10.0.0.0/8"
    )


@pytest.mark.root
def test_shares_without_addresses_get_unique_leases_freed_at_the_end_and_kept_across_a_restart(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, peer = netns_factory.veth()
    sub = netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [])
    before = link_facts(nic)
    state, run = str(tmp_path / "state"), str(tmp_path / "run")
    pools = parse_sharing_pools(f"{nic}=subnet")
    hooks = NRIHooks(CheckpointStore(state, run), host_netns="/proc/self/ns/net", pools=pools)
    pods = []
    for i in range(3):
        pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
        prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": f"s{i}"}])
        pod = _pod(uid, f"/run/netns/{pod_ns}")
        if i == 2:  # a restarted driver: the leases of the running pods are still taken
            hooks = NRIHooks(CheckpointStore(state, run), host_netns="/proc/self/ns/net", pools=pools)
        hooks.run_pod_sandbox(pod)
        pods.append((pod, pod_ns))
    got = []
    for pod, pod_ns in pods:
        [inet] = [a for a in _links(pod_ns)[nic]["addr_info"] if a["family"] == "inet"]
        got.append(f"{inet['local']}/{inet['prefixlen']}")
        [m] = hooks.store.read(lambda s, u=pod.uid: s.pods[u].devices)
        assert m.records[SUB_INTERFACE]["lease"] == got[-1]
    assert got == [sub.cidr(2), sub.cidr(3), sub.cidr(4)]
    assert link_facts(nic) == before
    # The first pod ends: its address is free again, the next pod gets it.
    hooks.stop_pod_sandbox(pods[0][0])
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": "s3"}])
    hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    [inet] = [a for a in _links(pod_ns)[nic]["addr_info"] if a["family"] == "inet"]
    assert inet["local"] == sub.ip(2)


@pytest.mark.root
def test_an_exhausted_pool_refuses_the_pod_naming_it(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic, peer = netns_factory.veth()
    sub = netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [])
    pools = parse_sharing_pools(f"{nic}={sub.ip(64)}/31")
    hooks = NRIHooks(
        CheckpointStore(str(tmp_path / "s"), str(tmp_path / "r")), host_netns="/proc/self/ns/net", pools=pools
    )
    for i in range(3):
        pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
        prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": f"s{i}"}])
        pod = _pod(uid, f"/run/netns/{pod_ns}")
        if i < 2:
            hooks.run_pod_sandbox(pod)
            continue
        with pytest.raises(HookError, match=r"address pool failed: the address pool of .* is exhausted"):
            hooks.run_pod_sandbox(pod)
        assert set(_links(pod_ns)) == {"lo"}


@pytest.mark.root
def test_no_address_in_use_is_leased_or_taken(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """Share A sets an address itself; share B sets none and must not get A's; an address a host on
    the link holds (another node's, answering ARP) is skipped; a share asking for an address this
    node's host holds is refused, naming it and its holder."""
    nic, peer = netns_factory.veth()
    sub = netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [])
    other = netns_factory.netns()  # another node on the rail: the peer's end holds .2
    subprocess.run(["ip", "link", "set", peer, "netns", other], check=True)
    subprocess.run(["ip", "-n", other, "addr", "add", sub.cidr(2), "dev", peer], check=True)
    subprocess.run(["ip", "-n", other, "link", "set", peer, "up"], check=True)
    pools = parse_sharing_pools(f"{nic}=subnet")
    hooks = NRIHooks(
        CheckpointStore(str(tmp_path / "s"), str(tmp_path / "r")), host_netns="/proc/self/ns/net", pools=pools
    )

    def start(uid: str, interface: dict[str, object] | None) -> str:
        pod_ns = netns_factory.netns()
        config = {"opaque": [{"interface": {"name": "net1", **interface}}]} if interface else {}
        prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": uid, "config": config}])
        hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
        [inet] = [a for a in _links(pod_ns)["net1" if interface else nic]["addr_info"] if a["family"] == "inet"]
        return f"{inet['local']}/{inet['prefixlen']}"

    assert start("a", {"addresses": [sub.cidr(3)]}) == sub.cidr(3)
    assert start("b", None) == sub.cidr(4), "not .2 (answers ARP on the link), not .3 (share a's)"
    with pytest.raises(HookError) as info:
        start("c", {"addresses": [sub.cidr(1)]})
    assert f"interface.addresses: {sub.cidr(1)} is in use by the host's {nic}" in str(info.value)
