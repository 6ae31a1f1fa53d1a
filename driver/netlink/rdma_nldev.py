"""RDMA netlink (``NETLINK_RDMA``, ``nldev``): the netns mode, RDMA devices listed, moved between
namespaces, soft ones (rxe, siw) made and deleted, and whether this kernel's rxe has namespaces.

Messages, from the kernel's uapi ``include/uapi/rdma/rdma_netlink.h`` (raw netlink, no genetlink
header; the message type is ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd) = (5 << 10) + cmd``):

- mode: ``RDMA_NLDEV_CMD_SYS_GET``; the answer's ``RDMA_NLDEV_SYS_ATTR_NETNS_MODE`` (u8) is
  ``ib_devices_shared_netns``: 1 shared, 0 exclusive;
- index of a device: a ``RDMA_NLDEV_CMD_GET`` dump, each answer carrying ``RDMA_NLDEV_ATTR_DEV_INDEX``
  (u32) and ``RDMA_NLDEV_ATTR_DEV_NAME`` (string) of a device visible in the socket's namespace;
- move: ``RDMA_NLDEV_CMD_SET`` with ``RDMA_NLDEV_ATTR_DEV_INDEX`` and ``RDMA_NLDEV_NET_NS_FD`` (u32, an
  fd of the target namespace), sent from the namespace the device is in (``rdma dev set <dev> netns <ns>``);
- soft devices: ``RDMA_NLDEV_CMD_NEWLINK`` (``rdma link add NAME type rxe netdev NIC``) and
  ``RDMA_NLDEV_CMD_DELLINK``; a port's netdev from a ``RDMA_NLDEV_CMD_PORT_GET`` dump.

A kernel without RDMA netlink (no ``NETLINK_RDMA`` family, e.g. no ``ib_core``) has no exclusive
mode to honour: the mode is reported as ``unknown`` and treated as shared. What a NIC's RDMA device
does when the NIC moves is ``driver.nic_settings.rdma``'s.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    RTM_NEWLINK,
    NetlinkChannel,
    attr,
    parse_attrs,
    text,
)

log = logging.getLogger(__name__)

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_NEWLINK = 3
RDMA_NLDEV_CMD_DELLINK = 4
RDMA_NLDEV_CMD_PORT_GET = 5
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_ATTR_NDEV_NAME = 51
RDMA_NLDEV_ATTR_LINK_TYPE = 65
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68
SHARED, EXCLUSIVE, UNKNOWN = "shared", "exclusive", "unknown"
RXE_PORT = 4791
"""RoCE v2's UDP port: rxe's socket listens on it (in the namespace of its link from Linux 7.1)."""
UNREGISTER_WAIT = 5.0
"""Seconds a returning NIC waits for the kernel to finish unregistering its old soft RDMA device."""


class RdmaMoveError(Exception):
    """An RDMA device could not be moved; names the device and the reason."""

    def __init__(self, device: str, reason: str, code: int = 0) -> None:
        super().__init__(f"RDMA device {device}: {reason}")
        self.device, self.reason, self.code = device, reason, code


def nldev_type(cmd: int) -> int:
    """``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd)``."""
    return (RDMA_NL_NLDEV << 10) + cmd


def sys_get_request() -> tuple[int, int, bytes]:
    """(type, flags, body) of the netns-mode query."""
    return nldev_type(RDMA_NLDEV_CMD_SYS_GET), NLM_F_REQUEST, b""


def set_netns_request(index: int, netns_fd: int) -> tuple[int, int, bytes]:
    """(type, flags, body) moving device ``index`` into the namespace of ``netns_fd``."""
    body = attr(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", index)) + attr(
        RDMA_NLDEV_NET_NS_FD, struct.pack("=I", netns_fd)
    )
    return nldev_type(RDMA_NLDEV_CMD_SET), NLM_F_REQUEST | NLM_F_ACK, body


def newlink_request(name: str, link_type: str, netdev: str) -> tuple[int, int, bytes]:
    """(type, flags, body) making soft RDMA device ``name`` of ``link_type`` (rxe, siw) on ``netdev``."""
    body = (
        attr(RDMA_NLDEV_ATTR_DEV_NAME, name.encode() + b"\0")
        + attr(RDMA_NLDEV_ATTR_LINK_TYPE, link_type.encode() + b"\0")
        + attr(RDMA_NLDEV_ATTR_NDEV_NAME, netdev.encode() + b"\0")
    )
    return nldev_type(RDMA_NLDEV_CMD_NEWLINK), NLM_F_REQUEST | NLM_F_ACK, body


def dellink_request(index: int) -> tuple[int, int, bytes]:
    """(type, flags, body) deleting soft RDMA device ``index`` (``rdma link delete NAME``)."""
    body = attr(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", index))
    return nldev_type(RDMA_NLDEV_CMD_DELLINK), NLM_F_REQUEST | NLM_F_ACK, body


def parse_port_netdevs(payloads: list[bytes]) -> dict[str, tuple[int, str | None]]:
    """Device name -> (index, its port's netdev) from ``RDMA_NLDEV_CMD_PORT_GET`` dump answers; the
    kernel names the netdev only when it is in the asking socket's namespace (else None)."""
    out: dict[str, tuple[int, str | None]] = {}
    for payload in payloads:
        attrs = parse_attrs(payload, 0)
        if RDMA_NLDEV_ATTR_DEV_INDEX not in attrs or RDMA_NLDEV_ATTR_DEV_NAME not in attrs:
            continue
        name = text(attrs[RDMA_NLDEV_ATTR_DEV_NAME])
        index = struct.unpack_from("=I", attrs[RDMA_NLDEV_ATTR_DEV_INDEX])[0]
        netdev = text(attrs[RDMA_NLDEV_ATTR_NDEV_NAME]) if RDMA_NLDEV_ATTR_NDEV_NAME in attrs else None
        if netdev is not None or name not in out:
            out[name] = (index, netdev)
    return out


def parse_netns_mode(payload: bytes) -> str:
    """The mode in a ``RDMA_NLDEV_CMD_SYS_GET`` answer."""
    raw = parse_attrs(payload, 0).get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
    if raw is None or len(raw) < 1:
        return UNKNOWN
    return SHARED if raw[0] == 1 else EXCLUSIVE if raw[0] == 0 else UNKNOWN


def parse_devices(payloads: list[bytes]) -> dict[str, int]:
    """Device name -> index from ``RDMA_NLDEV_CMD_GET`` dump answers."""
    out = {}
    for payload in payloads:
        attrs = parse_attrs(payload, 0)
        if RDMA_NLDEV_ATTR_DEV_INDEX in attrs and RDMA_NLDEV_ATTR_DEV_NAME in attrs:
            out[text(attrs[RDMA_NLDEV_ATTR_DEV_NAME])] = struct.unpack_from("=I", attrs[RDMA_NLDEV_ATTR_DEV_INDEX])[0]
    return out


def open_rdma_socket() -> socket.socket:
    """A ``NETLINK_RDMA`` socket in the calling thread's namespace (``OSError`` when the kernel has none)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_RDMA)
    sock.bind((0, 0))
    return sock


def netns_mode(open_socket: Callable[[], socket.socket] = open_rdma_socket) -> str:
    """``shared``, ``exclusive``, or ``unknown`` (no RDMA netlink in this kernel, or no answer)."""
    try:
        sock = open_socket()
    except OSError as exc:
        log.info(
            "no RDMA netlink in this kernel; RDMA netns mode unknown (treated as shared)",
            extra={"kv": {"error": str(exc)}},
        )
        return UNKNOWN
    channel = NetlinkChannel(sock)
    try:
        (reply,) = channel.exchange([sys_get_request()])
    except OSError as exc:
        log.info("RDMA netns mode query failed (treated as shared)", extra={"kv": {"error": str(exc)}})
        return UNKNOWN
    finally:
        channel.close()
    if reply.error or not reply.payloads:
        return UNKNOWN
    return parse_netns_mode(reply.payloads[0])


def move(channel: NetlinkChannel, device: str, netns_fd: int) -> None:
    """Move RDMA ``device`` (visible in ``channel``'s namespace) into ``netns_fd``'s, or :class:`RdmaMoveError`."""
    try:
        indexes = parse_devices(channel.dump(nldev_type(RDMA_NLDEV_CMD_GET), b""))
    except OSError as exc:
        raise RdmaMoveError(device, f"cannot list RDMA devices: {exc}") from None
    if device not in indexes:
        raise RdmaMoveError(device, "not in the namespace it should move from (gone, or moved by someone else)")
    (reply,) = channel.exchange([set_netns_request(indexes[device], netns_fd)])
    if reply.error:
        why = reply.message or os.strerror(reply.error)
        if reply.error == errno.EOPNOTSUPP:
            why = f"its driver cannot change network namespace ({why})"
        raise RdmaMoveError(device, f"move refused: {why}")


def make_soft_device(channel: NetlinkChannel, name: str, link_type: str, netdev: str) -> None:
    """Make soft RDMA device ``name`` on ``netdev`` in ``channel``'s namespace; :class:`RdmaMoveError`
    when the kernel refuses (a name taken included)."""
    (reply,) = channel.exchange([newlink_request(name, link_type, netdev)])
    if reply.error:
        why = f"{link_type} on {netdev}: {reply.message or os.strerror(reply.error)}"
        raise RdmaMoveError(name, why, reply.error)


def make_once_freed(
    channel: NetlinkChannel,
    sysfs_root: str,
    name: str,
    link_type: str,
    netdev: str,
    *,
    existing_ok: bool,
    wait: float = UNREGISTER_WAIT,
) -> None:
    """Make soft RDMA device ``name`` on ``netdev`` in ``channel``'s namespace once an old one of
    that name has gone. A NIC's move destroys its soft device from a work queue, a moment later:
    its name may still be in sysfs, or have left sysfs but not yet the RDMA core's names (EEXIST),
    so both are waited for, up to ``wait`` seconds. ``existing_ok``: a registered device of that
    name whose port is ``netdev`` is the one wanted (made already, e.g. by a return retried after a
    crash); a name still in sysfs is not enough, the old device stays there while it unregisters.
    :class:`RdmaMoveError` otherwise (``code`` EEXIST when the old name was not freed in time)."""

    def made() -> bool:
        try:
            dump = channel.dump(nldev_type(RDMA_NLDEV_CMD_PORT_GET), b"")
        except OSError:  # a dump cut short by devices made or deleted meanwhile: not known made
            return False
        found = parse_port_netdevs(dump).get(name)
        return found is not None and found[1] == netdev

    if existing_ok and made():
        return
    left = Path(sysfs_root, "class/infiniband", name)
    deadline = time.monotonic() + wait
    while left.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while True:
        try:
            make_soft_device(channel, name, link_type, netdev)
            return
        except RdmaMoveError as exc:
            if exc.code == errno.EEXIST and existing_ok and made():
                return
            if exc.code != errno.EEXIST or time.monotonic() >= deadline:
                raise
        time.sleep(0.05)


def delete_soft_device(channel: NetlinkChannel, name: str, netdev: str | None = None) -> bool:
    """Delete soft RDMA device ``name`` as ``channel``'s namespace sees it; with ``netdev``, only
    while its port's netdev is that one in this namespace. True when one was deleted."""
    found = parse_port_netdevs(channel.dump(nldev_type(RDMA_NLDEV_CMD_PORT_GET), b"")).get(name)
    if found is None or (netdev is not None and found[1] != netdev):
        return False
    (reply,) = channel.exchange([dellink_request(found[0])])
    if reply.error and reply.error != errno.ENODEV:
        raise RdmaMoveError(name, f"delete refused: {reply.message or os.strerror(reply.error)}")
    return not reply.error


CLONE_NEWNET = 0x40000000
PROBE_IFNAME = "dranet-rxeprobe"
PROBE_RDMA = "dranet_rxeprobe"


def rxe_netns_probe(sysfs_root: str = "/sys") -> tuple[bool, str]:
    """(capable, why): whether an rxe device made in a network namespace carries that namespace's
    traffic (Linux 7.1 on), asked of the kernel in a throwaway namespace: a thread of its own
    enters a new one (``unshare``, that thread only), makes a veth and an rxe link on it there,
    and binds UDP 4791 there: EADDRINUSE only when rxe opened its socket in that namespace (before
    7.1 it is in the host's, the bind succeeds). The rxe link is deleted and the namespace goes
    with the thread. Not asked (False) while ``rdma_rxe`` is not loaded: no rxe device exists."""
    if not Path(sysfs_root, "module/rdma_rxe").exists():
        return False, "rdma_rxe is not loaded (no Soft-RoCE device on this node)"
    answer: list[tuple[bool, str]] = []
    thread = threading.Thread(target=lambda: answer.append(_probe_here()), name="rxe-netns-probe", daemon=True)
    thread.start()
    thread.join(30)
    return answer[0] if answer else (False, "the probe did not finish in 30 s")


def _probe_here() -> tuple[bool, str]:
    """The probe, in this thread: it never leaves the namespace it makes (the thread ends)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return False, f"cannot make a throwaway network namespace: {os.strerror(ctypes.get_errno())}"
    rtnl = NetlinkChannel(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE))
    try:
        iff_up = 0x1
        body = (
            IFINFOMSG.pack(0, 0, 0, iff_up, iff_up)
            + attr(IFLA_IFNAME, PROBE_IFNAME.encode() + b"\0")
            + attr(IFLA_LINKINFO, attr(IFLA_INFO_KIND, b"veth"))
        )
        (reply,) = rtnl.exchange([(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)])
        if reply.error:
            return False, f"no veth in the throwaway namespace: {os.strerror(reply.error)}"
    finally:
        rtnl.close()
    try:
        channel = NetlinkChannel(open_rdma_socket())
    except OSError as exc:
        return False, f"no RDMA netlink: {exc}"
    try:
        try:
            make_soft_device(channel, PROBE_RDMA, "rxe", PROBE_IFNAME)
        except RdmaMoveError as exc:
            return False, f"no rxe link in a namespace: {exc.reason}"
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(("0.0.0.0", RXE_PORT))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True, "rxe's UDP socket is in the namespace of its link"
            return False, f"bind of UDP {RXE_PORT} in the throwaway namespace: {exc}"
        finally:
            udp.close()
        return False, "rxe's UDP socket is not in the namespace of its link (the host's carries it: before Linux 7.1)"
    finally:
        try:
            delete_soft_device(channel, PROBE_RDMA)
        except (RdmaMoveError, OSError) as exc:
            log.warning("rxe probe device not deleted (goes with its namespace)", extra={"kv": {"error": str(exc)}})
        channel.close()
