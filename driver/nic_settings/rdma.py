"""RDMA devices following their netdev into the pod and back, over RDMA netlink (``NETLINK_RDMA``, ``nldev``).

The kernel's RDMA subsystem runs in one of two netns modes (``rdma system set netns shared|exclusive``):

- ``shared`` (the default): every RDMA device is visible in every network namespace; moving a NIC's
  netdev into a pod is enough, the pod reaches the RDMA device through its char devices;
- ``exclusive``: an RDMA device belongs to one namespace and must move with its netdev, or the pod
  sees no RDMA device at all (``ibv_devices`` empty).

Messages, from the kernel's uapi ``include/uapi/rdma/rdma_netlink.h`` (raw netlink, no genetlink
header; the message type is ``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd) = (5 << 10) + cmd``):

- mode: ``RDMA_NLDEV_CMD_SYS_GET``; the answer's ``RDMA_NLDEV_SYS_ATTR_NETNS_MODE`` (u8) is
  ``ib_devices_shared_netns``: 1 shared, 0 exclusive;
- index of a device: a ``RDMA_NLDEV_CMD_GET`` dump, each answer carrying ``RDMA_NLDEV_ATTR_DEV_INDEX``
  (u32) and ``RDMA_NLDEV_ATTR_DEV_NAME`` (string) of a device visible in the socket's namespace;
- move: ``RDMA_NLDEV_CMD_SET`` with ``RDMA_NLDEV_ATTR_DEV_INDEX`` and ``RDMA_NLDEV_NET_NS_FD`` (u32, an
  fd of the target namespace), sent from the namespace the device is in (``rdma dev set <dev> netns <ns>``).

A kernel without RDMA netlink (no ``NETLINK_RDMA`` family, e.g. no ``ib_core``) has no exclusive
mode to honour: the mode is reported as ``unknown`` and treated as shared.

In exclusive mode (found at daemon start) a NIC's RDMA device is recorded before the move and
moved into the pod right after its netdev; at return it comes back before the netdev leaves (as
the Go driver does), best effort: one left behind returns to the host when the pod's namespace is
destroyed (kernel), and the netdev is never kept hostage for it.

A soft RDMA device (Soft-RoCE ``rxe``, soft-iWARP ``siw``: no bus device) cannot follow its netdev
in either mode: its driver cannot change namespace (EOPNOTSUPP) and the kernel destroys it when
its netdev leaves the host's namespace. Known before the move (sysfs), the NIC then goes into the
pod without it: the record says so (``{"soft": name, "type": ..., "reason": ...}``), the containers
get none of its char devices and no ``NCCL_IB_HCA``, the claim's status says why, and once the NIC
is home the device is made again on it (``RDMA_NLDEV_CMD_NEWLINK``, ``rdma link add NAME type
rxe netdev NIC``), under the same name.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from driver.checkpoint.state import MovedDevice
from driver.inventory.rdma import soft_device_problem
from driver.inventory.sysfs import SysfsReader
from driver.netlink.channel import NLM_F_ACK, NLM_F_REQUEST, NetlinkChannel, attr, parse_attrs, text
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns

log = logging.getLogger(__name__)

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_NEWLINK = 3
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_ATTR_NDEV_NAME = 51
RDMA_NLDEV_ATTR_LINK_TYPE = 65
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68
SHARED, EXCLUSIVE, UNKNOWN = "shared", "exclusive", "unknown"
UNREGISTER_WAIT = 5.0
"""Seconds a returning NIC waits for the kernel to finish unregistering its old soft RDMA device."""


class RdmaMoveError(Exception):
    """An RDMA device could not be moved; names the device and the reason."""

    def __init__(self, device: str, reason: str) -> None:
        super().__init__(f"RDMA device {device}: {reason}")
        self.device, self.reason = device, reason


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


def move_between(host: HostNetns, device: str, rdma_device: str, from_fd: int, to_fd: int) -> None:
    """Move ``rdma_device`` (of NIC ``device``) between namespaces; :class:`NetnsOpError` naming the
    device if it cannot (the kernel's reason, once)."""
    try:
        channel = NetlinkChannel(host.ns.socket_in(from_fd, NETLINK_RDMA))
    except OSError as exc:  # no RDMA netlink: the device cannot follow its netdev, refuse the pod
        raise NetnsOpError(device, "rdma move", f"RDMA device {rdma_device}: no RDMA netlink: {exc}") from exc
    try:
        move(channel, rdma_device, to_fd)
    except (RdmaMoveError, OSError) as exc:
        raise NetnsOpError(device, "rdma move", str(exc)) from exc
    finally:
        channel.close()


def add_soft_device(host: HostNetns, name: str, link_type: str, netdev: str) -> None:
    """Make soft RDMA device ``name`` (``link_type``: rxe, siw) on ``netdev`` in the host's
    namespace; one already there under that name is not an error. :class:`RdmaMoveError` otherwise."""
    try:
        channel = NetlinkChannel(host.ns.socket_in(host.fd, NETLINK_RDMA))
    except OSError as exc:
        raise RdmaMoveError(name, f"no RDMA netlink: {exc}") from exc
    try:
        (reply,) = channel.exchange([newlink_request(name, link_type, netdev)])
    finally:
        channel.close()
    if reply.error and reply.error != errno.EEXIST:
        raise RdmaMoveError(name, f"{link_type} on {netdev}: {reply.message or os.strerror(reply.error)}")


def soft_record(sysfs_root: str, rdma_device: str) -> dict[str, str] | None:
    """What a NIC's record says of its RDMA device when that cannot follow it into a pod: its name,
    its type (to make it again at home) and why; None for a device that can follow."""
    sysfs = SysfsReader(sysfs_root)
    problem = soft_device_problem(sysfs, rdma_device)
    if problem is None:
        return None
    iwarp = (sysfs.read(f"class/infiniband/{rdma_device}/node_type") or "").startswith("4")
    return {"soft": rdma_device, "type": "siw" if iwarp else "rxe", "reason": problem}


def stays_home(record: object) -> str | None:
    """The reason a NIC went into its pod without its RDMA device (None: it took it, or has none)."""
    return record.get("reason") if isinstance(record, dict) else None


class RdmaDevice(NicSetting):
    """A NIC's RDMA device: moved with it in exclusive RDMA netns mode; a soft one left out of the
    pod and made again once the NIC is home."""

    name = "rdma"

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        for nic in nics:
            rdma_device = nic.device.snapshot.host.rdma_device
            if not rdma_device:
                continue
            soft = soft_record(host.sysfs_root, rdma_device)
            if soft is not None:
                nic.records[self.name] = soft
            elif host.rdma_exclusive:
                nic.records[self.name] = rdma_device

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        for nic in nics:
            rdma_device = nic.records.get(self.name)
            if isinstance(rdma_device, str) and rdma_device:
                move_between(pod.host, nic.name, rdma_device, pod.host.fd, pod.fd)

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """Bring the RDMA devices back to the host, first (a gone pod netns returned them already)."""
        moved = [(m.device, r) for m in nics if isinstance(r := m.records.get(self.name), str) and r]
        if not moved or not pod.host.rdma_exclusive:
            return
        try:
            pod_fd = pod.fd
        except (NetnsGone, OSError):
            return
        for device, rdma_device in moved:
            try:
                move_between(pod.host, device, rdma_device, pod_fd, pod.host.fd)
            except NetnsOpError as exc:
                # "not in the namespace it should move from" = never moved
                log.warning("RDMA device not returned", extra={"kv": {"device": device, "error": exc.reason}})

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """A soft RDMA device the move destroyed is made again on the NIC, now home (best effort).

        The kernel unregisters the old one from a work queue, a moment after the move: a pod
        rolled back at once may find it still there under its name, so its name is waited for
        (briefly) before the new one is made."""
        record = nic.records.get(self.name)
        if not isinstance(record, dict) or not record.get("soft"):
            return
        left = Path(host.sysfs_root, "class/infiniband", record["soft"])
        deadline = time.monotonic() + UNREGISTER_WAIT
        while left.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        while True:
            try:
                add_soft_device(host, record["soft"], record.get("type", "rxe"), nic.host_ifname)
            except RdmaMoveError as exc:
                log.error("soft RDMA device not made again", extra={"kv": {"device": nic.device, "error": str(exc)}})
                return
            # EEXIST with no device in sysfs: the old one had left sysfs but not yet the RDMA core's
            # names (its unregistration still running); it is gone a moment later, so add again.
            if left.exists() or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        host.on_change()  # a new RDMA device: its char devices are known once the inventory rescans
        log.info(
            "soft RDMA device made again on its NIC",
            extra={"kv": {"device": nic.device, "rdma": record["soft"], "netdev": nic.host_ifname}},
        )
