"""A NIC's VRF in the pod (``ip link add NAME type vrf table N``, ``ip link set NIC master NAME``).

A claim's ``interface.vrf`` puts the NIC into a VRF device created in the pod: created and set up
before the NIC is configured, the NIC enslaved to it (``IFLA_MASTER``) first in its configuration
(enslaving cycles the link: before its addresses), every route of the NIC in the VRF's table.
NICs of one pod naming the same VRF share it, and its table: the one they set (two different ones
are refused), else 100 + the first one's host ifindex (dranet's default). A VRF named like a link
the pod has, or like one of its NICs, is refused before anything moves. Each VRF is recorded in
the pod state *before* it is created (``{"kind", "index", "name"}``, at an ifindex chosen free in
the pod and given to the kernel with the create): a driver killed between the create and any later
step finds it by that record, and a record of a VRF never made points at nothing. At return the
NICs are released (master 0) and only the links so recorded, still of that kind at that index, are
deleted, before the NICs move back. A kernel built without VRF support (``CONFIG_NET_VRF``) answers the create with
``EOPNOTSUPP``: the pod is refused with a message that says so (:data:`NO_VRF`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import struct
from collections.abc import Callable, Sequence
from typing import Any

from driver.checkpoint.state import MovedDevice
from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    NLA_F_NESTED,
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_DELLINK,
    RTM_NEWLINK,
    attr,
)
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, free_indexes, newlink
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

log = logging.getLogger(__name__)

VRF_TABLE_BASE = 100  # a VRF without a table gets 100 + the NIC's ifindex (dranet's default)
IFLA_INFO_DATA = 2
IFLA_VRF_TABLE = 1
NO_VRF = (
    "this kernel cannot create VRF devices (built without CONFIG_NET_VRF, or the vrf module is not "
    "available); interface.vrf cannot be honoured on this node"
)


def newvrf(device: str, name: str, table: int, index: int = 0) -> Request:
    """RTM_NEWLINK creating VRF ``name`` bound to routing table ``table`` at ifindex ``index`` (0:
    the kernel's choice); an existing name or a taken index is an error."""
    data = attr(IFLA_VRF_TABLE, struct.pack("=I", table))
    info = attr(IFLA_INFO_KIND, b"vrf") + attr(IFLA_INFO_DATA | NLA_F_NESTED, data)
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + attr(IFLA_IFNAME, name.encode() + b"\0")
    body += attr(IFLA_LINKINFO | NLA_F_NESTED, info)
    return Request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, device, "vrf create", f"vrf {name} table {table}")


def dellink(device: str, index: int, name: str) -> Request:
    """RTM_DELLINK of ``index`` (the VRF ``name``); already gone is not an error."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
    return Request(RTM_DELLINK, 0, body, device, "vrf delete", f"vrf {name}", (errno.ENODEV,))


def create(
    rtnl: Rtnl, vrfs: dict[str, tuple[str, int]], record: Callable[[dict[str, object]], None] | None = None
) -> dict[str, int]:
    """Create and set up ``{name: (device, table)}`` in ``rtnl``'s netns; their ifindexes by name.

    Each VRF gets an ifindex free in the namespace and is handed to ``record`` as ``{"kind": "vrf",
    "index", "name"}`` *before* it is created (the pod state keeps it: only a link recorded so is
    ever deleted, see :func:`delete_created`; a record whose create never happened or failed points
    at nothing of that kind). Raises :class:`NetnsOpError` naming the device whose VRF failed
    (:data:`NO_VRF` when the kernel has no VRF support); a VRF refused because its name is taken
    was not created.
    """
    if not vrfs:
        return {}
    planned = dict(zip(vrfs, free_indexes(rtnl, [0] * len(vrfs)), strict=True))
    for name, index in planned.items():
        if record is not None:
            record({"kind": "vrf", "index": index, "name": name})
    errors = rtnl.run_each([newvrf(dev, name, table, planned[name]) for name, (dev, table) in vrfs.items()])
    made = [name for name, err in zip(vrfs, errors, strict=True) if err is None]
    indexes = {}
    for name, link in zip(made, rtnl.links_by_index([planned[name] for name in made]), strict=True):
        if link is None or link.kind != "vrf" or link.ifname != name:
            raise NetnsOpError(vrfs[name][0], "vrf create", f"vrf {name} was created but is not there")
        indexes[name] = link.index
    for (name, (device, table)), err in zip(vrfs.items(), errors, strict=True):
        if err is not None:  # its reason already names the VRF and its table
            unsupported = "Operation not supported" in err.reason
            raise NetnsOpError(
                device, "vrf create", f"vrf {name} table {table}: {NO_VRF}" if unsupported else err.reason
            )
    rtnl.run([newlink(vrfs[name][0], index, up=True, step="vrf up") for name, index in indexes.items()])
    return indexes


def delete_created(rtnl: Rtnl, device: str, created: Sequence[dict[str, Any]]) -> list[Request]:
    """The deletions of the links recorded in ``created`` that are still what was created (same ifindex,
    same kind); a link at that index of another kind (the pod's own) is left alone."""
    records = [c for c in created if isinstance(c.get("index"), int) and c.get("kind")]
    reqs = []
    for c, link in zip(records, rtnl.links_by_index([c["index"] for c in records]), strict=True):
        if link is not None and link.kind == c["kind"]:
            reqs.append(dellink(device, link.index, link.ifname))
    return reqs


def release(device: str, index: int) -> Request:
    """RTM_NEWLINK taking NIC ``index`` out of its VRF (master 0)."""
    return newlink(device, index, master=0, step="vrf release")


def pod_vrfs(nics: Sequence[Nic]) -> dict[str, tuple[str, int]]:
    """The VRFs a pod's NICs ask for: name -> (first device, table). NICs naming one VRF share it:
    its table is the one they set (two different ones: :class:`SettingRefused`), else the first
    NIC's default (100 + its host ifindex)."""
    explicit: dict[str, tuple[str, int]] = {}
    out: dict[str, tuple[str, int]] = {}
    for nic in nics:
        wanted = nic.interface.vrf
        if wanted is None or not wanted.name:
            continue
        if wanted.table is not None:
            seen = explicit.setdefault(wanted.name, (nic.name, wanted.table))
            if seen[1] != wanted.table:
                why = f"vrf {wanted.name}: table {wanted.table} here, {seen[1]} for device {seen[0]} of the same pod"
                raise SettingRefused(nic.name, "vrf create", why)
        out.setdefault(wanted.name, (nic.name, wanted.table or VRF_TABLE_BASE + (nic.host.index or 0)))
    return {name: (dev, explicit[name][1] if name in explicit else table) for name, (dev, table) in out.items()}


class Vrf(NicSetting):
    """``interface.vrf``: the NIC enslaved to a VRF device made in the pod."""

    name = "vrf"
    sub_interfaces = True

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Refuse a VRF named like a link of the pod or one of its NICs; plan each VRF's table."""
        names = {nic.pod.ifname: nic.name for nic in nics}
        for nic in nics:
            vrf = nic.interface.vrf.name if nic.interface.vrf is not None else None
            if vrf is None:
                continue
            if vrf in pod.names:
                raise SettingRefused(nic.name, "vrf", f"interface.vrf.name: the pod already has an interface {vrf!r}")
            if vrf in names:
                reason = f"interface.vrf.name: {vrf!r} is the interface name of device {names[vrf]}"
                raise SettingRefused(nic.name, "vrf", reason)
        vrfs = pod_vrfs(nics)
        for nic in nics:
            wanted = nic.interface.vrf
            if wanted is not None and wanted.name in vrfs:
                nic.pod.table = vrfs[wanted.name][1]
                nic.records[self.name] = wanted.name

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Create and set up the pod's VRFs (each recorded at once); each NIC's master is its VRF."""
        vrfs = pod_vrfs([nic for nic in nics if self.name in nic.records])
        if not vrfs:
            return
        indexes = create(pod.rtnl, vrfs, pod.on_created)
        for nic in nics:
            name = nic.records.get(self.name)
            if name in indexes:
                nic.pod.master = indexes[name]

    def requests(self, nic: Nic) -> list[Request]:
        if nic.pod.master is None:
            return []
        return [newlink(nic.name, nic.index, master=nic.pod.master, step="vrf enslave")]

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """Take the NICs out of their VRFs and delete the VRFs the hooks created (the pod state's
        record; best effort: a pod namespace that is gone took its VRFs with it). A NIC is found by
        its pod ifindex (a record without one: by its pod name), a VRF only by its record."""
        enslaved = [m for m in nics if m.records.get(self.name)]
        if not enslaved and not pod.created:
            return
        with contextlib.suppress(NetnsGone, OSError):
            rtnl = pod.rtnl
            indexed = [m for m in enslaved if m.pod_index]
            links = rtnl.links_by_index([m.pod_index or 0 for m in indexed])
            links += rtnl.links_by_name([m.pod_ifname for m in enslaved if not m.pod_index])
            ordered = indexed + [m for m in enslaved if not m.pod_index]
            reqs = [release(m.device, link.index) for m, link in zip(ordered, links, strict=True) if link]
            reqs += delete_created(rtnl, "vrf", pod.created)
            for err in rtnl.run_each(reqs):
                if err is not None:
                    log.warning("VRF cleanup", extra={"kv": {"error": str(err)}})
