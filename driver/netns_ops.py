"""Netlink operations on NICs across network namespaces (pyroute2): record, move, configure, restore.

A NIC goes into a pod with ONE ``RTM_NEWLINK`` on the host link carrying
``IFLA_NET_NS_FD`` + ``IFLA_IFNAME`` (+ ``IFLA_MTU``/``IFLA_ADDRESS``), so it is
never in a half-renamed state; the kernel applies the attributes after the move.
Then, inside the pod: addresses, link up, routes. Coming back is the mirror image
(one ``RTM_NEWLINK`` restoring name, MTU and MAC) followed by re-adding the host
addresses and routes recorded before the move, which the Go driver never does.

The hot path speaks raw rtnetlink (:class:`Rtnl`): pyroute2's sync API costs about
1 ms of Python per request, more than the kernel work of an address or a route, and
raw requests can be pipelined (all addresses, link-ups and routes of a pod in one
``send``). pyroute2 is kept for the dumps (host addresses/routes, slow-path lookups).
A netlink socket belongs to the netns of the thread that created it, so
:class:`Namespaces` opens sockets by entering the target netns with ``setns`` in the
calling thread and leaving it right away. Use one :class:`Namespaces` per thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

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
    def from_dict(cls, data: dict[str, Any]) -> Route:
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
    index: int | None = None  # host ifindex when recorded (not persisted)


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


# -- raw rtnetlink: the hot path (pyroute2's sync API costs ~1 ms of Python per request) ------
NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 16, 18, 20, 22, 24, 26
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_NET_NS_FD, IFLA_PERM_ADDRESS = 1, 3, 4, 28, 54
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 6, 7, 15
IFF_UP = 0x1
_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(payload: bytes, off: int) -> dict[int, bytes]:
    """Top-level netlink attributes from ``off`` on (type -> data)."""
    attrs: dict[int, bytes] = {}
    while off + 4 <= len(payload):
        alen, akind = struct.unpack_from("=HH", payload, off)
        if alen < 4:
            break
        attrs[akind & 0x3FFF] = payload[off + 4:off + alen]
        off += (alen + 3) & ~3
    return attrs


def _ip_attr(attrs: dict[int, bytes], kind: int) -> str | None:
    return str(ipaddress.ip_address(attrs[kind])) if kind in attrs else None


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def _mac_str(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


@dataclass
class LinkInfo:
    """The few link facts the hot path needs (from one RTM_GETLINK)."""

    index: int
    ifname: str
    mtu: int
    mac: str
    permanent_mac: str | None = None


@dataclass
class _Req:
    kind: int
    flags: int
    body: bytes
    device: str
    step: str
    what: str
    ignore: tuple[int, ...] = ()


class Rtnl:
    """A raw NETLINK_ROUTE socket bound to one netns; requests are pipelined in one sendmsg."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.seq = int.from_bytes(os.urandom(2), "little") << 8

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def _exchange(self, reqs: list[tuple[int, int, bytes]]) -> dict[int, tuple[int, bytes]]:
        """Send all requests at once; seq -> (errno, reply payload) for each."""
        out, seqs = [], []
        for kind, flags, body in reqs:
            self.seq += 1
            seqs.append(self.seq)
            out.append(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, self.seq, 0) + body)
        self.sock.send(b"".join(out))
        pending: set[int] = set(seqs)
        answers: dict[int, tuple[int, bytes]] = {}
        while pending:
            data = self.sock.recv(1 << 16)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
                payload = data[off + _NLMSGHDR.size:off + length]
                if seq in pending:
                    if kind == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", payload)[0]
                        answers[seq] = (err, answers.get(seq, (0, b""))[1])
                        pending.discard(seq)
                    else:  # a GET reply; its ack follows only with NLM_F_ACK, so it completes it
                        answers[seq] = (0, payload)
                        pending.discard(seq)
                off += (length + 3) & ~3
        return {i: answers[s] for i, s in enumerate(seqs)}

    def dump(self, kind: int, body: bytes) -> list[bytes]:
        """A multipart dump request; the payload of every reply message."""
        self.seq += 1
        seq = self.seq
        self.sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        out: list[bytes] = []
        while True:
            data = self.sock.recv(1 << 17)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, mtype, _flags, mseq, _pid = _NLMSGHDR.unpack_from(data, off)
                payload = data[off + _NLMSGHDR.size:off + length]
                off += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err == errno.EINTR:  # dump interrupted by a concurrent change: the kernel asks to retry
                        return self.dump(kind, body)
                    raise OSError(err, f"netlink dump {kind}: {os.strerror(err)}")
                out.append(payload)

    def link(self, ifname: str) -> LinkInfo | None:
        """RTM_GETLINK by name; None when there is no such link."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, ifname.encode() + b"\0")
        err, payload = self._exchange([(RTM_GETLINK, NLM_F_REQUEST, body)])[0]
        if err == errno.ENODEV:
            return None
        if err:
            raise OSError(err, f"RTM_GETLINK {ifname}: {os.strerror(err)}")
        _fam, _type, index, _flags, _change = _IFINFOMSG.unpack_from(payload)
        attrs = _attrs(payload, _IFINFOMSG.size)
        perm = attrs.get(IFLA_PERM_ADDRESS)
        return LinkInfo(index=index, ifname=attrs[IFLA_IFNAME].rstrip(b"\0").decode(),
                        mtu=struct.unpack("=I", attrs[IFLA_MTU])[0], mac=_mac_str(attrs.get(IFLA_ADDRESS, b"")),
                        permanent_mac=_mac_str(perm) if perm and any(perm) else None)

    def run(self, reqs: list[_Req]) -> None:
        """Pipeline ``reqs`` (processed in order by the kernel); raise for the first failure."""
        if not reqs:
            return
        answers = self._exchange([(r.kind, r.flags | NLM_F_REQUEST | NLM_F_ACK, r.body) for r in reqs])
        for i, req in enumerate(reqs):
            err = answers[i][0]
            if err and err not in req.ignore:
                raise NetnsOpError(req.device, req.step, f"{req.what}: {os.strerror(err)}")


def _newlink(device: str, index: int, *, ns_fd: int | None = None, ifname: str | None = None,
             mtu: int | None = None, mac: str | None = None, up: bool | None = None,
             step: str = "link") -> _Req:
    flags = IFF_UP if up else 0
    change = IFF_UP if up is not None else 0
    body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, change)
    if ns_fd is not None:
        body += _attr(IFLA_NET_NS_FD, struct.pack("=I", ns_fd))
    if ifname is not None:
        body += _attr(IFLA_IFNAME, ifname.encode() + b"\0")
    if mtu is not None:
        body += _attr(IFLA_MTU, struct.pack("=I", mtu))
    if mac is not None:
        body += _attr(IFLA_ADDRESS, _mac_bytes(mac))
    what = ", ".join(f"{k}={v}" for k, v in (("netns", ns_fd), ("name", ifname), ("mtu", mtu), ("mac", mac),
                                             ("up", up)) if v is not None)
    return _Req(RTM_NEWLINK, 0, body, device, step, what)


def _newaddr(device: str, index: int, cidr: str, step: str = "address") -> _Req:
    iface = ipaddress.ip_interface(cidr)
    family = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
    body = _IFADDRMSG.pack(family, iface.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    body += _attr(IFA_LOCAL, iface.ip.packed) + _attr(IFA_ADDRESS, iface.ip.packed)
    return _Req(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, device, step, cidr, (errno.EEXIST,))


def _newroute(device: str, index: int, route: Route, step: str = "route") -> _Req:
    dst = ipaddress.ip_network(route.dst, strict=False) if route.dst else None
    table = route.table or 254
    body = _RTMSG.pack(route.family, dst.prefixlen if dst else 0, 0, 0, table if table < 256 else 0,
                       route.proto, route.scope, RTN_UNICAST, 0)
    body += _attr(RTA_TABLE, struct.pack("=I", table)) + _attr(RTA_OIF, struct.pack("=i", index))
    if dst is not None:
        body += _attr(RTA_DST, dst.network_address.packed)
    if route.gateway:
        body += _attr(RTA_GATEWAY, ipaddress.ip_address(route.gateway).packed)
    if route.prefsrc:
        body += _attr(RTA_PREFSRC, ipaddress.ip_address(route.prefsrc).packed)
    if route.priority is not None:
        body += _attr(RTA_PRIORITY, struct.pack("=I", route.priority))
    what = f"{route.dst or 'default'} via {route.gateway or '-'} table {table}"
    return _Req(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body, device, step, what, (errno.EEXIST,))


def _config_reqs(device: str, index: int, addresses: list[str], routes: list[Route], up: bool) -> list[_Req]:
    """Addresses, then link up, then routes (link-scope first so gateways resolve)."""
    reqs = [_newaddr(device, index, a) for a in addresses]
    if up:
        reqs.append(_newlink(device, index, up=True, step="link-up"))
    reqs += [_newroute(device, index, r) for r in sorted(routes, key=lambda r: r.gateway is not None)]
    return reqs


class Namespaces:
    """Netlink sockets in the host netns and in pod netns, opened from one thread.

    ``host_netns`` is a path to the host network namespace (``/proc/1/ns/net`` in a
    hostNetwork DaemonSet with hostPID, or a bind mount the daemon keeps).
    """

    def __init__(self, host_netns: str = "/proc/1/ns/net") -> None:
        self.host_netns = host_netns
        self.host_fd = os.open(host_netns, os.O_RDONLY | os.O_CLOEXEC)
        self._libc = _libc()
        self._local = threading.local()  # pyroute2 sockets are per thread

    @contextlib.contextmanager
    def _inside(self, ns_fd: int) -> Iterator[None]:
        """Run the body with this thread in ``ns_fd``'s netns (sockets created there stay there)."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self._libc.setns(ns_fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into target netns failed")
            try:
                yield
            finally:
                if self._libc.setns(own, CLONE_NEWNET) != 0:
                    # Staying in the pod netns would corrupt every later call: fail loudly.
                    raise OSError(ctypes.get_errno(), "setns back to own netns failed")
        finally:
            os.close(own)

    def _rtnl_in(self, ns_fd: int) -> Rtnl:
        with self._inside(ns_fd):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        sock.bind((0, 0))
        return Rtnl(sock)

    def host(self) -> IPRoute:
        """The (cached, per-thread) pyroute2 IPRoute in the host netns, for dumps."""
        ipr = getattr(self._local, "host", None)
        if ipr is None:
            with self._inside(self.host_fd):
                ipr = IPRoute()
                _ = ipr.socket  # force socket creation now, inside the host netns
            self._local.host = ipr
        return ipr

    def host_rtnl(self) -> Rtnl:
        """The (cached, per-thread) raw rtnetlink socket in the host netns."""
        rtnl = getattr(self._local, "rtnl", None)
        if rtnl is None:
            rtnl = self._rtnl_in(self.host_fd)
            self._local.rtnl = rtnl
        return rtnl

    @contextlib.contextmanager
    def pod(self, netns_path: str) -> Iterator[tuple[Rtnl, int]]:
        """(raw rtnetlink socket, fd) for the pod netns at ``netns_path``; raises :class:`NetnsGone`."""
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise NetnsGone(netns_path) from exc
        try:
            if not _is_netns(fd):
                raise NetnsGone(netns_path)  # e.g. a bind mount whose namespace was released
            rtnl = self._rtnl_in(fd)
            try:
                yield rtnl, fd
            finally:
                rtnl.close()
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close this thread's host sockets and the host netns fd."""
        for attr in ("host", "rtnl"):
            obj = getattr(self._local, attr, None)
            if obj is not None:
                obj.close()
                setattr(self._local, attr, None)
        with contextlib.suppress(OSError):
            os.close(self.host_fd)


def _is_netns(fd: int) -> bool:
    # An unmounted /run/netns/<name> file is a plain empty file, not an nsfs inode.
    NSFS_MAGIC = 0x6E736673
    buf = ctypes.create_string_buffer(120)
    if _libc().fstatfs(fd, buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], "little") == NSFS_MAGIC


def _pci_address(ifname: str, sysfs_root: str = "/sys") -> str | None:
    try:
        target = os.readlink(f"{sysfs_root}/class/net/{ifname}/device")
    except OSError:
        return None
    return Path(target).name


def record_host(ns: Namespaces, ifnames: list[str], sysfs_root: str = "/sys") -> dict[str, LinkState]:
    """Snapshot name, MTU, MAC, global addresses and routes of ``ifnames``.

    One RTM_GETLINK per NIC plus one address and one route dump in total (raw netlink). Routes
    from every table are kept except what the kernel recreates by itself (``proto
    kernel``, the local table), non-unicast ones and multipath ones. Raises
    ``KeyError`` naming a missing link.
    """
    rtnl = ns.host_rtnl()
    by_index: dict[int, LinkState] = {}
    states: dict[str, LinkState] = {}
    for ifname in ifnames:
        link = rtnl.link(ifname)
        if link is None:
            raise KeyError(f"link {ifname} not found in the host namespace")
        state = LinkState(ifname=ifname, mtu=link.mtu, mac=link.mac, permanent_mac=link.permanent_mac,
                          pci_address=_pci_address(ifname, sysfs_root), index=link.index)
        by_index[link.index] = state
        states[ifname] = state
    for payload in rtnl.dump(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        _family, prefixlen, _flags, scope, index = _IFADDRMSG.unpack_from(payload)
        owner = by_index.get(index)
        if owner is None or scope != RT_SCOPE_UNIVERSE:
            continue
        attrs = _attrs(payload, _IFADDRMSG.size)
        raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)  # IFA_LOCAL: ours on point-to-point links
        if raw:
            owner.addresses.append(f"{ipaddress.ip_address(raw)}/{prefixlen}")
    for payload in rtnl.dump(RTM_GETROUTE, _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)):
        family, dst_len, _src_len, _tos, table, proto, scope, rtype, _flags = _RTMSG.unpack_from(payload)
        if rtype != RTN_UNICAST or proto == RTPROT_KERNEL:
            continue
        attrs = _attrs(payload, _RTMSG.size)
        oif = attrs.get(RTA_OIF)
        via = by_index.get(struct.unpack("=i", oif)[0]) if oif else None  # multipath: no RTA_OIF
        if via is None:
            continue
        if RTA_TABLE in attrs:
            table = struct.unpack("=I", attrs[RTA_TABLE])[0]
        if table == RT_TABLE_LOCAL:
            continue
        dst = _ip_attr(attrs, RTA_DST)
        via.routes.append(Route(
            dst=f"{dst}/{dst_len}" if dst is not None else None, gateway=_ip_attr(attrs, RTA_GATEWAY),
            prefsrc=_ip_attr(attrs, RTA_PREFSRC), table=table,
            priority=struct.unpack("=I", attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else None,
            scope=scope, proto=proto, family=family))
    return states


def move_link(rtnl: Rtnl, device: str, ifname: str, target_fd: int, new_name: str,
              mtu: int | None = None, mac: str | None = None, index: int | None = None) -> None:
    """Move ``ifname`` (in ``rtnl``'s netns) to ``target_fd``'s netns, renamed, in one RTM_NEWLINK.

    ``index`` (from :func:`record_host`) saves a lookup.
    """
    if index is None:
        link = rtnl.link(ifname)
        if link is None:
            raise NetnsOpError(device, "move", f"link {ifname} not found")
        index = link.index
    rtnl.run([_newlink(device, index, ns_fd=target_fd, ifname=new_name, mtu=mtu, mac=mac, step="move")])


def configure_pod_links(rtnl: Rtnl, configs: dict[str, PodLinkConfig]) -> dict[str, PodLinkResult]:
    """Addresses, link up and routes for moved NICs (keyed by device name), in the pod netns.

    All NICs' requests go to the kernel in one pipelined batch.
    """
    reqs: list[_Req] = []
    results = {}
    for device, cfg in configs.items():
        link = rtnl.link(cfg.ifname)
        if link is None:
            raise NetnsOpError(device, "configure", f"{cfg.ifname} not found in the pod namespace")
        reqs += _config_reqs(device, link.index, cfg.addresses, cfg.routes, up=True)
        results[device] = PodLinkResult(cfg.ifname, link.mac, list(cfg.addresses))
    rtnl.run(reqs)
    return results


def restore_host_link(rtnl: Rtnl, device: str, link: LinkInfo, state: LinkState) -> None:
    """Give a NIC that is back in the host netns its name, MTU, MAC, addresses and routes."""
    reqs: list[_Req] = []
    rename = link.ifname != state.ifname
    remac = bool(state.mac) and link.mac.lower() != state.mac.lower()
    if rename or remac:
        reqs.append(_newlink(device, link.index, up=False, step="restore-link"))  # rename/MAC need it down
    if rename or remac or (state.mtu and link.mtu != state.mtu):
        reqs.append(_newlink(device, link.index, ifname=state.ifname if rename else None,
                             mtu=state.mtu if state.mtu and link.mtu != state.mtu else None,
                             mac=state.mac if remac else None, step="restore-link"))
    # Routes need the link up; the Go driver also sets it up on return.
    reqs += _config_reqs(device, link.index, state.addresses, state.routes, up=True)
    rtnl.run(reqs)


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
        with ns.pod(netns_path) as (pod, _):
            link = pod.link(pod_ifname)
            if link is not None and _mac_matches(link, state, extra_macs):
                mac = state.mac if state.mac and link.mac.lower() != state.mac.lower() else None
                mtu = state.mtu if state.mtu and link.mtu != state.mtu else None
                pod.run([_newlink(device, link.index, ns_fd=ns.host_fd, ifname=state.ifname, mtu=mtu, mac=mac,
                                  step="return")])
            else:
                how = "host"
    except NetnsGone:
        how = "netns-gone"
    rtnl = ns.host_rtnl()
    host_link = rtnl.link(state.ifname)
    if host_link is None or not _mac_matches(host_link, state, extra_macs):
        index = find_host_link(ns.host(), state, extra_macs, sysfs_root)
        if index is None:
            raise NetnsOpError(device, "find", f"{state.ifname} (MAC {state.mac}) is neither in "
                                               f"{netns_path} nor in the host namespace")
        name = ns.host().link("get", index=index)[0].get("IFLA_IFNAME")
        host_link = rtnl.link(name)
        if host_link is None:
            raise NetnsOpError(device, "find", f"{name} vanished while restoring {state.ifname}")
    restore_host_link(rtnl, device, host_link, state)
    return how


def _mac_matches(link: LinkInfo, state: LinkState, extra_macs: tuple[str, ...]) -> bool:
    macs = {m.lower() for m in (state.mac, state.permanent_mac, *extra_macs) if m}
    return not macs or link.mac.lower() in macs or (link.permanent_mac or "").lower() in macs


def find_host_link(ipr: IPRoute, state: LinkState, extra_macs: tuple[str, ...] = (),
                   sysfs_root: str = "/sys") -> int | None:
    """Index of the host link that is this NIC (slow path, one dump): permanent MAC, PCI, MAC."""
    links = ipr.link("dump")
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
