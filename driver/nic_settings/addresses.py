"""A prepared NIC's typed claim config turned into what the netlink layer sets in the pod.

Pure functions, no I/O: :func:`pod_link_config` combines the config prepare stored (the cloud
provider's merged under the claim's) with the NIC's host record (:class:`LinkState`): name, MTU,
MAC, addresses, routes, rules and neighbors, and the VRF's table for every route when the NIC
goes into a VRF.
"""

from __future__ import annotations

import socket
from dataclasses import replace

from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig, RouteConfig
from driver.checkpoint.state import PreparedDevice
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.pod_rules import Neighbor, Rule, config_rule
from driver.netlink.rtnl import Route

MAIN_TABLE = 254  # claim config table 0 means the main table
VRF_TABLE_BASE = 100  # a VRF without a table gets 100 + the NIC's ifindex (dranet's default)


def config_route(cfg: RouteConfig) -> Route:
    """A validated claim-config route as the netlink layer's :class:`Route`."""
    # Validated at prepare: a ':' is enough to tell the family (no parse on the pod's path).
    version = 6 if ":" in cfg.destination else 4
    return Route(
        dst=cfg.destination,
        gateway=cfg.gateway,
        prefsrc=cfg.source,
        table=cfg.table or MAIN_TABLE,
        scope=cfg.scope,
        family=socket.AF_INET6 if version == 6 else socket.AF_INET,
    )


def vrf_table(iface: InterfaceConfig, host: LinkState) -> int | None:
    """The routing table of the NIC's VRF (None: no VRF)."""
    if iface.vrf is None:
        return None
    return iface.vrf.table or VRF_TABLE_BASE + (host.index or 0)


def _host_rule_in_pod(rule: Rule, host_name: str, pod_name: str) -> Rule:
    """A host rule naming the NIC (iif/oif) names it as the pod knows it."""
    return replace(
        rule,
        iifname=pod_name if rule.iifname == host_name else rule.iifname,
        oifname=pod_name if rule.oifname == host_name else rule.oifname,
    )


def pod_link_config(device: PreparedDevice, host: LinkState) -> PodLinkConfig:
    """The claim config of ``device`` applied to its host state.

    No addresses configured: the host's addresses (and, without routes from the claim, its
    routes; without rules from the claim, its rules) are copied into the pod, as the Go driver
    does for routes; the cloud provider's routes and rules (``device.cloud_config``, already in
    ``config``) are added either way. The host's permanent neighbors are copied unless the
    claim sets a neighbor for the same IP. With a VRF every route goes into the VRF's table
    and no host rule is copied (the VRF's table decides the lookup).
    """
    cfg = device.config  # decoded and validated at prepare time (cloud config merged under it)
    iface = cfg.interface or InterfaceConfig()
    name = iface.name or host.ifname
    addresses = list(iface.addresses or ())
    routes = [config_route(r) for r in cfg.routes or ()]
    rules = [config_rule(r.priority, r.source, r.destination, r.table) for r in cfg.rules or ()]
    cloud = device.cloud_config or NetworkConfig()
    table = vrf_table(iface, host)
    if not addresses and not iface.dhcp:  # with DHCP the lease decides
        addresses = list(host.addresses)
        if all(r in set(cloud.routes or ()) for r in cfg.routes or ()):  # the claim set no route: keep the host's
            keys = {(r.dst, r.table) for r in routes}
            routes = [r for r in host.routes if (r.dst, r.table) not in keys] + routes
        if table is None and all(r in set(cloud.rules or ()) for r in cfg.rules or ()):
            rules = [_host_rule_in_pod(r, host.ifname, name) for r in host.rules if r not in rules] + rules
    if table is not None:
        routes = [replace(r, table=table) for r in routes]
    claimed = {n.destination: Neighbor(n.destination, n.hardware_addr) for n in cfg.neighbors or ()}
    neighbors = [n for n in host.neighbors if n.dst not in claimed] + list(claimed.values())
    return PodLinkConfig(
        ifname=name,
        mtu=iface.mtu,
        mac=iface.hardware_addr,
        addresses=addresses,
        routes=routes,
        rules=rules,
        neighbors=neighbors,
    )
