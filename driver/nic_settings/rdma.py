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

Soft-RoCE in the pod (Linux 7.1 on: "RDMA/rxe: Add net namespace support for IPv4/IPv6 sockets").
There rxe opens its UDP socket (port 4791) in the namespace its link is made in, so an rxe device
made *inside* the pod's namespace carries the pod's traffic. Whether this kernel does is asked of
it once at daemon start (:func:`rxe_netns_probe`; the release is a hint only, a backport would
have it): in a throwaway namespace, an rxe link on a veth there, and a bind of 4791 in that
namespace, refused (EADDRINUSE) only when rxe's socket is there. Where it is, in shared RDMA netns
mode, a NIC with an rxe device is planned ``{"soft": name, "type": "rxe", "in_pod": True}``
(written ahead), and once its netdev is in the pod (:meth:`RdmaDevice.in_pod`, before any container
starts) the device is made again there under the same name, on the NIC's pod name, over an RDMA
netlink socket opened in the pod's namespace; its char devices (the new ``uverbsN``, ``umadN``)
join the record, so the containers get them and ``NCCL_IB_HCA`` names it, and the claim's ``RDMA``
condition is True. At the return it is deleted first (``RDMA_NLDEV_CMD_DELLINK``, only the device
whose netdev the pod still has: every namespace sees every device in shared mode, and a host's one
made again by an earlier return has the same name), then made again on the host as above; a pod
namespace already gone took it with it. One that cannot be made in the pod (the kernel refuses,
the name is taken) leaves no half-made device (one made but without its char devices is deleted):
the pod starts without RDMA for that NIC, the record and the claim's ``RDMA`` condition say why,
as for an older kernel, and the device is made again on the host at the return. Older kernels,
exclusive mode, siw and shares keep the behaviour above.
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
from collections.abc import Callable, Sequence
from pathlib import Path

from driver.checkpoint.state import MovedDevice
from driver.inventory.rdma import soft_device_problem
from driver.inventory.sysfs import SysfsReader
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
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns

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


def make_soft_device(channel: NetlinkChannel, name: str, link_type: str, netdev: str) -> None:
    """Make soft RDMA device ``name`` on ``netdev`` in ``channel``'s namespace; :class:`RdmaMoveError`
    when the kernel refuses (a name taken included)."""
    (reply,) = channel.exchange([newlink_request(name, link_type, netdev)])
    if reply.error:
        why = f"{link_type} on {netdev}: {reply.message or os.strerror(reply.error)}"
        raise RdmaMoveError(name, why, reply.error)


def make_once_freed(
    channel: NetlinkChannel, sysfs_root: str, name: str, link_type: str, netdev: str, *, existing_ok: bool
) -> None:
    """Make soft RDMA device ``name`` on ``netdev`` in ``channel``'s namespace once an old one of
    that name has gone. A NIC's move destroys its soft device from a work queue, a moment later:
    its name may still be in sysfs, or have left sysfs but not yet the RDMA core's names (EEXIST),
    so both are waited for, up to ``UNREGISTER_WAIT``. ``existing_ok``: a device of that name in
    sysfs answering EEXIST is the one wanted (made already). :class:`RdmaMoveError` otherwise."""
    left = Path(sysfs_root, "class/infiniband", name)
    deadline = time.monotonic() + UNREGISTER_WAIT
    while left.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    while True:
        try:
            make_soft_device(channel, name, link_type, netdev)
            return
        except RdmaMoveError as exc:
            if exc.code == errno.EEXIST and existing_ok and left.exists():
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


def char_devices_of(sysfs_root: str, name: str) -> list[dict[str, object]]:
    """The char devices of RDMA device ``name`` (its ``uverbsN``, ``umadN``/``issmN``, and the
    connection manager's), as a record keeps them."""
    sysfs = SysfsReader(sysfs_root)
    out: list[dict[str, object]] = []
    for cls in ("class/infiniband_verbs", "class/infiniband_mad"):
        for entry in sorted(sysfs.listdir(cls)):
            if sysfs.read(f"{cls}/{entry}/ibdev") != name:
                continue
            numbers = sysfs.read(f"{cls}/{entry}/dev") or ""
            major, _, minor = numbers.partition(":")
            if major.isdigit() and minor.isdigit():
                out.append({"path": f"/dev/infiniband/{entry}", "major": int(major), "minor": int(minor)})
    if not any(str(c["path"]).startswith("/dev/infiniband/uverbs") for c in out):
        return []
    numbers = sysfs.read("class/misc/rdma_cm/dev") or ""
    major, _, minor = numbers.partition(":")
    if major.isdigit() and minor.isdigit():
        out.append({"path": "/dev/infiniband/rdma_cm", "major": int(major), "minor": int(minor)})
    return out


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


def made_in_pod(record: object) -> str | None:
    """The soft RDMA device made for the NIC in its pod (planned or made; None: none)."""
    if isinstance(record, dict) and record.get("in_pod") and not record.get("reason"):
        return record.get("soft")
    return None


class RdmaDevice(NicSetting):
    """A NIC's RDMA device: moved with it in exclusive RDMA netns mode; a soft one left out of the
    pod and made again once the NIC is home, or, where the kernel allows, made again in the pod."""

    name = "rdma"

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        for nic in nics:
            rdma_device = nic.device.snapshot.host.rdma_device
            if not rdma_device:
                continue
            soft = soft_record(host.sysfs_root, rdma_device)
            if soft is not None and soft["type"] == "rxe" and host.rxe_in_pod and not host.rdma_exclusive:
                nic.records[self.name] = {"soft": soft["soft"], "type": "rxe", "in_pod": True}
            elif soft is not None:
                nic.records[self.name] = soft
            elif host.rdma_exclusive:
                nic.records[self.name] = rdma_device

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        for nic in nics:
            rdma_device = nic.records.get(self.name)
            if isinstance(rdma_device, str) and rdma_device:
                move_between(pod.host, nic.name, rdma_device, pod.host.fd, pod.fd)
            elif made_in_pod(rdma_device):
                self._make_in_pod(nic, pod)

    def _make_in_pod(self, nic: Nic, pod: PodNetns) -> None:
        """The NIC's rxe device made again in the pod, on the NIC's pod name, with its char devices
        recorded; or, when it cannot be, none there and the record saying why (the pod goes on)."""
        record = dict(nic.records[self.name])
        name = record["soft"]
        try:
            channel = NetlinkChannel(pod.host.ns.socket_in(pod.fd, NETLINK_RDMA))
        except OSError as exc:
            self._not_in_pod(nic, record, f"no RDMA netlink in the pod's namespace: {exc}")
            return
        try:
            why = None
            try:
                make_once_freed(channel, pod.host.sysfs_root, name, "rxe", nic.pod.ifname, existing_ok=False)
            except RdmaMoveError as exc:
                why = exc.reason
            chars = char_devices_of(pod.host.sysfs_root, name) if why is None else []
            if why is None and not chars:
                why = "made without its uverbs char device"
                try:
                    delete_soft_device(channel, name, nic.pod.ifname)
                except (RdmaMoveError, OSError) as exc:
                    log.warning("half-made RDMA device not deleted", extra={"kv": {"rdma": name, "error": str(exc)}})
        finally:
            channel.close()
        if why is not None:
            self._not_in_pod(nic, record, f"{name} (Soft-RoCE) could not be made in the pod's network namespace: {why}")
            return
        nic.records[self.name] = {**record, "char_devices": chars}
        log.info(
            "Soft-RoCE device made in the pod",
            extra={"kv": {"device": nic.name, "rdma": name, "netdev": nic.pod.ifname}},
        )

    def _not_in_pod(self, nic: Nic, record: dict[str, object], reason: str) -> None:
        log.warning("pod starts without its NIC's RDMA device", extra={"kv": {"device": nic.name, "reason": reason}})
        nic.records[self.name] = {"soft": record["soft"], "type": record.get("type", "rxe"), "reason": reason}

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """Bring the RDMA devices back to the host, first (a gone pod netns returned them already);
        delete the soft ones made in the pod (a gone pod netns took them)."""
        made = [(m, r) for m in nics if (r := made_in_pod(m.records.get(self.name)))]
        if made:
            self._delete_in_pod(made, pod)
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

    def _delete_in_pod(self, made: Sequence[tuple[MovedDevice, str]], pod: PodNetns) -> None:
        """Each soft device made in the pod deleted there, best effort: only while its netdev is
        the NIC in the pod (a NIC already home has the host's again, under the same name)."""
        try:
            channel = NetlinkChannel(pod.host.ns.socket_in(pod.fd, NETLINK_RDMA))
        except (NetnsGone, OSError):
            return
        try:
            for m, name in made:
                try:
                    if delete_soft_device(channel, name, m.pod_ifname):
                        log.info(
                            "Soft-RoCE device deleted in the pod", extra={"kv": {"device": m.device, "rdma": name}}
                        )
                except (RdmaMoveError, OSError) as exc:
                    log.warning(
                        "RDMA device in the pod not deleted", extra={"kv": {"device": m.device, "error": str(exc)}}
                    )
        finally:
            channel.close()

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """A soft RDMA device the move destroyed is made again on the NIC, now home (best effort).

        The kernel unregisters the old one from a work queue, a moment after the move: a pod
        rolled back at once may find it still there under its name, so its name is waited for
        (briefly) before the new one is made."""
        record = nic.records.get(self.name)
        if not isinstance(record, dict) or not record.get("soft"):
            return
        name, link_type = record["soft"], record.get("type", "rxe")
        try:
            channel = NetlinkChannel(host.ns.socket_in(host.fd, NETLINK_RDMA))
            try:
                make_once_freed(channel, host.sysfs_root, name, link_type, nic.host_ifname, existing_ok=True)
            finally:
                channel.close()
        except (RdmaMoveError, OSError) as exc:
            log.error("soft RDMA device not made again", extra={"kv": {"device": nic.device, "error": str(exc)}})
            return
        host.on_change()  # a new RDMA device: its char devices are known once the inventory rescans
        log.info(
            "soft RDMA device made again on its NIC",
            extra={"kv": {"device": nic.device, "rdma": record["soft"], "netdev": nic.host_ifname}},
        )
