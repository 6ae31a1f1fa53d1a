"""The one netlink socket layer: message framing, sequence numbers, pipelined requests and acks.

Every netlink client of the driver speaks through it: :class:`driver.netlink.rtnl.Rtnl`
(``NETLINK_ROUTE``) and :class:`driver.netlink.ethtool_genl.Ethtool` (generic netlink, ethtool
family) for the NIC moves, :mod:`driver.inventory.netlink_facts` for discovery's link, address
and route dumps, :mod:`driver.netlink.link_watch` for link events. A :class:`NetlinkChannel`
wraps a socket bound to one network namespace; requests sent together go to the kernel in one
``send`` and their answers are matched by sequence number, each with its own errno and the
kernel's error text. Requests are raw ``(type, flags, body)`` (:meth:`NetlinkChannel.exchange`,
the rtnetlink encoders) or pyroute2 message objects (:meth:`NetlinkChannel.exchange_messages`,
ethtool); the whole reply messages are kept for pyroute2's classes to decode.
:func:`netlink_socket` opens a socket inside another network namespace (:func:`inside_netns`).

Why not pyroute2's sockets (measured by ``bench.bench_hooks`` and ``bench.pyroute2_floor``, the
numbers in docs/performance.md, "pyroute2 or hand-packed netlink"): one ``IPRoute`` opened in a
pod's namespace costs several times this socket (``IPRoute(netns=...)`` forks a helper process),
its batch call (``nlm_request_batch``) raises for the first failed request instead of answering
each one, and the floor's kernel work of one pod start through it costs more than the project's
1 ms rule allows.

Plumbing below both ``driver.netlink`` and ``driver.inventory``: imports the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import socket
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

CLONE_NEWNET = 0x40000000

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200  # flags of an error message (extended ack)
NLA_F_NESTED = 0x8000
SOL_NETLINK, NETLINK_CAP_ACK, NETLINK_EXT_ACK = 270, 10, 11
NLMSGERR_ATTR_MSG = 1
NLMSGHDR = struct.Struct("=IHHII")
NETLINK_GET_STRICT_CHK = 12  # dump requests honour their filter fields (e.g. one link's addresses)

# rtnetlink (NETLINK_ROUTE) message types, attributes and headers both raw clients use.
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_GETADDR, RTM_NEWROUTE, RTM_GETROUTE = 20, 22, 24, 26
RTMGRP_LINK = 0x1
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER, IFLA_OPERSTATE = 1, 3, 4, 10, 16
IFLA_LINKINFO, IFLA_IFALIAS, IFLA_NET_NS_FD, IFLA_PERM_ADDRESS = 18, 20, 28, 54
IFLA_INFO_KIND = 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_MULTIPATH, RTA_TABLE = 1, 4, 5, 6, 7, 9, 15
IFINFOMSG = struct.Struct("=BxHiII")  # family, type (ARPHRD_*), index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTNEXTHOP = struct.Struct("=HBBi")  # len, flags, hops, ifindex (one hop of RTA_MULTIPATH)
RT_TABLE_MAIN = 254
RTN_UNICAST = 1  # a route of type unicast (not local, broadcast, blackhole...)

ACK_COST = 1 << 10
"""Receive-buffer bytes an ack or error takes (832 measured on 6.18, plus the request when the
kernel echoes it: no ``NETLINK_CAP_ACK``)."""
REPLY_COST = 8 << 10
"""Receive-buffer bytes a reply to a GET takes (2,304 measured for a veth's RTM_GETLINK; a NIC with
virtual functions answers more)."""


def mac_str(raw: bytes) -> str:
    """Raw hardware address bytes as ``aa:bb:..``."""
    return ":".join(f"{b:02x}" for b in raw)


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, for ``setns`` and ``fstatfs`` (errno kept); loaded once: each load builds
    a new function-pointer class, twice per pod start otherwise (its cost: docs/performance.md,
    "Small costs the code's choices rest on")."""
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def inside_netns(ns_fd: int, c: ctypes.CDLL | None = None) -> Iterator[None]:
    """Run the body with this thread in ``ns_fd``'s netns (sockets created there stay there)."""
    c = c or libc()
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if c.setns(ns_fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into target netns failed")
        try:
            yield
        finally:
            if c.setns(own, CLONE_NEWNET) != 0:
                # Staying in the pod netns would corrupt every later call: fail loudly.
                raise OSError(ctypes.get_errno(), "setns back to own netns failed")
    finally:
        os.close(own)


def netlink_socket(
    proto: int, ns_fd: int | None = None, groups: int = 0, c: ctypes.CDLL | None = None
) -> socket.socket:
    """A bound raw netlink socket of protocol ``proto`` in ``ns_fd``'s netns (None: this thread's).

    ``groups``: the multicast groups to join (e.g. ``RTMGRP_LINK`` for link events).
    """
    if ns_fd is None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, proto)
    else:
        with inside_netns(ns_fd, c):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, proto)
    try:
        sock.bind((0, groups))
    except OSError:
        sock.close()
        raise
    return sock


def open_netns(name_or_path: str) -> int:
    """An fd of a network namespace given as a path or as a name under ``/run/netns``."""
    path = name_or_path if "/" in name_or_path else f"/run/netns/{name_or_path}"
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)


def attr(kind: int, data: bytes) -> bytes:
    """One netlink attribute (header + data, padded to 4 bytes)."""
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


IFLA_EXT_MASK = 29
RTEXT_FILTER_SKIP_STATS = 1 << 3
SKIP_STATS = attr(IFLA_EXT_MASK, struct.pack("=I", RTEXT_FILTER_SKIP_STATS))
"""Appended to an RTM_GETLINK: the answer leaves out the (large) statistics blocks."""


def attr_list(data: bytes, off: int = 0) -> list[tuple[int, bytes]]:
    """Attributes from ``off`` on, in order, repeats kept (type without flag bits, data)."""
    out = []
    while off + 4 <= len(data):
        alen, kind = struct.unpack_from("=HH", data, off)
        if alen < 4:
            break
        out.append((kind & 0x3FFF, data[off + 4 : off + alen]))
        off += (alen + 3) & ~3
    return out


def parse_attrs(payload: bytes, off: int) -> dict[int, bytes]:
    """Top-level attributes from ``off`` on (type -> data; a repeated type keeps its last)."""
    return dict(attr_list(payload, off))


_ATTR_HEADER = struct.Struct("=HH")


def pick_attrs(payload: bytes, off: int, wanted: frozenset[int]) -> dict[int, bytes]:
    """The ``wanted`` top-level attributes from ``off`` on (type -> data), stopping once all are
    found. A link message carries ~50 attributes, some of them kilobytes (per-family blocks):
    only the few asked for are copied."""
    out: dict[int, bytes] = {}
    end, need = len(payload), len(wanted)
    unpack = _ATTR_HEADER.unpack_from
    while off + 4 <= end:
        alen, kind = unpack(payload, off)
        if alen < 4:
            break
        kind &= 0x3FFF
        if kind in wanted:
            out[kind] = payload[off + 4 : off + alen]
            if len(out) == need:
                break
        off += (alen + 3) & ~3
    return out


def text(raw: bytes) -> str:
    """A NUL-terminated string attribute."""
    return raw.split(b"\0", 1)[0].decode()


@dataclass
class Reply:
    """The kernel's answer to one request: errno (0 = success), reply payloads, extended-ack text.

    ``frames``: the same replies as whole messages (header included), for pyroute2's classes."""

    error: int = 0
    payloads: list[bytes] = field(default_factory=list)
    message: str = ""
    frames: list[bytes] = field(default_factory=list)


class Message(Protocol):
    """A netlink message that encodes itself: a pyroute2 ``nlmsg`` (its header's type and flags set)."""

    data: bytes

    def __getitem__(self, key: str) -> dict[str, int]: ...

    def encode(self) -> object: ...


class NetlinkChannel:
    """A raw netlink socket in one namespace; requests are pipelined and matched by sequence number.

    ``ext_ack`` asks the kernel for its error strings (extended ack) and for short acks.
    """

    def __init__(self, sock: socket.socket, ext_ack: bool = False) -> None:
        self.sock = sock
        if ext_ack:
            for opt in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
                try:
                    sock.setsockopt(SOL_NETLINK, opt, 1)
                except OSError:
                    pass  # older kernels: plain errno messages
        self.seq = int.from_bytes(os.urandom(2), "little") << 8
        self._window_bytes = 0  # read from the socket at the first batch of several requests

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def exchange(self, requests: list[tuple[int, int, bytes]]) -> list[Reply]:
        """Send ``(type, flags, body)`` requests in one ``send``; one :class:`Reply` each, in order.

        A request with ``NLM_F_ACK`` is complete at its ack (or error), its replies before it
        collected; one without is complete at its first reply (a GET).
        """
        out, pending = [], {}
        for kind, flags, body in requests:
            self.seq += 1
            pending[self.seq] = bool(flags & NLM_F_ACK)
            out.append(NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, flags, self.seq, 0) + body)
        return self._answers(out, pending, frames=False)

    def exchange_messages(self, messages: Sequence[Message]) -> list[Reply]:
        """Like :meth:`exchange` for pyroute2 messages: each gets the next sequence number and is
        encoded by its class; one :class:`Reply` each, in order (its ``frames`` to decode)."""
        out, pending = [], {}
        for msg in messages:
            self.seq += 1
            header = msg["header"]
            header["sequence_number"], header["pid"] = self.seq, 0
            pending[self.seq] = bool(header["flags"] & NLM_F_ACK)
            msg.encode()
            out.append(bytes(msg.data))
        return self._answers(out, pending, frames=True)

    @property
    def window_bytes(self) -> int:
        """Answers a window of pipelined requests may queue at once: half the receive buffer (the
        rest for a reply larger than its estimate, or a multicast event on a socket in a group)."""
        if not self._window_bytes:
            self._window_bytes = max(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 2, REPLY_COST)
        return self._window_bytes

    def _answers(self, requests: list[bytes], acked: dict[int, bool], frames: bool) -> list[Reply]:
        """Send the encoded ``requests`` (sequence numbers: ``acked``'s keys, in order) in windows
        whose answers fit the receive buffer, each window in one ``send``, in order.

        The kernel processes a whole ``send`` before we read, queueing an answer per request; past
        the receive buffer (about 256 acks by default) it drops them and the socket reports
        ENOBUFS. A window's answers are read before the next window is sent.
        """
        replies = {s: Reply() for s in acked}
        seqs = list(acked)
        start = 0
        while start < len(seqs):
            end, size = start + 1, _answer_cost(requests[start], acked[seqs[start]])
            while end < len(seqs):
                size += _answer_cost(requests[end], acked[seqs[end]])
                if size > self.window_bytes:
                    break
                end += 1
            self.sock.send(b"".join(requests[start:end]))
            self._collect(replies, seqs[start:end], acked, frames)
            start = end
        return list(replies.values())

    def _collect(self, replies: dict[int, Reply], seqs: list[int], acked: dict[int, bool], frames: bool) -> None:
        """Read until every request of ``seqs`` is answered."""
        pending = set(seqs)
        while pending:
            data = self.sock.recv(1 << 17)
            for kind, flags, seq, off, end in _messages(data):
                if seq not in pending:
                    continue
                reply, payload = replies[seq], data[off + NLMSGHDR.size : end]
                if kind == NLMSG_ERROR:
                    reply.error = -struct.unpack_from("=i", payload)[0]
                    reply.message = _extack(payload, flags)
                    pending.discard(seq)
                else:
                    reply.payloads.append(payload)
                    if frames:
                        reply.frames.append(data[off:end])
                    if not acked[seq]:
                        pending.discard(seq)

    def dump(self, kind: int, body: bytes) -> list[bytes]:
        """A multipart dump request; the payload of every reply message."""
        self.seq += 1
        seq = self.seq
        self.sock.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        out: list[bytes] = []
        while True:
            data = self.sock.recv(1 << 17)
            for mtype, _flags, mseq, off, end in _messages(data):
                if mseq != seq:
                    continue
                payload = data[off + NLMSGHDR.size : end]
                if mtype == NLMSG_DONE:
                    return out
                if mtype == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err == errno.EINTR:  # dump interrupted by a concurrent change: the kernel asks to retry
                        return self.dump(kind, body)
                    raise OSError(err, f"netlink dump {kind}: {os.strerror(err)}")
                out.append(payload)


def _answer_cost(request: bytes, acked: bool) -> int:
    """What the answer to one request is expected to take of the receive buffer."""
    return (ACK_COST if acked else REPLY_COST) + len(request)


def _messages(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """The messages of one datagram: (type, flags, sequence number, start, end) each."""
    messages, off = [], 0
    while off + NLMSGHDR.size <= len(data):
        length, kind, flags, seq, _pid = NLMSGHDR.unpack_from(data, off)
        messages.append((kind, flags, seq, off, off + length))
        off += (length + 3) & ~3
    return messages


def _extack(payload: bytes, flags: int) -> str:
    """The kernel's error message (extended ack) of an error message, or ""."""
    if not flags & NLM_F_ACK_TLVS or len(payload) < 4 + NLMSGHDR.size:
        return ""
    orig_len = NLMSGHDR.unpack_from(payload, 4)[0]
    tlvs = payload[4 + (NLMSGHDR.size if flags & NLM_F_CAPPED else orig_len) :]
    return next((text(v) for k, v in attr_list(tlvs) if k == NLMSGERR_ATTR_MSG), "")
