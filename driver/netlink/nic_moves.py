"""Netlink operations on NICs moving into a pod (raw rtnetlink): record, move, set, verify, configure.

A NIC goes into a pod in two requests, each of which leaves it somewhere known whatever the
kernel answers: :func:`move_links` (``IFLA_NET_NS_FD`` + ``IFLA_NEW_IFINDEX`` + ``IFLA_IFNAME``:
the namespace, the ifindex it gets there and its name; a taken index or name fails before the
move, a rename the kernel refuses after the move leaves it at the planned index), then
:func:`set_links` in the pod (MTU, MAC, offload sizes, by that index). :func:`check_moved` reads
each back by its index and checks it is that NIC (:mod:`driver.netlink.link_identity`) with the
planned name, MTU and MAC. Then, inside the pod: addresses, link up, routes
(:func:`configure_pod_links`), and the addresses read back. Coming home is
:mod:`driver.netlink.nic_home`.

The hot path speaks raw rtnetlink (:class:`driver.netlink.rtnl.Rtnl`): pyroute2's sync API
costs about 1 ms of Python per request, more than the kernel work of an address or a
route, and raw requests can be pipelined (all addresses, link-ups and routes of a pod
in one ``send``). The sockets of each namespace come from :class:`driver.netlink.namespaces.Namespaces`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from driver.netlink.host_records import LinkState as LinkState  # re-exported: the hooks' one netlink module
from driver.netlink.host_records import record_host as record_host
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.link_info import LinkInfo
from driver.netlink.pod_rules import Neighbor, Rule, newneigh, newrule
from driver.netlink.rtnl import (
    NetnsOpError,
    Request,
    Route,
    Rtnl,
    canonical_cidr,
    link_addresses,
    newaddr,
    newlink,
    newroute,
)

log = logging.getLogger(__name__)


@dataclass
class PodLinkConfig:
    """What a NIC should look like inside the pod."""

    ifname: str
    mtu: int | None = None
    mac: str | None = None
    addresses: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    neighbors: list[Neighbor] = field(default_factory=list)
    master: int | None = None  # ifindex of the VRF device the NIC is enslaved to (before addresses)


@dataclass
class PodLinkResult:
    """What the NIC looks like in the pod once configured."""

    ifname: str
    mac: str
    addresses: list[str]


def config_requests(
    device: str,
    index: int,
    addresses: list[str],
    routes: list[Route],
    up: bool,
    rules: Sequence[Rule] = (),
    neighbors: Sequence[Neighbor] = (),
) -> list[Request]:
    """Addresses, then link up, then routes (link-scope first so gateways resolve), neighbors, rules."""
    reqs = [newaddr(device, index, a) for a in addresses]
    if up:
        reqs.append(newlink(device, index, up=True, step="link-up"))
    reqs += [newroute(device, index, r) for r in sorted(routes, key=lambda r: r.gateway is not None)]
    reqs += [newneigh(device, index, n) for n in neighbors]
    return reqs + [newrule(device, r) for r in rules]


@dataclass
class Move:
    """One NIC into a pod: its host ifindex, the ifindex it gets there, its name and settings there."""

    device: str
    index: int
    new_name: str
    pod_index: int
    mtu: int | None = None
    mac: str | None = None
    extra: bytes = b""  # more link attributes set in the pod (offload sizes)

    @property
    def settings(self) -> bool:
        """Whether the NIC gets more than a name in the pod (a second request there)."""
        return self.mtu is not None or self.mac is not None or bool(self.extra)


def move_links(rtnl: Rtnl, moves: list[Move], target_fd: int) -> list[NetnsOpError | None]:
    """Move NICs (in ``rtnl``'s netns) to ``target_fd``'s netns, each to its planned ifindex and renamed,
    all in one pipelined send; each one's failure (or None), in order.

    Only the namespace and the name change here: a name already taken in the pod or an ifindex
    taken there fails before anything happens; the rest of what the NIC gets there (MTU, MAC,
    offload sizes) is a second step, :func:`set_links`, so that what the kernel may refuse after the
    move never leaves the NIC somewhere unknown. Whatever fails, the NIC is at its host index on the
    host or at its planned index in the pod.
    """
    return rtnl.run_each(
        [
            newlink(m.device, m.index, ns_fd=target_fd, ifname=m.new_name, new_index=m.pod_index, step="move")
            for m in moves
        ]
    )


def set_links(pod: Rtnl, moves: list[Move]) -> list[NetnsOpError | None]:
    """MTU, MAC and offload sizes of moved NICs, by their pod ifindex, in one pipelined send (the
    moved NIC is down, so every driver takes a MAC); each one's failure (or None), in order."""
    todo = [m for m in moves if m.settings]
    errors = iter(
        pod.run_each(
            [newlink(m.device, m.pod_index, mtu=m.mtu, mac=m.mac, extra=m.extra, step="set link") for m in todo]
        )
    )
    return [next(errors) if m.settings else None for m in moves]


def check_moved(pod: Rtnl, moves: list[Move], identities: dict[str, LinkIdentity]) -> dict[str, LinkInfo]:
    """Each moved NIC as the pod sees it, looked up by its pod ifindex (one pipelined lookup) and checked:
    that link, under its planned name, with its planned MTU and MAC. :class:`NetnsOpError` (step
    ``verify``) for the first one that is not."""
    out: dict[str, LinkInfo] = {}
    for m, link in zip(moves, pod.links_by_index([m.pod_index for m in moves]), strict=True):
        identity = identities.get(m.device)
        if link is None or (identity is not None and not identity.matches(link)):
            raise NetnsOpError(m.device, "verify", f"no link at ifindex {m.pod_index} in the pod is this NIC")
        wrong = [
            f"{what} {got} instead of {want}"
            for what, got, want in (
                ("name", link.ifname, m.new_name),
                ("mtu", link.mtu, m.mtu),
                ("mac", link.mac.lower(), m.mac.lower() if m.mac else None),
            )
            if want is not None and got != want
        ]
        if wrong:
            raise NetnsOpError(m.device, "verify", f"ifindex {m.pod_index} in the pod has {', '.join(wrong)}")
        out[m.device] = link
    return out


def configure_pod_links(
    rtnl: Rtnl, configs: dict[str, PodLinkConfig], links: dict[str, LinkInfo] | None = None
) -> dict[str, PodLinkResult]:
    """Addresses, link up and routes for moved NICs (keyed by device name), in the pod netns.

    ``links``: the NICs as :func:`check_moved` found them (else one pipelined lookup by name). All
    NICs' requests go in one pipelined batch; then one address dump: a result lists the addresses
    the NIC really has, never one the kernel did not keep.
    """
    reqs: list[Request] = []
    if links is None:
        found = rtnl.links_by_name([cfg.ifname for cfg in configs.values()])
        links = {device: link for device, link in zip(configs, found, strict=True) if link is not None}
    for device, cfg in configs.items():
        link = links.get(device)
        if link is None:
            raise NetnsOpError(device, "configure", f"{cfg.ifname} not found in the pod namespace")
        if cfg.master is not None:  # enslaving cycles the link: before its addresses
            reqs.append(newlink(device, link.index, master=cfg.master, step="vrf enslave"))
        reqs += config_requests(device, link.index, cfg.addresses, cfg.routes, True, cfg.rules, cfg.neighbors)
    rtnl.run(reqs)
    wanted = any(cfg.addresses for cfg in configs.values())
    present = link_addresses(rtnl, {link.index for link in links.values()}) if wanted else {}
    results = {}
    for device, cfg in configs.items():
        link = links[device]
        have = present.get(link.index, set())
        kept = [a for a in cfg.addresses if canonical_cidr(a) in have]
        missing = [a for a in cfg.addresses if a not in kept]
        if missing:
            raise NetnsOpError(device, "configure", f"the kernel did not keep address(es) {', '.join(missing)}")
        results[device] = PodLinkResult(cfg.ifname, link.mac, kept)
    return results
