"""Addresses for sub-interfaces whose claim gives none: a node-local pool per shared NIC.

A share of a NIC whose config sets neither ``interface.addresses`` nor ``dhcp`` gets one address
of its NIC's pool. A pool is a range this node alone hands out: the Node's annotation
``dra.net/sharing-pools`` (``ib0=10.77.5.0/26,...``: one range per node, which a DaemonSet-wide
setting cannot give), else ``--sharing-pools`` (the chart's ``sharing.pools``); ``subnet`` as a
range means the subnet of the NIC's IPv4 host address, for a subnet that is this node's own. The
daemon watches its Node: a changed annotation is the pools of the next lease, within seconds.
There is no default: a subnet spanning nodes, handed out by each, gives one address twice, so a
share with neither an address nor a pool is refused, saying what to set.

An address is never handed out while it is in use (:func:`in_use`): on this node (every host
address, every other share's lease, every address a prepared claim sets) or on the link (an ARP
probe, :mod:`driver.netlink.arp_probe`, answered within a bounded wait). The address carries the
prefix of the NIC's subnet when the pool lies in it (so the pods and the host are on one link),
else the pool's. A lease is part of the sub-interface's record (``subInterface.lease``), written
ahead with it, so it is held as long as that record: a driver restart keeps it, and it is free
again once the pod's state is dropped at the return. A pool changed under running shares leaves
their leases as they are: each stays its share's until its pod ends (:func:`in_use` counts every
lease, in any range), and one outside its NIC's pool now is reported (:func:`leases_outside`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from driver.checkpoint.state import RETURNED, DriverState
from driver.config import SHARING_POOLS_ANNOTATION, SUBNET_POOL, IPNetwork
from driver.netlink.rtnl import RT_SCOPE_UNIVERSE, Rtnl, dump_addresses
from driver.netlink.sub_interfaces import LEASE, RECORD

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

PROBES = 8
"""Free-looking addresses of a pool probed on the link for one lease before the pool is called
overlapping (each costs the probe's wait)."""


class PoolError(Exception):
    """No address can be handed out; the message names the NIC, the pool and why."""


def host_addresses(rtnl: Rtnl) -> dict[str, tuple[str, str]]:
    """Every address of the host's namespace (global scope; no prefix) -> (its link's name, the
    address as a CIDR): one address dump and one link dump."""
    names = rtnl.link_names()
    out: dict[str, tuple[str, str]] = {}
    for index, cidr in dump_addresses(rtnl, RT_SCOPE_UNIVERSE):
        out[cidr.split("/", 1)[0]] = (names.get(index, f"ifindex {index}"), cidr)
    return out


def leases(state: DriverState, parent: str) -> set[str]:
    """The addresses (no prefix) leased to sub-interfaces of ``parent`` in the pod state."""
    out: set[str] = set()
    for pod in state.pods.values():
        for m in pod.devices:
            sub = m.records.get(RECORD) or {}
            if m.step != RETURNED and sub.get("parent") == parent and sub.get(LEASE):
                out.add(str(sub[LEASE]).split("/", 1)[0])
    return out


def in_use(state: DriverState, host: Mapping[str, tuple[str, str]], skip: Iterable[str] = ()) -> dict[str, str]:
    """Address (no prefix) -> who holds it on this node: the host (``host``: :func:`host_addresses`),
    every share's lease in the pod state, every address a prepared claim sets for a NIC (but the
    claims ``skip``: the asking pod's own, by UID). For leases and for refusing a claim's address in use."""
    out = {address: f"the host's {link}" for address, (link, _cidr) in host.items()}
    for pod in state.pods.values():
        for m in pod.devices:
            sub = m.records.get(RECORD) or {}
            if m.step != RETURNED and sub.get(LEASE):
                out[str(sub[LEASE]).split("/", 1)[0]] = (
                    f"pod {pod.namespace}/{pod.name} (its share of {sub.get('parent')})"
                )
    skipped = set(skip)
    for claim in state.claims.values():
        if claim.uid in skipped:
            continue
        for d in claim.devices:
            iface = d.config.interface
            if iface is None:
                continue
            for cidr in iface.addresses or ():
                out.setdefault(cidr.split("/", 1)[0], f"claim {claim.namespace}/{claim.name} (device {d.device})")
    return out


@dataclass(frozen=True, order=True)
class LeaseOutside:
    """A running share's lease outside its NIC's pool as it is now (the range changed or was removed
    under it): the share keeps it, and no other share is given it while its pod runs."""

    pod: str  # namespace/name
    parent: str  # the shared NIC
    lease: str  # the address as leased, with its prefix

    def __str__(self) -> str:
        return f"{self.lease} of pod {self.pod} (a share of {self.parent})"


def leases_outside(state: DriverState, pools: Mapping[str, IPNetwork | None]) -> list[LeaseOutside]:
    """The leases of running shares that their NIC's pool in ``pools`` does not hold: its range moved,
    or it has none any more. A pool of ``subnet`` is not judged: it is the NIC's host subnet, read
    when a lease is handed out."""
    out = []
    for pod in state.pods.values():
        for m in pod.devices:
            sub = m.records.get(RECORD) or {}
            parent = str(sub.get("parent") or "")
            if m.step == RETURNED or not sub.get(LEASE) or (parent in pools and pools[parent] is None):
                continue
            try:
                address = ipaddress.ip_interface(str(sub[LEASE])).ip
            except ValueError:  # not a lease this driver wrote: nothing to judge it by
                continue
            pool = pools.get(parent)
            if pool is None or address not in pool:
                out.append(LeaseOutside(f"{pod.namespace}/{pod.name}", parent, str(sub[LEASE])))
    return sorted(out)


def pool_of(parent: str, host_addresses: Iterable[str], pools: Mapping[str, IPNetwork | None]) -> IPNetwork:
    """The range ``parent``'s shares lease from; :class:`PoolError` when it has none."""
    if parent not in pools:
        raise PoolError(
            f"no address pool for {parent} on this node: annotate the node {SHARING_POOLS_ANNOTATION}={parent}=<CIDR> "
            f"(a range only this node hands out; '{SUBNET_POOL}' for the NIC's own subnet when no other node is "
            "on it): the driver takes it within seconds, without a restart, and this pod gets an address of it "
            "at the kubelet's next retry of its sandbox; or give the claim interface.addresses or interface.dhcp"
        )
    pool = pools[parent]
    if pool is not None:
        return pool
    subnets = _subnets(map(ipaddress.ip_interface, host_addresses))
    if not subnets:
        raise PoolError(
            f"the pool of {parent} is its subnet, but {parent} has no IPv4 or global IPv6 address to take it from"
        )
    return subnets[0]


def _subnets(interfaces: Iterable[IPInterface]) -> list[IPNetwork]:
    """The NIC's own subnets, IPv4 first (an IPv6-only rail's is its IPv6 one). A link-local
    subnet is never one: every link has the same fe80::/64."""
    nets = [i.network for i in interfaces if not (i.version == 6 and i.ip.is_link_local)]
    return sorted(nets, key=lambda n: n.version)


def lease(
    parent: str,
    host_addresses: Iterable[str],
    taken: Mapping[str, str],
    pools: Mapping[str, IPNetwork | None],
    answered: Callable[[str], bool] = lambda _address: False,
) -> str:
    """A free address (CIDR) of ``parent``'s pool: not ``taken`` (:func:`in_use`) and not answering
    on the link (``answered(address)``: an ARP probe); :class:`PoolError` when there is none."""
    interfaces = [ipaddress.ip_interface(a) for a in host_addresses]
    pool = pool_of(parent, [str(i) for i in interfaces], pools)
    # A pool inside one of the NIC's subnets takes that subnet's prefix (one link with the host).
    inside = next(
        (n for n in _subnets(interfaces) if n.version == pool.version and pool.subnet_of(n)),  # type: ignore[arg-type]
        None,
    )
    prefix = inside.prefixlen if inside is not None else pool.prefixlen
    own = {str(i.ip) for i in interfaces}
    probed: list[str] = []
    for candidate in pool.hosts():
        address = str(candidate)
        if address in own or address in taken:
            continue
        if len(probed) == PROBES:
            break
        probed.append(address)
        if not answered(address):
            return f"{address}/{prefix}"
    if probed:
        raise PoolError(
            f"the address pool of {parent} ({pool}) overlaps addresses in use on its link: "
            f"{', '.join(probed)} answered ARP probes (give this node a range no other host uses)"
        )
    raise PoolError(f"the address pool of {parent} ({pool}) is exhausted: {len(taken)} addresses in use")
