"""A lease's option-121 routes as the hooks add them: main table, or the VRF's table of the NIC."""

from __future__ import annotations

import socket

from driver.api.v1alpha1.network_config import InterfaceConfig, VrfConfig
from driver.dhcp.wire import Lease
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import Route
from driver.nri.pod_config import vrf_table
from driver.nri.pod_dhcp import lease_routes

LEASE = Lease(
    address="10.77.4.11/24",
    server_id="10.77.4.1",
    client_mac="02:00:00:00:00:01",
    routes=(("10.204.0.0/16", "10.77.4.1"), ("10.205.0.9/32", None)),
)


def test_lease_routes_go_to_the_main_table_or_the_vrfs() -> None:
    assert lease_routes(LEASE) == [
        Route(dst="10.204.0.0/16", gateway="10.77.4.1", table=254, family=socket.AF_INET),
        Route(dst="10.205.0.9/32", gateway=None, scope=253, table=254, family=socket.AF_INET),
    ]
    host = LinkState(ifname="eth1", mtu=1500, mac="02:00:00:00:00:01", addresses=[], routes=[], index=7)
    table = vrf_table(InterfaceConfig(vrf=VrfConfig(name="blue")), host)
    assert table is not None and {r.table for r in lease_routes(LEASE, table)} == {table}
