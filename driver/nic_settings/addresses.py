"""Addresses, the link up, and routes: the NIC's IP configuration in the pod, and the host's back.

A claim's ``interface.addresses`` and ``routes`` (a cloud provider's routes merged under them at
prepare). Without addresses (and without DHCP, whose lease decides) the NIC keeps what the host
had: its global addresses are copied into the pod, and, when the claim sets no route of its own,
its host routes too (as the Go driver does); a cloud provider's routes are added either way. Its
host routes of tables other than main (policy routing, :func:`policy_tables`) come along whatever
the claim sets, as the Go driver's do; one whose gateway the claim's addresses cannot reach is left
out. With a VRF every route goes into the VRF's table (:mod:`driver.nic_settings.vrf` plans it
first) and no policy table comes along.

On the host before the move, every NIC's global addresses (one dump for all of them) and routes
(one dump per NIC, which the kernel filters to it: a host with a large routing table costs no more)
are recorded; routes the kernel makes by itself, non-unicast, multipath and local-table routes are
not. In the pod's configuration batch the NIC gets its addresses, then the link up, then its routes
(link-scope first, so gateways resolve); the hook reads the addresses back, so the claim's status
never lists one the kernel did not keep. Every NIC comes up, in the pod and back home (the Go
driver sets it up on return too), where its host addresses and routes are added again.

The MTU a NIC gets must carry IPv6 when it gets an IPv6 address (1280 at least): a pod asking for
less is refused here, before anything moves.

IPv6 addresses the NIC held on the host (carried into the pod, or back home) skip duplicate address
detection: the link already checked them. New ones (the claim's, a share's lease) are detected
optimistically (RFC 4429): the link's ``optimistic_dad`` is set in the pod first
(:mod:`driver.nic_settings.sysctls`), so the address can be bound at once, and the hook does not
wait for the outcome; :mod:`driver.nri.dad_watch` follows it (an address found in use keeps the
pod's containers from starting, and the claim says why). What is still tentative when the NICs are
configured is left in ``PodNetns.tentative`` for it.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Container, Sequence
from dataclasses import replace
from typing import Any

from driver.api.v1alpha1.decode_interface import IPV6_MIN_MTU
from driver.api.v1alpha1.network_config import NetworkConfig, RouteConfig
from driver.checkpoint.state import MovedDevice
from driver.netlink.channel import RT_TABLE_MAIN, RTA_OIF, RTM_GETROUTE, RTMSG, attr
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import (
    IFA_F_DADFAILED,
    IFA_F_OPTIMISTIC,
    IFA_F_TENTATIVE,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_DEFAULT,
    RT_TABLE_LOCAL,
    NetnsOpError,
    Request,
    Route,
    Rtnl,
    canonical_cidr,
    dump_addresses,
    ipv6_address_states,
    newaddr,
    newlink,
    newroute,
    restorable_route,
)
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused


def config_route(cfg: RouteConfig) -> Route:
    """A validated claim-config route as the netlink layer's :class:`Route`."""
    # Validated at prepare: a ':' is enough to tell the family (no parse on the pod's path).
    version = 6 if ":" in cfg.destination else 4
    return Route(
        dst=cfg.destination,
        gateway=cfg.gateway,
        prefsrc=cfg.source,
        table=cfg.table or RT_TABLE_MAIN,  # claim config table 0 means the main table
        scope=cfg.scope,
        family=socket.AF_INET6 if version == 6 else socket.AF_INET,
    )


def new_ipv6(nic: Nic) -> list[str]:
    """The IPv6 addresses the NIC gets in the pod that its link did not hold on the host (they go
    through duplicate address detection)."""
    return [a for a in nic.pod.addresses if ":" in a and a not in nic.host.addresses]


def keeps_host_addresses(config: NetworkConfig) -> bool:
    """Whether the NIC keeps its host addresses in the pod: the claim sets none and no DHCP."""
    iface = config.interface
    return iface is None or (not iface.addresses and not iface.dhcp)


def record(addresses: Sequence[str], routes: Sequence[Route] = ()) -> dict[str, Any] | None:
    """The record of a NIC's host addresses and routes (None: nothing to give back)."""
    if not addresses and not routes:
        return None
    return {"addresses": list(addresses), "routes": [r.to_dict() for r in routes]}


def record_host(rtnl: Rtnl, hosts: Sequence[LinkState]) -> None:
    """Fill in each NIC's host addresses (global scope) and restorable routes: one address dump,
    then per NIC one route dump the kernel filters to it (one full dump without strict checking,
    kernels < 4.20)."""
    by_index = {h.index: h for h in hosts if h.index}
    for index, cidr in dump_addresses(rtnl, RT_SCOPE_UNIVERSE):
        if index in by_index:
            by_index[index].addresses.append(cidr)
    for index in list(by_index) if rtnl.strict() else [0]:
        oif = attr(RTA_OIF, struct.pack("=i", index)) if index else b""
        for payload in rtnl.dump(RTM_GETROUTE, RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0) + oif):
            found = restorable_route(payload, by_index)
            if found is not None:
                by_index[found[0]].routes.append(found[1])


def policy_tables(routes: Sequence[Route]) -> set[int]:
    """The routing tables of ``routes`` other than main (and local/default, which every netns has):
    a NIC's policy routing, carried into the pod as dranet does, with the rules that use them."""
    return {r.table for r in routes if r.table not in (RT_TABLE_MAIN, RT_TABLE_DEFAULT, RT_TABLE_LOCAL)}


def pod_addresses(
    config: NetworkConfig, cloud: NetworkConfig | None, host: LinkState, policy: bool = True
) -> tuple[list[str], list[Route]]:
    """The addresses and routes the NIC gets in the pod (before a VRF's table is applied).

    ``cloud``: the cloud provider's part of ``config`` (its routes are added either way). The host's
    routes are copied when the claim sets no addresses and no routes of its own; otherwise those of
    the NIC's policy tables (:func:`policy_tables`) still are, under the claim's (a claim route to
    the same destination in the same table wins). ``policy`` False: not those (a VRF's table
    decides the NIC's lookups)."""
    iface = config.interface
    addresses = list(iface.addresses or ()) if iface is not None else []
    routes = [config_route(r) for r in config.routes or ()]
    keys = {(r.dst, r.table) for r in routes}
    cloud_routes = set(cloud.routes or ()) if cloud is not None else set()
    own_routes = not all(r in cloud_routes for r in config.routes or ())
    if keeps_host_addresses(config):
        addresses = list(host.addresses)
    if keeps_host_addresses(config) and not own_routes:
        carried = host.routes
    else:
        tables = policy_tables(host.routes) if policy else set()
        carried = [r for r in host.routes if r.table in tables]
    return addresses, [r for r in carried if (r.dst, r.table) not in keys] + routes


def config_requests(
    device: str,
    index: int,
    addresses: Sequence[str],
    routes: Sequence[Route],
    optional: Sequence[Route] = (),
    checked: Container[str] = (),
) -> list[Request]:
    """Addresses, then link up, then routes (link-scope first so gateways resolve). ``optional``:
    routes a pod may lack (a host policy route whose gateway the claim's addresses cannot reach).
    ``checked``: addresses this link held on the host, which skip IPv6 duplicate address detection."""
    reqs = [newaddr(device, index, a, dad=a not in checked) for a in addresses]
    reqs.append(newlink(device, index, up=True, step="link-up"))
    for r in sorted(routes, key=lambda r: r.gateway is not None):
        req = newroute(device, index, r)
        reqs.append(replace(req, ignore=(*req.ignore, errno.ENETUNREACH)) if r in optional else req)
    return reqs


def plan_pod(nic: Nic) -> None:
    """The NIC's addresses and routes in the pod (every route in its VRF's table, when it has one) and
    its record; :class:`SettingRefused` for an MTU that cannot carry the IPv6 addresses it gets."""
    addresses, routes = pod_addresses(nic.config, nic.device.cloud_config, nic.host, nic.pod.table is None)
    if nic.pod.table is not None:
        routes = [replace(r, table=nic.pod.table) for r in routes]
    nic.pod.addresses, nic.pod.routes = addresses, routes
    mtu = nic.pod.mtu
    v6 = [a for a in addresses if ":" in a]
    if mtu is not None and v6 and mtu < IPV6_MIN_MTU:  # the host's addresses, copied
        reason = f"interface.mtu: {mtu} is below {IPV6_MIN_MTU}, the IPv6 minimum, and it gets {v6[0]}"
        raise SettingRefused(nic.name, "mtu", reason)
    found = record(nic.host.addresses, nic.host.routes)
    if found is not None:
        nic.records[Addresses.name] = found


class Addresses(NicSetting):
    """``interface.addresses`` and ``routes`` (or the host's), and the link up."""

    name = "addresses"
    sub_interfaces = True

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Record every NIC's host addresses and routes (from the kernel), then plan its pod ones."""
        record_host(host.rtnl(), [nic.host for nic in nics])
        for nic in nics:
            plan_pod(nic)

    def requests(self, nic: Nic) -> list[Request]:
        tables = policy_tables(nic.host.routes)
        optional = [r for r in nic.pod.routes if r.table in tables and r in nic.host.routes]
        # The host's own addresses, carried along the same link: usable in the pod at once.
        return config_requests(nic.name, nic.index, nic.pod.addresses, nic.pod.routes, optional, nic.host.addresses)

    def after_configure(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Leave the pod's new IPv6 addresses still under detection in ``pod.tentative`` (one
        address dump; none when no NIC gets one), flagged by whether the kernel took them
        optimistically; one already found in use refuses the pod, naming it."""
        new = {(nic.index, canonical_cidr(a)): nic.name for nic in nics for a in new_ipv6(nic)}
        if not new:
            return
        states = ipv6_address_states(pod.rtnl, {index for index, _ in new})
        for key, device in new.items():
            flags = states.get(key, 0)
            if flags & IFA_F_DADFAILED:
                reason = f"interface.addresses: {key[1]} is in use on the link (IPv6 duplicate address detection)"
                raise NetnsOpError(device, "address", reason)
            if flags & IFA_F_TENTATIVE:
                pod.tentative[key] = (device, bool(flags & IFA_F_OPTIMISTIC))

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        kept = nic.records.get(self.name) or {}
        routes = [Route.from_dict(r) for r in kept.get("routes") or ()]
        addresses = kept.get("addresses") or ()
        return config_requests(nic.device, index, addresses, routes, checked=addresses)
