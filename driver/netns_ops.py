"""Netlink operations on NICs across network namespaces (pyroute2): record, move, configure, restore.

A NIC goes into a pod with ONE ``RTM_NEWLINK`` on the host link carrying
``IFLA_NET_NS_FD`` + ``IFLA_IFNAME`` (+ ``IFLA_MTU``/``IFLA_ADDRESS``), so it is
never in a half-renamed state; the kernel applies the attributes after the move.
Then, inside the pod: addresses, link up, routes. Coming back is the mirror image
(one ``RTM_NEWLINK`` restoring name, MTU and MAC) followed by re-adding the host
addresses and routes recorded before the move, which the Go driver never does.

pyroute2 keeps its sockets per thread and binds a netlink socket to the netns of
the thread that created it, so :class:`Namespaces` opens sockets by entering the
target netns with ``setns`` in the calling thread and leaving it right away. Use
one :class:`Namespaces` from one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import logging
import os
import socket
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
RT_TABLE_LOCAL = 255
RTPROT_KERNEL = 2
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE = 0
SCOPES = {"universe": 0, "global": 0, "site": 200, "link": 253, "host": 254, "nowhere": 255}


class NetnsOpError(Exception):
    """A netlink step failed for one device; the message names both."""

    def __init__(self, device: str, step: str, reason: str) -> None:
        super().__init__(f"device {device}: {step} failed: {reason}")
        self.device = device
        self.step = step
        self.reason = reason


class NetnsGone(Exception):
    """The pod network namespace no longer exists."""


@dataclass
class Route:
    """One route through a NIC, JSON-serializable (stored in the checkpoint as a dict)."""

    dst: str | None = None  # CIDR; None = default route
    gateway: str | None = None
    prefsrc: str | None = None
    table: int = 254
    priority: int | None = None
    scope: int = RT_SCOPE_UNIVERSE
    proto: int = 3  # RTPROT_BOOT, what `ip route add` uses
    family: int = socket.AF_INET

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Route":
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass
class LinkState:
    """A NIC exactly as the host had it: what a return must restore."""

    ifname: str
    mtu: int
    mac: str
    addresses: list[str] = field(default_factory=list)  # CIDRs, global scope only
    routes: list[Route] = field(default_factory=list)
    permanent_mac: str | None = None
    pci_address: str | None = None


@dataclass
class PodLinkConfig:
    """What a NIC should look like inside the pod."""

    ifname: str
    mtu: int | None = None
    mac: str | None = None
    addresses: list[str] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)


@dataclass
class PodLinkResult:
    """What the NIC looks like in the pod once configured."""

    ifname: str
    mac: str
    addresses: list[str]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class Namespaces:
    """Netlink sockets in the host netns and in pod netns, opened from one thread.

    ``host_netns`` is a path to the host network namespace (``/proc/1/ns/net`` in a
    hostNetwork DaemonSet with hostPID, or a bind mount the daemon keeps).
    """

    def __init__(self, host_netns: str = "/proc/1/ns/net") -> None:
        self.host_netns = host_netns
        self.host_fd = os.open(host_netns, os.O_RDONLY | os.O_CLOEXEC)
        self._libc = _libc()
        self._local = threading.local()  # the host IPRoute is per thread (pyroute2 rule)

    def _open_in(self, ns_fd: int) -> IPRoute:
        """An IPRoute whose socket lives in ``ns_fd``'s netns (this thread only)."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self._libc.setns(ns_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into target netns failed")
            try:
                ipr = IPRoute()
                ipr.socket  # force socket creation now, inside the target netns
            finally:
                if self._libc.setns(own, CLONE_NEWNET) != 0:
                    # Staying in the pod netns would corrupt every later call: fail loudly.
                    raise OSError(ctypes.get_errno(), "setns back to own netns failed")
        finally:
            os.close(own)
        return ipr

    def host(self) -> IPRoute:
        """The (cached, per-thread) IPRoute in the host netns."""
        ipr = getattr(self._local, "host", None)
        if ipr is None:
            ipr = self._open_in(self.host_fd)
            self._local.host = ipr
        return ipr

    @contextlib.contextmanager
    def pod(self, netns_path: str) -> Iterator[tuple[IPRoute, int]]:
        """(IPRoute, fd) for the pod netns at ``netns_path``; raises :class:`NetnsGone`."""
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise NetnsGone(netns_path) from exc
        try:
            if not _is_netns(fd):
                raise NetnsGone(netns_path)  # e.g. a bind mount whose namespace was released
            ipr = self._open_in(fd)
            try:
                yield ipr, fd
            finally:
                ipr.close()
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the host socket of this thread and the host netns fd."""
        ipr = getattr(self._local, "host", None)
        if ipr is not None:
            ipr.close()
            self._local.host = None
        with contextlib.suppress(OSError):
            os.close(self.host_fd)


def _is_netns(fd: int) -> bool:
    # An unmounted /run/netns/<name> file is a plain empty file, not an nsfs inode.
    NSFS_MAGIC = 0x6E736673
    buf = ctypes.create_string_buffer(120)
    if _libc().fstatfs(fd, buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], "little") == NSFS_MAGIC


def _link_by_name(ipr: IPRoute, ifname: str) -> Any | None:
    try:
        return ipr.link("get", ifname=ifname)[0]
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise


def _pci_address(ifname: str, sysfs_root: str = "/sys") -> str | None:
    try:
        target = os.readlink(f"{sysfs_root}/class/net/{ifname}/device")
    except OSError:
        return None
    return Path(target).name


def record_host(ipr: IPRoute, ifnames: list[str], sysfs_root: str = "/sys") -> dict[str, LinkState]:
    """Snapshot name, MTU, MAC, global addresses and routes of ``ifnames`` (3 dumps in total).

    Routes from every table are kept except what the kernel recreates by itself
    (``proto kernel``, the local table), non-unicast ones and multipath ones.
    Raises ``KeyError`` naming a missing link.
    """
    by_index: dict[int, LinkState] = {}
    states: dict[str, LinkState] = {}
    for ifname in ifnames:
        link = _link_by_name(ipr, ifname)
        if link is None:
            raise KeyError(f"link {ifname} not found in the host namespace")
        state = LinkState(ifname=ifname, mtu=link.get("IFLA_MTU"), mac=link.get("IFLA_ADDRESS"),
                          permanent_mac=link.get("IFLA_PERM_ADDRESS"),
                          pci_address=_pci_address(ifname, sysfs_root))
        by_index[link["index"]] = state
        states[ifname] = state
    for addr in ipr.addr("dump"):
        state = by_index.get(addr["index"])
        if state is not None and addr["scope"] == RT_SCOPE_UNIVERSE:
            state.addresses.append(f"{addr.get('IFA_ADDRESS')}/{addr['prefixlen']}")
    for msg in ipr.route("dump"):
        state = by_index.get(msg.get("RTA_OIF"))
        if state is None or msg["type"] != RTN_UNICAST or msg["proto"] == RTPROT_KERNEL:
            continue
        table = msg.get("RTA_TABLE") or msg["table"]
        if table == RT_TABLE_LOCAL:
            continue
        dst = msg.get("RTA_DST")
        state.routes.append(Route(
            dst=f"{dst}/{msg['dst_len']}" if dst is not None else None,
            gateway=msg.get("RTA_GATEWAY"), prefsrc=msg.get("RTA_PREFSRC"), table=table,
            priority=msg.get("RTA_PRIORITY"), scope=msg["scope"], proto=msg["proto"],
            family=msg["family"]))
    return states


def move_link(ipr: IPRoute, device: str, ifname: str, target_fd: int, new_name: str,
              mtu: int | None = None, mac: str | None = None) -> None:
    """Move ``ifname`` (in ``ipr``'s netns) to ``target_fd``'s netns, renamed, in one RTM_NEWLINK."""
    link = _link_by_name(ipr, ifname)
    if link is None:
        raise NetnsOpError(device, "move", f"link {ifname} not found")
    attrs: dict[str, Any] = {"net_ns_fd": target_fd, "ifname": new_name}
    if mtu is not None and mtu != link.get("IFLA_MTU"):
        attrs["mtu"] = mtu
    if mac is not None and mac.lower() != (link.get("IFLA_ADDRESS") or "").lower():
        attrs["address"] = mac
    try:
        ipr.link("set", index=link["index"], **attrs)
    except NetlinkError as exc:
        raise NetnsOpError(device, "move", f"{ifname} -> {new_name}: {exc}") from exc


def _route_args(route: Route, index: int) -> dict[str, Any]:
    args: dict[str, Any] = {"oif": index, "table": route.table, "scope": route.scope,
                            "proto": route.proto, "family": route.family}
    args["dst"] = route.dst if route.dst else ("0.0.0.0/0" if route.family == socket.AF_INET else "::/0")
    if route.gateway:
        args["gateway"] = route.gateway
    if route.prefsrc:
        args["prefsrc"] = route.prefsrc
    if route.priority is not None:
        args["priority"] = route.priority
    return args


def _add_addresses_routes(ipr: IPRoute, device: str, index: int, addresses: list[str],
                          routes: list[Route], up: bool) -> None:
    """Addresses, then link up, then routes (link-scope first so gateways resolve); EEXIST is fine."""
    for cidr in addresses:
        iface = ipaddress.ip_interface(cidr)
        try:
            ipr.addr("add", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise NetnsOpError(device, "address", f"{cidr}: {exc}") from exc
    if up:
        try:
            ipr.link("set", index=index, state="up")
        except NetlinkError as exc:
            raise NetnsOpError(device, "link-up", str(exc)) from exc
    for route in sorted(routes, key=lambda r: r.gateway is not None):
        try:
            ipr.route("add", **_route_args(route, index))
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise NetnsOpError(device, "route", f"{route.dst or 'default'} via "
                                                    f"{route.gateway or '-'}: {exc}") from exc


def configure_pod_links(ipr: IPRoute, configs: dict[str, PodLinkConfig]) -> dict[str, PodLinkResult]:
    """Addresses, link up and routes for moved NICs (keyed by device name), in the pod netns."""
    links = {l.get("IFLA_IFNAME"): l for l in ipr.link("dump")}  # one dump for all NICs
    results = {}
    for device, cfg in configs.items():
        link = links.get(cfg.ifname)
        if link is None:
            raise NetnsOpError(device, "configure", f"{cfg.ifname} not found in the pod namespace")
        _add_addresses_routes(ipr, device, link["index"], cfg.addresses, cfg.routes, up=True)
        results[device] = PodLinkResult(cfg.ifname, link.get("IFLA_ADDRESS"), list(cfg.addresses))
    return results


def restore_host_link(ipr: IPRoute, device: str, index: int, state: LinkState) -> None:
    """Give a NIC that is back in the host netns its name, MTU, MAC, addresses and routes."""
    link = ipr.link("get", index=index)[0]
    attrs: dict[str, Any] = {}
    if link.get("IFLA_IFNAME") != state.ifname:
        attrs["ifname"] = state.ifname
    if state.mtu and link.get("IFLA_MTU") != state.mtu:
        attrs["mtu"] = state.mtu
    if state.mac and (link.get("IFLA_ADDRESS") or "").lower() != state.mac.lower():
        attrs["address"] = state.mac
    if attrs:
        try:
            if "ifname" in attrs or "address" in attrs:
                ipr.link("set", index=index, state="down")  # rename/MAC need the link down
            ipr.link("set", index=index, **attrs)
        except NetlinkError as exc:
            raise NetnsOpError(device, "restore-link", f"{attrs}: {exc}") from exc
    # Routes need the link up; the Go driver also sets it up on return.
    _add_addresses_routes(ipr, device, index, state.addresses, state.routes, up=True)


def return_link(ns: Namespaces, device: str, netns_path: str, pod_ifname: str, state: LinkState,
                extra_macs: tuple[str, ...] = (), sysfs_root: str = "/sys") -> str:
    """Bring a NIC back to the host and restore it; idempotent. Returns how it was found.

    Looks in the pod netns first (normal case), then in the host: under its host
    name, or (netns gone: the kernel returned a physical NIC, maybe as ``devN``)
    by permanent MAC, PCI address or current MAC. Raises :class:`NetnsOpError`
    when the NIC is nowhere (e.g. a virtual NIC destroyed with its netns).
    """
    how = "pod"
    try:
        with ns.pod(netns_path) as (pod_ipr, _):
            link = _link_by_name(pod_ipr, pod_ifname)
            if link is not None and _mac_matches(link, state, extra_macs):
                attrs: dict[str, Any] = {"net_ns_fd": ns.host_fd, "ifname": state.ifname}
                if state.mtu and link.get("IFLA_MTU") != state.mtu:
                    attrs["mtu"] = state.mtu
                if state.mac and (link.get("IFLA_ADDRESS") or "").lower() != state.mac.lower():
                    attrs["address"] = state.mac
                try:
                    pod_ipr.link("set", index=link["index"], **attrs)
                except NetlinkError as exc:
                    raise NetnsOpError(device, "return", f"{pod_ifname} -> host {state.ifname}: {exc}") from exc
            else:
                how = "host"
    except NetnsGone:
        how = "netns-gone"
    host = ns.host()
    index = find_host_link(host, state, extra_macs, sysfs_root)
    if index is None:
        raise NetnsOpError(device, "find", f"{state.ifname} (MAC {state.mac}) is neither in "
                                           f"{netns_path} nor in the host namespace")
    restore_host_link(host, device, index, state)
    return how


def _mac_matches(link: Any, state: LinkState, extra_macs: tuple[str, ...]) -> bool:
    macs = {m.lower() for m in (state.mac, state.permanent_mac, *extra_macs) if m}
    perm = (link.get("IFLA_PERM_ADDRESS") or "").lower()
    return not macs or (link.get("IFLA_ADDRESS") or "").lower() in macs or perm in macs


def find_host_link(ipr: IPRoute, state: LinkState, extra_macs: tuple[str, ...] = (),
                   sysfs_root: str = "/sys") -> int | None:
    """Index of the host link that is this NIC: by name (MAC-checked), permanent MAC, PCI, MAC."""
    links = ipr.link("dump")
    for link in links:
        if link.get("IFLA_IFNAME") == state.ifname and _mac_matches(link, state, extra_macs):
            return link["index"]
    if state.permanent_mac:
        for link in links:
            if (link.get("IFLA_PERM_ADDRESS") or "").lower() == state.permanent_mac.lower():
                return link["index"]
    if state.pci_address:
        for link in links:
            if _pci_address(link.get("IFLA_IFNAME"), sysfs_root) == state.pci_address:
                return link["index"]
    macs = {m.lower() for m in (state.mac, *extra_macs) if m}
    for link in links:
        if (link.get("IFLA_ADDRESS") or "").lower() in macs and link.get("IFLA_IFNAME") != "lo":
            return link["index"]
    return None
