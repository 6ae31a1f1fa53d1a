"""Addresses of sub-interfaces from their NIC's pool: unique, recorded, freed, kept across restarts."""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.config import parse_sharing_pools
from driver.nri.address_pool import PoolError, lease
from driver.nri.hooks import SUB_INTERFACE, HookError, NRIHooks
from harness.netns import NetnsFactory
from harness.nri import configure_host_nic, link_facts, prepare_claim
from tests.nri.test_sub_interfaces import _links, _pod


def test_the_first_free_address_of_the_subnet_with_its_prefix() -> None:
    assert lease("ib0", ["10.1.0.1/24"], set(), {}) == "10.1.0.2/24"
    assert lease("ib0", ["10.1.0.1/24"], {"10.1.0.2", "10.1.0.3"}, {}) == "10.1.0.4/24"
    # The admin's pool inside the NIC's subnet: the subnet's prefix (one link with the host).
    pools = parse_sharing_pools("ib0=10.1.0.64/30")
    assert lease("ib0", ["10.1.0.1/24"], set(), pools) == "10.1.0.65/24"
    assert lease("ib0", ["10.1.0.1/24"], {"10.1.0.65"}, pools) == "10.1.0.66/24"
    with pytest.raises(PoolError, match=r"the address pool of ib0 \(10.1.0.64/30\) is exhausted: 2 leases"):
        lease("ib0", ["10.1.0.1/24"], {"10.1.0.65", "10.1.0.66"}, pools)
    # A pool elsewhere: its own prefix.
    assert lease("ib1", [], set(), parse_sharing_pools("ib1=192.0.2.0/28")) == "192.0.2.1/28"
    with pytest.raises(PoolError, match="ib2 has no IPv4 address"):
        lease("ib2", ["fd00::1/64"], set(), {})


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
    configure_host_nic(nic, peer, "192.168.219.1/24", [])
    before = link_facts(nic)
    state, run = str(tmp_path / "state"), str(tmp_path / "run")
    hooks = NRIHooks(CheckpointStore(state, run), host_netns="/proc/self/ns/net")
    pods = []
    for i in range(3):
        pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
        prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": f"s{i}"}])
        pod = _pod(uid, f"/run/netns/{pod_ns}")
        if i == 2:  # a restarted driver: the leases of the running pods are still taken
            hooks = NRIHooks(CheckpointStore(state, run), host_netns="/proc/self/ns/net")
        hooks.run_pod_sandbox(pod)
        pods.append((pod, pod_ns))
    got = []
    for pod, pod_ns in pods:
        [inet] = [a for a in _links(pod_ns)[nic]["addr_info"] if a["family"] == "inet"]
        got.append(f"{inet['local']}/{inet['prefixlen']}")
        [m] = hooks.store.read(lambda s, u=pod.uid: s.pods[u].devices)
        assert m.records[SUB_INTERFACE]["lease"] == got[-1]
    assert got == ["192.168.219.2/24", "192.168.219.3/24", "192.168.219.4/24"]
    assert link_facts(nic) == before
    # The first pod ends: its address is free again, the next pod gets it.
    hooks.stop_pod_sandbox(pods[0][0])
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    prepare_claim(hooks.store, uid, [{"ifname": nic, "device": "shared", "share_id": "s3"}])
    hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    [inet] = [a for a in _links(pod_ns)[nic]["addr_info"] if a["family"] == "inet"]
    assert inet["local"] == "192.168.219.2"


@pytest.mark.root
def test_an_exhausted_pool_refuses_the_pod_naming_it(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, "192.168.220.1/24", [])
    pools = parse_sharing_pools(f"{nic}=192.168.220.64/31")
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
        with pytest.raises(HookError, match=r"address pool failed: the address pool of .* is exhausted: 2 leases"):
            hooks.run_pod_sandbox(pod)
        assert set(_links(pod_ns)) == {"lo"}
