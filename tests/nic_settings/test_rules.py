"""Policy-routing rules: what a config and the host's rules become in the pod (pure), and rules (with
neighbors, which go in the same batch) through the real hooks (real namespaces and veths).

The "host" is a throwaway network namespace (``NRIHooks(host_netns=...)``), so the host rules the
tests add never touch the machine's own rule table.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.merge import merge_under_cloud
from driver.checkpoint.state import DriverState
from driver.nic_settings.rules import Rule, pod_rules
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.support.hook_node import Node, ipj, neighbors, rules, sh

pytestmark = pytest.mark.kernel

HOST_RULES = [Rule(priority=150, src="10.5.0.0/24", table=150), Rule(priority=151, iifname="eth5", table=151)]


def _pod_rules(params: dict[str, object], vrf: bool = False, tables: tuple[int, ...] = ()) -> list[Rule]:
    return pod_rules(decode_config(params, "p"), None, "eth5", "net1", HOST_RULES, vrf, tables)


def test_host_rules_follow_the_renamed_nic() -> None:
    assert _pod_rules({"interface": {"name": "net1"}}) == [HOST_RULES[0], Rule(priority=151, iifname="net1", table=151)]


def test_claim_rules_replace_the_hosts() -> None:
    assert _pod_rules({"rules": [{"source": "10.5.0.0/24", "table": 9}]}) == [Rule(src="10.5.0.0/24", table=9)]


def test_no_host_rule_with_a_vrf_dhcp_or_claim_addresses_but_those_of_its_policy_tables() -> None:
    """As dranet: the rules looking up a table the NIC has routes in come along whatever the claim sets."""
    assert _pod_rules({"interface": {"vrf": {"name": "blue"}}}, vrf=True, tables=(150,)) == []
    assert _pod_rules({"interface": {"dhcp": True}}) == []
    assert _pod_rules({"interface": {"addresses": ["192.0.2.5/24"]}}) == []
    assert _pod_rules({"interface": {"addresses": ["192.0.2.5/24"]}}, tables=(150,)) == [HOST_RULES[0]]
    claim = {"rules": [{"source": "10.5.0.0/24", "table": 9}]}
    assert _pod_rules(claim, tables=(151,)) == [
        Rule(priority=151, iifname="net1", table=151),
        Rule(src="10.5.0.0/24", table=9),
    ]


@pytest.mark.root
def test_claim_rules_and_neighbors_are_added_in_the_pod(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    params = {
        "interface": {"name": "net1", "addresses": ["10.62.0.5/24", "fd62::5/64"]},
        "routes": [{"destination": "10.70.0.0/16", "gateway": "10.62.0.1", "table": 170}],
        "rules": [
            {"priority": 170, "source": "10.62.0.0/24", "table": 170},
            {"priority": 171, "destination": "10.71.0.0/16", "table": 170},
            {"priority": 172, "source": "fd62::/64", "table": 172},
        ],
        "neighbors": [
            {"destination": "10.62.0.1", "hardwareAddr": "02:00:00:00:62:01"},
            {"destination": "fd62::1", "hardwareAddr": "02:00:00:00:62:02"},
        ],
    }
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    assert rules(node.pod_ns) == [
        (170, "10.62.0.0/24", None, None, None, "170"),
        (171, None, "10.71.0.0/16", None, None, "170"),
    ]
    assert [r[:2] for r in rules(node.pod_ns, "-6")] == [(172, "fd62::/64")]
    assert ("10.62.0.1", "02:00:00:00:62:01", ["PERMANENT"]) in neighbors(node.pod_ns, "net1")
    assert ("fd62::1", "02:00:00:00:62:02", ["PERMANENT"]) in neighbors(node.pod_ns, "net1")
    assert ipj(node.pod_ns, "route", "show", "table", "170")[0]["dst"] == "10.70.0.0/16"
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) is not None
    assert rules(node.host) == [], "claim rules live in the pod only"


@pytest.mark.root
def test_host_rules_and_neighbors_of_the_nic_go_along_and_come_back(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "route", "add", "10.80.0.0/16", "via", "10.61.0.1", "dev", node.nic, "table", "180")
    sh(node.host, "rule", "add", "from", "10.61.0.0/24", "table", "180", "priority", "180")
    sh(node.host, "rule", "add", "iif", node.nic, "table", "181", "priority", "181")
    sh(node.host, "rule", "add", "from", "10.99.0.0/24", "table", "182", "priority", "182")  # another NIC's
    sh(node.host, "neigh", "add", "10.61.0.9", "lladdr", "02:00:00:00:61:09", "dev", node.nic, "nud", "permanent")
    host_rules = rules(node.host)
    before = link_facts(node.nic, node.host)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [{"interface": {"name": "eth9"}}]}}])
    node.hooks.run_pod_sandbox(node.pod)
    assert rules(node.pod_ns) == [
        (180, "10.61.0.0/24", None, None, None, "180"),
        (181, None, None, "eth9", None, "181"),
    ]
    assert neighbors(node.pod_ns, "eth9") == [("10.61.0.9", "02:00:00:00:61:09", ["PERMANENT"])]
    assert ipj(node.pod_ns, "route", "show", "table", "180")[0]["dst"] == "10.80.0.0/16"
    assert len(node.record("rules")) == 2
    assert node.record("neighbors") == [{"dst": "10.61.0.9", "lladdr": "02:00:00:00:61:09"}]
    sh(node.host, "rule", "del", "priority", "180")  # something removed it meanwhile: the return puts it back
    node.hooks.stop_pod_sandbox(node.pod)
    assert rules(node.host) == host_rules
    assert neighbors(node.host, node.nic) == [("10.61.0.9", "02:00:00:00:61:09", ["PERMANENT"])]
    assert link_facts(node.nic, node.host) == before


@pytest.mark.root
def test_routes_and_rules_of_other_tables_are_copied_with_claim_addresses(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """dranet's e2e "route rules and routes with non-default table are copied": the NIC's routes of a
    table other than main and the rules that use it reach the pod although the claim sets its own
    address, and nothing of them is left behind or lost on the host."""
    node = Node(netns_factory, tmp_path)
    sh(node.host, "route", "add", "10.90.0.0/16", "via", "10.61.0.1", "dev", node.nic, "table", "100")
    sh(node.host, "route", "add", "10.91.0.0/16", "dev", node.nic, "table", "100")
    sh(node.host, "rule", "add", "from", "10.61.0.2", "table", "100", "priority", "100")
    sh(node.host, "rule", "add", "fwmark", "7", "table", "100", "priority", "101")  # not one a NIC owns
    host_rules = rules(node.host)
    before = link_facts(node.nic, node.host)
    params = {"interface": {"name": "net1", "addresses": ["10.92.0.5/24"]}}
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    # The gateway 10.61.0.1 is not reachable from the claim's address: that route is left out.
    assert [r["dst"] for r in ipj(node.pod_ns, "route", "show", "table", "100")] == ["10.91.0.0/16"]
    assert rules(node.pod_ns) == [(100, "10.61.0.2", None, None, None, "100")]
    node.hooks.stop_pod_sandbox(node.pod)
    assert rules(node.host) == host_rules
    assert sorted(r["dst"] for r in ipj(node.host, "route", "show", "table", "100")) == ["10.90.0.0/16", "10.91.0.0/16"]
    assert link_facts(node.nic, node.host) == before


@pytest.mark.root
def test_cloud_provider_rules_are_applied(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """Azure's per-NIC rule (``from <subnet> lookup 100+i``) and table route, stored at prepare."""
    node = Node(netns_factory, tmp_path)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic}])
    cloud = decode_config(
        {
            "routes": [{"destination": "0.0.0.0/0", "gateway": "10.61.0.1", "table": 101}],
            "rules": [{"source": "10.61.0.0/24", "table": 101}],
        },
        "cloud",
    )

    def with_cloud(s: DriverState) -> None:
        (claim,) = s.claims.values()
        dev = claim.devices[0]
        dev.cloud_config, dev.config = cloud, merge_under_cloud(cloud, dev.config)

    node.store.update(with_cloud)
    node.hooks.run_pod_sandbox(node.pod)
    (rule,) = rules(node.pod_ns)
    assert rule[1:] == ("10.61.0.0/24", None, None, None, "101")
    assert ipj(node.pod_ns, "route", "show", "table", "101")[0]["gateway"] == "10.61.0.1"
    node.hooks.stop_pod_sandbox(node.pod)


@pytest.mark.root
def test_the_multi_rail_example_applied(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """examples/claim-config/multi-rail-policy-routing.yaml on two veths (the configs merged per
    request as prepare merges them)."""
    import yaml

    node = Node(netns_factory, tmp_path)
    fabric = netns_factory.netns()
    second, peer = netns_factory.veth(netns=node.host, peer_netns=fabric)
    sh(fabric, "link", "set", peer, "up")
    example = Path(__file__).resolve().parents[2] / "examples/claim-config/multi-rail-policy-routing.yaml"
    configs = yaml.safe_load(example.read_text())["spec"]["spec"]["devices"]["config"]

    def params(request: str) -> list[Any]:
        return [c["opaque"]["parameters"] for c in configs if request in c["requests"]]

    prepare_claim(
        node.store,
        node.uid,
        [
            {"ifname": node.nic, "config": {"opaque": params("rail0")}},
            {"ifname": second, "config": {"opaque": params("rail1")}},
        ],
    )
    node.hooks.run_pod_sandbox(node.pod)
    assert rules(node.pod_ns) == [
        (200, "10.200.0.5", None, None, None, "200"),  # ip -j shows a /32 without its length
        (201, "10.200.0.6", None, None, None, "201"),
    ]
    for rail, table in (("rail0", "200"), ("rail1", "201")):
        assert neighbors(node.pod_ns, rail) == [("10.200.0.1", "02:00:0a:c8:00:01", ["PERMANENT"])]
        assert ipj(node.pod_ns, "route", "show", "table", table)[0]["dev"] == rail
        out = subprocess.run(
            ["ip", "netns", "exec", node.pod_ns, "cat", f"/proc/sys/net/ipv4/conf/{rail}/arp_announce"],
            capture_output=True,
            text=True,
        )
        assert out.stdout.strip() == "2"
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(second, node.host) is not None and link_facts(node.nic, node.host) is not None
