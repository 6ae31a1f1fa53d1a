"""What a typed config and a host record become in the pod (pure: no kernel), and that claims without
the part-B fields cost the hooks nothing extra."""

from __future__ import annotations

import socket

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.checkpoint.state import PreparedDevice
from driver.model.device import Device
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.pod_rules import Neighbor, Rule
from driver.netlink.rtnl import NetnsOpError, Route
from driver.nri.pod_config import pod_link_config
from driver.nri.pod_extras import PodExtras


def device(params: dict[str, object], name: str = "d0") -> PreparedDevice:
    return PreparedDevice("nic", "node", name, Device(name), decode_config(params, "p"))


MAC = "02:aa:00:00:00:01"
LINK_ROUTE = {"destination": "10.9.0.0/16", "scope": 253}
HOST = LinkState(
    ifname="eth5",
    mtu=1500,
    mac="02:00:00:00:00:05",
    addresses=["10.5.0.2/24"],
    routes=[Route(dst="10.50.0.0/16", gateway="10.5.0.1", table=150, family=socket.AF_INET)],
    rules=[Rule(priority=150, src="10.5.0.0/24", table=150), Rule(priority=151, iifname="eth5", table=151)],
    neighbors=[Neighbor("10.5.0.9", "02:00:00:00:05:09"), Neighbor("10.5.0.1", "02:00:00:00:05:01")],
    index=7,
)


def test_host_rules_follow_renamed_and_claim_neighbors_win() -> None:
    link = pod_link_config(
        device(
            {
                "interface": {"name": "net1"},
                "neighbors": [{"destination": "10.5.0.1", "hardwareAddr": "02:aa:00:00:00:01"}],
            }
        ),
        HOST,
    )
    assert link.rules == [HOST.rules[0], Rule(priority=151, iifname="net1", table=151)]
    assert link.neighbors == [Neighbor("10.5.0.9", "02:00:00:00:05:09"), Neighbor("10.5.0.1", MAC)]


def test_claim_rules_replace_the_hosts() -> None:
    link = pod_link_config(device({"rules": [{"source": "10.5.0.0/24", "table": 9}]}), HOST)
    assert link.rules == [Rule(src="10.5.0.0/24", table=9)]


def test_a_vrf_takes_every_route_and_no_host_rule() -> None:
    link = pod_link_config(device({"interface": {"vrf": {"name": "blue"}}, "routes": []}), HOST)
    assert [r.table for r in link.routes] == [107]  # 100 + the NIC's ifindex
    assert link.rules == []
    link = pod_link_config(
        device(
            {
                "interface": {"vrf": {"name": "blue", "table": 20}},
                "routes": [{"destination": "10.9.0.0/16", "scope": 253}],
            }
        ),
        HOST,
    )
    assert [(r.dst, r.table) for r in link.routes] == [("10.9.0.0/16", 20)]


def test_dhcp_copies_no_host_address() -> None:
    link = pod_link_config(device({"interface": {"dhcp": True}}), HOST)
    assert link.addresses == [] and link.routes == [] and link.rules == []


class NoKernel:
    """A Namespaces stand-in that fails the test when anything reaches for the kernel."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} used for a claim without part-B fields")


def test_claims_without_the_new_fields_cost_nothing() -> None:
    extras = PodExtras(NoKernel())  # type: ignore[arg-type]
    plain = device(
        {"interface": {"name": "net1", "mtu": 9000}, "routes": [{"destination": "10.0.0.0/8", "scope": 253}]}
    )
    assert extras.plan([(plain, HOST)]) == {}
    assert extras.move_attrs(plain) == b""
    extras.after_configure(-1, [(plain, "net1")])  # no sysctl: no setns
    extras.before_return("/nonexistent", [])


def test_one_vrf_two_tables_in_a_pod_is_refused_before_the_kernel() -> None:
    a = device({"interface": {"name": "a", "vrf": {"name": "v", "table": 10}}})
    b = PreparedDevice(
        "nic", "node", "d1", Device("d1"), decode_config({"interface": {"vrf": {"name": "v", "table": 11}}}, "p")
    )
    configs = {"d0": PodLinkConfig("a"), "d1": PodLinkConfig("b")}
    with pytest.raises(NetnsOpError) as info:
        PodExtras(NoKernel()).in_pod(NoKernel(), -1, [(a, HOST), (b, HOST)], configs)  # type: ignore[arg-type]
    assert info.value.step == "vrf create" and "table 11 here, 10 for device d0" in info.value.reason


def test_nics_sharing_a_vrf_share_its_table() -> None:
    from driver.nri.pod_extras import pod_vrfs

    first = device({"interface": {"name": "a", "vrf": {"name": "v"}}})
    second = PreparedDevice(
        "nic", "node", "d1", Device("d1"), decode_config({"interface": {"vrf": {"name": "v"}}}, "p")
    )
    other_host = LinkState("eth6", 1500, "02:00:00:00:00:06", index=9)
    assert pod_vrfs([(first, HOST), (second, other_host)]) == {"v": ("d0", 107)}
    pinned = PreparedDevice(
        "nic", "node", "d2", Device("d2"), decode_config({"interface": {"vrf": {"name": "v", "table": 30}}}, "p")
    )
    assert pod_vrfs([(first, HOST), (pinned, other_host)]) == {"v": ("d0", 30)}
