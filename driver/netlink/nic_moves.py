"""Netlink operations on NICs across network namespaces (raw rtnetlink): record, move, configure, restore.

A NIC goes into a pod with ONE ``RTM_NEWLINK`` on the host link carrying
``IFLA_NET_NS_FD`` + ``IFLA_IFNAME`` (+ ``IFLA_MTU``/``IFLA_ADDRESS``), so it is
never in a half-renamed state; the kernel applies the attributes after the move.
Then, inside the pod: addresses, link up, routes. Coming back is the mirror image
(one ``RTM_NEWLINK`` restoring name, MTU and MAC) followed by re-adding the host
addresses and routes recorded before the move, which the Go driver never does.

The hot path speaks raw rtnetlink (:class:`driver.netlink.rtnl.Rtnl`): pyroute2's sync API
costs about 1 ms of Python per request, more than the kernel work of an address or a
route, and raw requests can be pipelined (all addresses, link-ups and routes of a pod
in one ``send``). The slow paths (finding a NIC the kernel returned under another name) use
the same raw socket's dumps, so the daemon never loads pyroute2.
The sockets of each namespace come from :class:`driver.netlink.namespaces.Namespaces`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from driver.netlink.host_records import LinkState, pci_address
from driver.netlink.host_records import record_host as record_host  # re-exported: the hooks' one netlink module
from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.pod_rules import Neighbor, Rule, newneigh, newrule
from driver.netlink.rtnl import (
    LinkInfo,
    NetnsOpError,
    Request,
    Route,
    Rtnl,
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


def _config_reqs(
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


def move_link(
    rtnl: Rtnl,
    device: str,
    ifname: str,
    target_fd: int,
    new_name: str,
    mtu: int | None = None,
    mac: str | None = None,
    index: int | None = None,
) -> None:
    """Move ``ifname`` (in ``rtnl``'s netns) to ``target_fd``'s netns, renamed, in one RTM_NEWLINK.

    ``index`` (from :func:`record_host`) saves a lookup.
    """
    if index is None:
        link = rtnl.link(ifname)
        if link is None:
            raise NetnsOpError(device, "move", f"link {ifname} not found")
        index = link.index
    rtnl.run([newlink(device, index, ns_fd=target_fd, ifname=new_name, mtu=mtu, mac=mac, step="move")])


@dataclass
class Move:
    """One NIC into a pod: its host ifindex and what it is called and set to there."""

    device: str
    index: int
    new_name: str
    mtu: int | None = None
    mac: str | None = None
    extra: bytes = b""  # more link attributes set with the move (offload sizes)


def move_links(rtnl: Rtnl, moves: list[Move], target_fd: int) -> None:
    """Move NICs (in ``rtnl``'s netns) to ``target_fd``'s netns, each renamed (+ MTU, MAC) by one
    RTM_NEWLINK, all in one pipelined send; raises the first failure (its device and step)."""
    rtnl.run(
        [
            newlink(
                m.device, m.index, ns_fd=target_fd, ifname=m.new_name, mtu=m.mtu, mac=m.mac, extra=m.extra, step="move"
            )
            for m in moves
        ]
    )


def configure_pod_links(rtnl: Rtnl, configs: dict[str, PodLinkConfig]) -> dict[str, PodLinkResult]:
    """Addresses, link up and routes for moved NICs (keyed by device name), in the pod netns.

    One pipelined lookup of all NICs, then all NICs' requests in one pipelined batch.
    """
    reqs: list[Request] = []
    results = {}
    links = rtnl.links_by_name([cfg.ifname for cfg in configs.values()])
    for (device, cfg), link in zip(configs.items(), links, strict=True):
        if link is None:
            raise NetnsOpError(device, "configure", f"{cfg.ifname} not found in the pod namespace")
        if cfg.master is not None:  # enslaving cycles the link: before its addresses
            reqs.append(newlink(device, link.index, master=cfg.master, step="vrf enslave"))
        reqs += _config_reqs(device, link.index, cfg.addresses, cfg.routes, True, cfg.rules, cfg.neighbors)
        results[device] = PodLinkResult(cfg.ifname, link.mac, list(cfg.addresses))
    rtnl.run(reqs)
    return results


def _restore_reqs(device: str, link: LinkInfo, state: LinkState) -> list[Request]:
    """What gives a NIC back in the host netns its name, MTU, MAC, addresses and routes."""
    reqs: list[Request] = []
    rename = link.ifname != state.ifname
    remac = bool(state.mac) and link.mac.lower() != state.mac.lower()
    if rename or remac:
        reqs.append(newlink(device, link.index, up=False, step="restore-link"))  # rename/MAC need it down
    if rename or remac or (state.mtu and link.mtu != state.mtu):
        reqs.append(
            newlink(
                device,
                link.index,
                ifname=state.ifname if rename else None,
                mtu=state.mtu if state.mtu and link.mtu != state.mtu else None,
                mac=state.mac if remac else None,
                step="restore-link",
            )
        )
    # Routes need the link up; the Go driver also sets it up on return.
    return reqs + _config_reqs(device, link.index, state.addresses, state.routes, True, state.rules, state.neighbors)


@dataclass
class ReturnItem:
    """One NIC to bring home: its device, its name in the pod, the host state to restore."""

    device: str
    pod_ifname: str
    state: LinkState
    extra_macs: tuple[str, ...] = ()  # MACs it may have in the pod (how to recognise it there)


def return_links(
    ns: Namespaces,
    netns_path: str,
    items: list[ReturnItem],
    sysfs_root: str = "/sys",
    announce: Callable[[list[int]], None] | None = None,
) -> dict[str, str | NetnsOpError]:
    """Bring NICs back to the host and restore them, in few round trips; idempotent.

    One socket in the pod netns: one pipelined lookup of all NICs, one pipelined batch of moves
    (each carrying the host name, MTU and MAC). Then in the host: one pipelined lookup, and all
    NICs' restores (addresses, link up, routes) in one pipelined batch. A NIC not in the pod is
    looked for in the host: under its host name, or (netns gone: the kernel returned a
    physical NIC, maybe as ``devN``) by permanent MAC, PCI address or current MAC (one dump).
    ``announce`` is told the pod-side ifindexes just before the moves (their link events are ours).

    Returns, per device, how it was found (``pod``, ``host``, ``netns-gone``) or the
    :class:`NetnsOpError` that stopped it (step ``find``: it is nowhere, e.g. a virtual NIC
    destroyed with its netns).
    """
    out: dict[str, str | NetnsOpError] = {}
    how = dict.fromkeys((it.device for it in items), "host")
    try:
        with ns.pod(netns_path) as (pod, _):
            found = pod.links_by_name([it.pod_ifname for it in items])
            moves = [
                (it, link)
                for it, link in zip(items, found, strict=True)
                if link is not None and _mac_matches(link, it.state, it.extra_macs)
            ]
            if announce is not None:
                announce([link.index for _, link in moves])
            reqs = []
            for it, link in moves:
                st = it.state
                mac = st.mac if st.mac and link.mac.lower() != st.mac.lower() else None
                mtu = st.mtu if st.mtu and link.mtu != st.mtu else None
                reqs.append(
                    newlink(it.device, link.index, ns_fd=ns.host_fd, ifname=st.ifname, mtu=mtu, mac=mac, step="return")
                )
            for (it, _), err in zip(moves, pod.run_each(reqs), strict=True):
                if err is not None:
                    out[it.device] = err
                else:
                    how[it.device] = "pod"
    except NetnsGone:
        how = dict.fromkeys(how, "netns-gone")
    rtnl = ns.host_rtnl()
    todo = [it for it in items if it.device not in out]
    restores: list[Request] = []
    for it, host_link in zip(todo, rtnl.links_by_name([it.state.ifname for it in todo]), strict=True):
        if host_link is None or not _mac_matches(host_link, it.state, it.extra_macs):
            host_link = find_host_link(rtnl, it.state, it.extra_macs, sysfs_root)
        if host_link is None:
            out[it.device] = NetnsOpError(
                it.device,
                "find",
                f"{it.state.ifname} (MAC {it.state.mac}) is neither in {netns_path} nor in the host namespace",
            )
            continue
        restores += _restore_reqs(it.device, host_link, it.state)
    for req, err in zip(restores, rtnl.run_each(restores), strict=True):
        if err is not None and req.device not in out:
            out[req.device] = err  # the first failure of each device
    for it in todo:
        out.setdefault(it.device, how[it.device])
    return out


def return_link(
    ns: Namespaces,
    device: str,
    netns_path: str,
    pod_ifname: str,
    state: LinkState,
    extra_macs: tuple[str, ...] = (),
    sysfs_root: str = "/sys",
) -> str:
    """:func:`return_links` for one NIC; returns how it was found, raises its :class:`NetnsOpError`."""
    result = return_links(ns, netns_path, [ReturnItem(device, pod_ifname, state, extra_macs)], sysfs_root)[device]
    if isinstance(result, NetnsOpError):
        raise result
    return result


def _mac_matches(link: LinkInfo, state: LinkState, extra_macs: tuple[str, ...]) -> bool:
    macs = {m.lower() for m in (state.mac, state.permanent_mac, *extra_macs) if m}
    return not macs or link.mac.lower() in macs or (link.permanent_mac or "").lower() in macs


def find_host_link(
    rtnl: Rtnl, state: LinkState, extra_macs: tuple[str, ...] = (), sysfs_root: str = "/sys"
) -> LinkInfo | None:
    """The host link that is this NIC (slow path, one dump): by permanent MAC, PCI address, MAC."""
    links = rtnl.links()
    if state.permanent_mac:
        for link in links:
            if (link.permanent_mac or "").lower() == state.permanent_mac.lower():
                return link
    if state.pci_address:
        for link in links:
            if pci_address(link.ifname, sysfs_root) == state.pci_address:
                return link
    macs = {m.lower() for m in (state.mac, *extra_macs) if m}
    for link in links:
        if link.mac.lower() in macs and link.ifname != "lo":
            return link
    return None
