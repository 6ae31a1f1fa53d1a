"""Addresses for sub-interfaces whose claim gives none: a node-local pool per shared NIC.

A share of a NIC whose config sets neither ``interface.addresses`` nor ``dhcp`` gets one address
of its NIC's pool: the admin's (``--sharing-pools ib0=10.77.5.0/26``), else the subnet of the NIC's
first IPv4 host address. The address carries the prefix of the NIC's subnet when the pool lies in
it (so the pods and the host are on one link), else the pool's. Never handed out: the pool's
network and broadcast addresses, the NIC's own addresses, and every lease recorded in the pod
state. A lease is part of the sub-interface's record (``subInterface.lease``), written ahead with
it, so it is held as long as that record: a driver restart keeps it, and it is free again once the
pod's state is dropped at the return.

The subnet default is right when the subnet is this node's own; where one subnet spans several
nodes, each node needs its own ``--sharing-pools`` range, or two nodes hand out one address twice.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from driver.checkpoint.state import RETURNED, DriverState
from driver.config import IPNetwork
from driver.netlink.sub_interfaces import LEASE, RECORD


class PoolError(Exception):
    """No address can be handed out; the message names the NIC, the pool and why."""


def leases(state: DriverState, parent: str) -> set[str]:
    """The addresses (no prefix) leased to sub-interfaces of ``parent`` in the pod state."""
    out: set[str] = set()
    for pod in state.pods.values():
        for m in pod.devices:
            sub = m.records.get(RECORD) or {}
            if m.step != RETURNED and sub.get("parent") == parent and sub.get(LEASE):
                out.add(str(sub[LEASE]).split("/", 1)[0])
    return out


def lease(
    parent: str,
    host_addresses: Iterable[str],
    taken: set[str],
    pools: Mapping[str, IPNetwork],
) -> str:
    """A free address (CIDR) of ``parent``'s pool; :class:`PoolError` when it has none."""
    interfaces = [ipaddress.ip_interface(a) for a in host_addresses]
    subnet = next((i.network for i in interfaces if i.version == 4), None)
    pool = pools.get(parent, subnet)
    if pool is None:
        raise PoolError(
            f"{parent} has no IPv4 address to take a subnet from and no --sharing-pools entry; "
            "set interface.addresses, interface.dhcp or a pool"
        )
    inside = subnet is not None and pool.version == subnet.version and pool.subnet_of(subnet)  # type: ignore[arg-type]
    prefix = subnet.prefixlen if inside and subnet is not None else pool.prefixlen
    own = {str(i.ip) for i in interfaces}
    for candidate in pool.hosts():
        address = str(candidate)
        if address not in own and address not in taken:
            return f"{address}/{prefix}"
    raise PoolError(f"the address pool of {parent} ({pool}) is exhausted: {len(taken)} leases")
