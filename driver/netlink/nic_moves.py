"""Netlink operations on NICs moving into a pod (raw rtnetlink): record, move, set, verify, configure.

:func:`record_links` takes what the host has of each NIC (name, ifindex, MTU, MAC, what identifies
it, its MTU limits) with one pipelined lookup. A NIC goes into a pod in two requests, each of which
leaves it somewhere known whatever the kernel answers: :func:`move_links` (``IFLA_NET_NS_FD`` +
``IFLA_NEW_IFINDEX`` + ``IFLA_IFNAME``: the namespace, the ifindex it gets there and its name; a
taken index or name fails before the move, a rename the kernel refuses after the move leaves it at
the planned index), then :func:`set_links` in the pod (MTU, MAC and the settings' link attributes,
by that index, each read back in the same round trip). :func:`check_moved` checks each is that NIC
(:mod:`driver.netlink.link_identity`) with the planned name, MTU and MAC. Then, inside the pod, the
settings' configuration requests of every NIC go in one pipelined batch and the addresses are read
back (:func:`configure_pod_links`). Coming home is :mod:`driver.netlink.nic_home`.

The hot path speaks raw rtnetlink (:class:`driver.netlink.rtnl.Rtnl`): pyroute2's sync API
spends more Python per request than the kernel work of an address or a route (docs/performance.md,
"pyroute2 or hand-packed netlink"), and raw requests can be pipelined (all addresses, link-ups and routes of a pod
in one ``send``). The sockets of each namespace come from :class:`driver.netlink.namespaces.Namespaces`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from driver.netlink.link_identity import LinkIdentity
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import Namespaces
from driver.netlink.rtnl import NetnsOpError, Request, Route, Rtnl, canonical_cidr, link_addresses, newlink

log = logging.getLogger(__name__)


@dataclass
class LinkState:
    """A NIC exactly as the host had it: what a return must restore.

    :func:`record_links` fills in the link itself; its addresses and routes are recorded by the
    addresses setting (:mod:`driver.nic_settings.addresses`), which other settings read.
    """

    ifname: str
    mtu: int
    mac: str
    addresses: list[str] = field(default_factory=list)  # CIDRs, global scope only
    routes: list[Route] = field(default_factory=list)
    permanent_mac: str | None = None
    pci_address: str | None = None
    index: int | None = None  # host ifindex when recorded
    identity: LinkIdentity | None = None  # what tells it from other links (from netlink, when recorded)
    max_mtu: int | None = None  # the MTU limits its driver reports (None: not reported)
    min_mtu: int | None = None


@dataclass
class PodLinkConfig:
    """What a NIC should look like inside the pod: its name, MTU and MAC, and what the settings
    that everyone reads planned (its addresses and routes, the VRF it is enslaved to)."""

    ifname: str
    mtu: int | None = None
    mac: str | None = None
    addresses: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    table: int | None = None  # the routing table of its VRF (every route goes there); None: no VRF
    master: int | None = None  # ifindex of the VRF device it is enslaved to, once created in the pod


@dataclass
class PodLinkResult:
    """What the NIC looks like in the pod once configured."""

    ifname: str
    mac: str
    addresses: list[str]


def pci_address(ifname: str, sysfs_root: str = "/sys") -> str | None:
    """The PCI address of ``ifname`` from sysfs (``device`` link), or None for a virtual NIC."""
    try:
        target = os.readlink(f"{sysfs_root}/class/net/{ifname}/device")
    except OSError:
        return None
    return Path(target).name


def record_links(ns: Namespaces, ifnames: list[str], sysfs_root: str = "/sys") -> dict[str, LinkState]:
    """Name, ifindex, MTU, MAC, identity and MTU limits of ``ifnames`` in the host namespace, with one
    pipelined RTM_GETLINK for all of them. Raises ``KeyError`` naming a missing link."""
    states: dict[str, LinkState] = {}
    for ifname, link in zip(ifnames, ns.host_rtnl().links_by_name(ifnames), strict=True):
        if link is None:
            raise KeyError(f"link {ifname} not found in the host namespace")
        states[ifname] = LinkState(
            ifname=ifname,
            mtu=link.mtu,
            mac=link.mac,
            permanent_mac=link.permanent_mac,
            pci_address=pci_address(ifname, sysfs_root),
            index=link.index,
            identity=LinkIdentity.of(link),
            max_mtu=link.max_mtu,
            min_mtu=link.min_mtu,
        )
    return states


@dataclass
class Move:
    """One NIC into a pod: its host ifindex, the ifindex it gets there, its name and settings there."""

    device: str
    index: int
    new_name: str
    pod_index: int
    mtu: int | None = None
    mac: str | None = None
    extra: bytes = b""  # more link attributes set in the pod (the settings' link attributes)

    @property
    def settings(self) -> bool:
        """Whether the NIC gets more than a name in the pod (a second request there)."""
        return self.mtu is not None or self.mac is not None or bool(self.extra)


def move_links(rtnl: Rtnl, moves: list[Move], target_fd: int, choose_index: bool = True) -> list[NetnsOpError | None]:
    """Move NICs (in ``rtnl``'s netns) to ``target_fd``'s netns, each to its planned ifindex and renamed,
    all in one pipelined send; each one's failure (or None), in order.

    Only the namespace and the name change here: a name already taken in the pod or an ifindex
    taken there fails before anything happens; the rest of what the NIC gets there (MTU, MAC,
    offload sizes) is a second step, :func:`set_links`, so that what the kernel may refuse after the
    move never leaves the NIC somewhere unknown. Whatever fails, the NIC is at its host index on the
    host or at its planned index in the pod. Without ``choose_index`` (a kernel before 5.17 has no
    ``IFLA_NEW_IFINDEX``) the NIC keeps its index: the plan made its pod index its host one, free there.
    """
    return rtnl.run_each(
        [
            newlink(
                m.device,
                m.index,
                ns_fd=target_fd,
                ifname=m.new_name,
                new_index=m.pod_index if choose_index else None,
                step="move",
            )
            for m in moves
        ]
    )


def set_links(
    pod: Rtnl, moves: list[Move], look_up: list[int]
) -> tuple[list[NetnsOpError | None], list[LinkInfo | None]]:
    """MTU, MAC and offload sizes of moved NICs, by their pod ifindex (the moved NIC is down, so
    every driver takes a MAC), and the links at ``look_up`` as the pod has them afterwards (what
    :func:`check_moved` checks), in one round trip: each NIC's failure (or None), in order, and
    those links."""
    todo = [m for m in moves if m.settings]
    reqs = [newlink(m.device, m.pod_index, mtu=m.mtu, mac=m.mac, extra=m.extra, step="set link") for m in todo]
    failed, links = pod.run_each_then_links(reqs, look_up)
    errors = iter(failed)
    return [next(errors) if m.settings else None for m in moves], links


def check_moved(
    moves: list[Move], identities: dict[str, LinkIdentity], found: list[LinkInfo | None]
) -> dict[str, LinkInfo]:
    """Each moved NIC as the pod has it (``found``: the links at the moves' pod ifindexes, from
    :func:`set_links`) checked: that link, under its planned name, with its planned MTU and MAC.
    :class:`NetnsOpError` (step ``verify``) for the first one that is not."""
    out: dict[str, LinkInfo] = {}
    for m, link in zip(moves, found, strict=True):
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
    rtnl: Rtnl, requests: list[Request], configs: dict[str, tuple[PodLinkConfig, LinkInfo]]
) -> dict[str, PodLinkResult]:
    """Run the pod's configuration batch (every NIC's ``requests``, in one pipelined send) and read
    the addresses back: a result lists the addresses the NIC really has, never one the kernel did
    not keep. ``configs``: per device, what it should have and the NIC as :func:`check_moved` found it.
    """
    rtnl.run(requests)
    wanted = any(cfg.addresses for cfg, _ in configs.values())
    present = link_addresses(rtnl, {link.index for _, link in configs.values()}) if wanted else {}
    results = {}
    for device, (cfg, link) in configs.items():
        have = present.get(link.index, set())
        kept = [a for a in cfg.addresses if canonical_cidr(a) in have]
        missing = [a for a in cfg.addresses if a not in kept]
        if missing:
            raise NetnsOpError(device, "configure", f"the kernel did not keep address(es) {', '.join(missing)}")
        results[device] = PodLinkResult(cfg.ifname, link.mac, kept)
    return results
