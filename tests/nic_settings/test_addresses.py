"""Addresses, the link up and routes: what a typed config and the host's record become in the pod
(pure: no kernel), and the requests in the order the kernel needs them."""

from __future__ import annotations

import errno
import socket

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.checkpoint.state import MovedDevice, PreparedClaim, PreparedDevice
from driver.model.device import Device
from driver.netlink.link_info import LinkInfo
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import Route
from driver.nic_settings import addresses
from driver.nic_settings.setting import Nic, SettingRefused

pytestmark = pytest.mark.kernel

HOST_ROUTE = Route(dst="10.50.0.0/16", gateway="10.5.0.1", table=150, family=socket.AF_INET)
MAIN_ROUTE = Route(dst="10.60.0.0/16", gateway="10.5.0.1", family=socket.AF_INET)


def host() -> LinkState:
    return LinkState(
        ifname="eth5",
        mtu=1500,
        mac="02:00:00:00:00:05",
        addresses=["10.5.0.2/24", "fd05::2/64"],
        routes=[HOST_ROUTE, MAIN_ROUTE],
        index=7,
    )


def nic(params: dict[str, object], mtu: int | None = None, table: int | None = None) -> Nic:
    device = PreparedDevice("nic", "node", "d0", Device("d0"), decode_config(params, "p"))
    return Nic(PreparedClaim("c", "ns", "c"), device, host(), PodLinkConfig("net1", mtu=mtu, table=table))


def test_without_addresses_the_nic_keeps_the_hosts_and_its_routes() -> None:
    planned = nic({"interface": {"name": "net1"}})
    addresses.plan_pod(planned)
    assert planned.pod.addresses == ["10.5.0.2/24", "fd05::2/64"]
    assert planned.pod.routes == [HOST_ROUTE, MAIN_ROUTE]
    assert planned.records == {
        "addresses": {
            "addresses": ["10.5.0.2/24", "fd05::2/64"],
            "routes": [HOST_ROUTE.to_dict(), MAIN_ROUTE.to_dict()],
        }
    }


def test_claim_routes_and_addresses_replace_the_hosts_main_table_but_policy_tables_come_along() -> None:
    """As dranet: the NIC's routes of tables other than main come with it whatever the claim sets;
    the claim's addresses or routes replace the rest. A carried route the claim's addresses cannot
    reach is left out by the kernel's answer, not an error."""
    routed = nic({"routes": [{"destination": "10.9.0.0/16", "scope": 253}]})
    addresses.plan_pod(routed)
    assert routed.pod.addresses == ["10.5.0.2/24", "fd05::2/64"]
    assert [(r.dst, r.scope, r.table) for r in routed.pod.routes] == [
        ("10.50.0.0/16", 0, 150),
        ("10.9.0.0/16", 253, 254),
    ]
    addressed = nic({"interface": {"addresses": ["192.0.2.5/24"]}})
    addresses.plan_pod(addressed)
    assert addressed.pod.addresses == ["192.0.2.5/24"] and addressed.pod.routes == [HOST_ROUTE]
    reqs = addresses.Addresses().requests(addressed)
    (carried,) = [r for r in reqs if "10.50.0.0/16" in r.what]
    assert errno.ENETUNREACH in carried.ignore
    same_dst = nic({"routes": [{"destination": "10.50.0.0/16", "gateway": "10.5.0.9", "table": 150}]})
    addresses.plan_pod(same_dst)
    assert [(r.dst, r.gateway, r.table) for r in same_dst.pod.routes] == [("10.50.0.0/16", "10.5.0.9", 150)]


def test_dhcp_copies_no_host_address() -> None:
    planned = nic({"interface": {"dhcp": True}})
    addresses.plan_pod(planned)
    assert planned.pod.addresses == [] and planned.pod.routes == [HOST_ROUTE]
    assert planned.records["addresses"]["addresses"] == ["10.5.0.2/24", "fd05::2/64"], "given back all the same"


def test_a_vrf_takes_every_route() -> None:
    planned = nic(
        {"interface": {"vrf": {"name": "blue"}}, "routes": [{"destination": "10.9.0.0/16", "scope": 253}]}, table=20
    )
    addresses.plan_pod(planned)
    assert [(r.dst, r.table) for r in planned.pod.routes] == [("10.9.0.0/16", 20)]


def test_an_mtu_below_the_ipv6_minimum_with_ipv6_addresses_is_refused() -> None:
    with pytest.raises(SettingRefused) as info:
        addresses.plan_pod(nic({"interface": {"mtu": 1200}}, mtu=1200))  # the host's fd05::2, copied
    assert (
        info.value.step == "mtu" and "1200 is below 1280, the IPv6 minimum, and it gets fd05::2/64" in info.value.reason
    )
    addresses.plan_pod(nic({"interface": {"mtu": 1200, "addresses": ["192.0.2.5/24"]}}, mtu=1200))  # IPv4 only: fine


def test_addresses_then_the_link_up_then_link_scope_routes_first() -> None:
    planned = nic(
        {
            "interface": {"addresses": ["192.0.2.5/24"]},
            "routes": [
                {"destination": "10.1.0.0/16", "gateway": "192.0.2.1"},
                {"destination": "192.0.3.0/24", "scope": 253},
            ],
        }
    )
    addresses.plan_pod(planned)
    planned.link = LinkInfo(index=12, ifname="net1", mtu=1500, mac="02:00:00:00:00:05")
    steps = [(r.step, r.what) for r in addresses.Addresses().requests(planned)]
    assert steps == [
        ("address", "192.0.2.5/24"),
        ("link-up", "up=True"),
        ("route", "192.0.3.0/24 via - table 254"),
        ("route", "10.50.0.0/16 via 10.5.0.1 table 150"),  # the host's policy table, carried
        ("route", "10.1.0.0/16 via 192.0.2.1 table 254"),
    ]


def test_the_return_gives_the_host_its_addresses_and_routes_and_always_the_link_up() -> None:
    planned = nic({})
    addresses.plan_pod(planned)
    moved = MovedDevice("d0", "eth5", "net1", records=planned.records)
    steps = [(r.step, r.device) for r in addresses.Addresses().restore_requests(moved, 7)]
    assert steps == [("address", "d0"), ("address", "d0"), ("link-up", "d0"), ("route", "d0"), ("route", "d0")]
    bare = MovedDevice("d0", "eth5", "net1")
    assert [r.step for r in addresses.Addresses().restore_requests(bare, 7)] == ["link-up"]
