"""NICs back from a pod to the host (raw rtnetlink): found by what they are, moved, restored as recorded.

A NIC is found by its identity (:mod:`driver.netlink.link_identity`), never by a name or a MAC
alone: in the pod at the ifindex the move gave it (a pod may rename it, or make a link called
like it with its MAC: the impostor is left alone), on the host at its host ifindex (already home)
or at its pod ifindex (a physical NIC the kernel gave back when the pod's namespace died), and a
NIC with a burned-in address or a PCI parent anywhere by those. A link that is not the NIC is
never touched: the NIC is reported missing instead. Records written before the identity was
kept are found as they were then (name in the pod, MAC-checked), but never by a MAC on the host.

The way home is the mirror of the way in: one ``RTM_NEWLINK`` per NIC from the pod (namespace,
the host ifindex, the host name; a taken name or index fails before the move, a failed rename
after it leaves the NIC at that index on the host), then the host record restored by ifindex:
name, MTU and MAC, and what each setting recorded (addresses, routes, rules, neighbors...: the
requests :attr:`ReturnItem.restores` gives), all NICs in one pipelined batch.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from driver.netlink.link_identity import LinkIdentity, find_by_identity
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, free_indexes, newlink

log = logging.getLogger(__name__)


@dataclass
class ReturnItem:
    """One NIC to bring home: its device, where it is in the pod, the host state to restore.

    ``state.index`` is its host ifindex; ``pod_index`` and ``identity`` come from the move (None:
    a record from before they were kept, found the old way). ``restores`` gives, for the ifindex
    it has once home, the requests that give it back what the settings recorded.
    """

    device: str
    pod_ifname: str
    state: LinkState
    pod_index: int | None = None
    identity: LinkIdentity | None = None
    extra_macs: tuple[str, ...] = ()  # MACs it may have in the pod (old records: how to recognise it there)
    restores: Callable[[int], list[Request]] = field(default=lambda _index: [])

    @property
    def legacy(self) -> bool:
        """A record without the NIC's pod ifindex and identity (written by an older driver)."""
        return self.pod_index is None or self.identity is None


def _restore_reqs(device: str, link: LinkInfo, state: LinkState) -> list[Request]:
    """What gives a NIC back in the host netns its name, MTU and MAC."""
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
    return reqs


def _mac_matches(link: LinkInfo, it: ReturnItem) -> bool:
    macs = {m.lower() for m in (it.state.mac, it.state.permanent_mac, *it.extra_macs) if m}
    return not macs or link.mac.lower() in macs or (link.permanent_mac or "").lower() in macs


def _legacy_identity(it: ReturnItem) -> LinkIdentity:
    """What an old record knows that a pod cannot forge: the permanent MAC and the PCI address."""
    return LinkIdentity(permanent_mac=it.state.permanent_mac, parent=it.state.pci_address)


def _in_pod(pod: Rtnl, items: list[ReturnItem]) -> dict[str, LinkInfo]:
    """Where each NIC is in the pod: at its pod ifindex if the link there is it, else (a NIC with an
    unforgeable identity) wherever that identity is; old records by name, MAC-checked."""
    out: dict[str, LinkInfo] = {}
    current = [it for it in items if not it.legacy]
    for it, link in zip(current, pod.links_by_index([it.pod_index or 0 for it in current]), strict=True):
        assert it.identity is not None
        if link is not None and it.identity.matches(link, in_pod=True):
            out[it.device] = link
        elif link is not None:
            log.warning(
                "a link the driver did not move sits at a NIC's ifindex in the pod: left alone",
                extra={"kv": {"device": it.device, "index": link.index, "ifname": link.ifname}},
            )
    _by_name_then_identity(pod, items, out, lambda it: it.pod_ifname)
    return out


def _by_name_then_identity(
    rtnl: Rtnl, items: list[ReturnItem], out: dict[str, LinkInfo], name: Callable[[ReturnItem], str]
) -> None:
    """Into ``out``: old records' NICs by ``name`` (MAC-checked), then those still not found that have
    an unforgeable identity, by it (one dump)."""
    old = [it for it in items if it.legacy]
    for it, link in zip(old, rtnl.links_by_name([name(it) for it in old]), strict=True):
        if link is not None and _mac_matches(link, it):
            out[it.device] = link
    lost = [it for it in items if it.device not in out and _identity(it).unforgeable]
    if lost:
        links = rtnl.links()
        for it in lost:
            found = find_by_identity(links, _identity(it))
            if found is not None:
                out[it.device] = found


def _identity(it: ReturnItem) -> LinkIdentity:
    return it.identity if it.identity is not None else _legacy_identity(it)


def _on_host(rtnl: Rtnl, items: list[ReturnItem], tried: dict[str, int]) -> dict[str, LinkInfo]:
    """Where each NIC is on the host: at an index it can have there (``tried``: where its move home
    was to put it; its host index; its pod index, which a physical NIC keeps when the kernel gives
    it back) if the link there is it; else, with an unforgeable identity, wherever that is."""
    out: dict[str, LinkInfo] = {}
    candidates = {
        it.device: list(dict.fromkeys(i for i in (tried.get(it.device), it.state.index, it.pod_index) if i))
        for it in items
        if not it.legacy
    }
    keys = sorted({i for indexes in candidates.values() for i in indexes})
    found = dict(zip(keys, rtnl.links_by_index(keys), strict=True))
    for it in items:
        for index in candidates.get(it.device, ()):
            link = found[index]
            if link is not None and it.identity is not None and it.identity.matches(link):
                out[it.device] = link
                break
    _by_name_then_identity(rtnl, items, out, lambda it: it.state.ifname)
    return out


def _move_home(
    ns: Namespaces, pod: Rtnl, moving: list[tuple[ReturnItem, LinkInfo]], choose_index: bool = True
) -> tuple[dict[str, int], dict[str, LinkInfo], dict[str, NetnsOpError]]:
    """One pipelined batch of moves from the pod to the host, each to its host ifindex (or a free
    one) under its host name. Returns where each was sent, the NICs known home (as the kernel now
    has them) and the failures. Without ``choose_index`` (a kernel before 5.17) the kernel keeps
    each NIC's index when it is free on the host and picks another when not: each is looked up
    under the host name its move gave it (a name the host holds no other link under, or the move
    would have failed), and must be the NIC by its identity."""
    host = ns.host_rtnl()
    targets = [it.state.index or link.index for it, link in moving]
    if min(targets) <= 0 or len(set(targets)) < len(targets):
        targets = free_indexes(host, targets)

    def moves(which: list[int]) -> list[NetnsOpError | None]:
        return pod.run_each(
            [
                newlink(
                    it.device,
                    link.index,
                    ns_fd=ns.host_fd,
                    ifname=it.state.ifname,
                    new_index=t if choose_index else None,
                    step="return",
                )
                for (it, link), t in ((moving[i], targets[i]) for i in which)
            ]
        )

    # Home to its own ifindex at once: a taken index fails before the move (EBUSY), and
    # only then is a free index looked up and the move tried again, so a return costs no lookup.
    errors = moves(list(range(len(moving))))
    taken = [i for i, err in enumerate(errors) if err is not None and err.errno == errno.EBUSY]
    if taken:
        for i, target in zip(taken, free_indexes(host, [targets[i] for i in taken]), strict=True):
            targets[i] = target
        for i, err in zip(taken, moves(taken), strict=True):
            errors[i] = err
    sent: dict[str, int] = {}
    home: dict[str, LinkInfo] = {}
    failed: dict[str, NetnsOpError] = {}
    for (it, link), target, err in zip(moving, targets, errors, strict=True):
        sent[it.device] = target if choose_index else link.index
        if err is not None:
            failed[it.device] = err
        elif choose_index:
            home[it.device] = replace(link, index=target, ifname=it.state.ifname)
    if not choose_index:  # wherever the kernel put it: under its host name, which the move gave it
        moved = [it for it, _ in moving if it.device not in failed]
        for it, found in zip(moved, host.links_by_name([it.state.ifname for it in moved]), strict=True):
            if found is not None and (it.identity is None or it.identity.matches(found)):
                home[it.device], sent[it.device] = found, found.index
    return sent, home, failed


def return_links(
    ns: Namespaces,
    netns_path: str,
    items: list[ReturnItem],
    announce: Callable[[list[int]], None] | None = None,
    choose_index: bool = True,
) -> dict[str, str | NetnsOpError]:
    """Bring NICs back to the host and restore them, in few round trips; idempotent.

    One pipelined lookup in the pod (by pod ifindex), one pipelined batch of moves home; then on the
    host one pipelined lookup of those not known home, and all NICs' restores (name, MTU, MAC and
    what :attr:`ReturnItem.restores` adds) in one pipelined batch. ``announce`` is told the pod-side
    ifindexes just before the moves (their link events are ours); ``choose_index``: the kernel
    takes ``IFLA_NEW_IFINDEX`` (Linux 5.17).

    Returns, per device, how it was found (``pod``, ``host``, ``netns-gone``) or the
    :class:`NetnsOpError` that stopped it (step ``find``: it is nowhere, e.g. a virtual NIC
    destroyed with its netns; no link that is not the NIC was touched).
    """
    how = dict.fromkeys((it.device for it in items), "host")
    sent: dict[str, int] = {}
    home: dict[str, LinkInfo] = {}
    failed: dict[str, NetnsOpError] = {}
    try:
        with ns.pod(netns_path) as (pod, _):
            found = _in_pod(pod, items)
            moving = [(it, found[it.device]) for it in items if it.device in found]
            if announce is not None:
                announce([link.index for _, link in moving])
            if moving:
                sent, home, failed = _move_home(ns, pod, moving, choose_index)
            how.update({it.device: "pod" for it, _ in moving if it.device not in failed})
    except NetnsGone:
        how = dict.fromkeys(how, "netns-gone")
    rtnl = ns.host_rtnl()
    look = [it for it in items if it.device not in home]
    home.update(_on_host(rtnl, look, sent) if look else {})
    out: dict[str, str | NetnsOpError] = {}
    restores: list[Request] = []
    for it in items:
        link = home.get(it.device)
        if link is None:
            out[it.device] = failed.get(it.device) or NetnsOpError(
                it.device,
                "find",
                f"{it.state.ifname} is neither in {netns_path} nor in the host namespace"
                + ("" if it.legacy else f" (looked for by ifindex {it.pod_index} in the pod and by its identity)"),
            )
            continue
        if it.device in failed:  # moved, but the rename home failed: restored from where it is
            log.warning(
                "NIC home under another name", extra={"kv": {"device": it.device, "error": str(failed[it.device])}}
            )
        restores += _restore_reqs(it.device, link, it.state) + it.restores(link.index)
    for req, err in zip(restores, rtnl.run_each(restores), strict=True):
        if err is not None and req.device not in out:
            out[req.device] = err  # the first failure of each device
    for it in items:
        out.setdefault(it.device, how[it.device])
    return out
