"""RDMA devices following their netdev into the pod and back, over RDMA netlink (``NETLINK_RDMA``, ``nldev``).

The kernel's RDMA subsystem runs in one of two netns modes (``rdma system set netns shared|exclusive``):

- ``shared`` (the default): every RDMA device is visible in every network namespace; moving a NIC's
  netdev into a pod is enough, the pod reaches the RDMA device through its char devices;
- ``exclusive``: an RDMA device belongs to one namespace and must move with its netdev, or the pod
  sees no RDMA device at all (``ibv_devices`` empty).

The messages and the kernel probe are ``driver.netlink.rdma_nldev``'s.

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
exclusive mode and siw keep the behaviour above.

A share of such a NIC (a sub-interface in the pod, the NIC on the host with its rxe device) gets an
rxe device of its own on its sub-interface, made in the pod the same way under a name stable for
the share (:func:`share_device_name`: the host device's name and the share's), so that each pod's
RDMA traffic leaves from its own address; the host's device is never touched, and at the return
the share's device is deleted (with the sub-interface it would go anyway). Where the kernel cannot,
a share keeps the host's device, as before. Verbs users (NCCL, UCX) name the share's device and its
GID; rdma_cm finds the share's address on the host's device too (an upper device's addresses are its
lower's GIDs) and binds there, so it does not reach a share's device.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from driver.checkpoint.state import MovedDevice
from driver.inventory.rdma import soft_device_problem
from driver.inventory.sysfs import SysfsReader
from driver.netlink.channel import NetlinkChannel
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rdma_nldev import (
    NETLINK_RDMA,
    UNREGISTER_WAIT,
    RdmaMoveError,
    delete_soft_device,
    make_once_freed,
    move,
)
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns

log = logging.getLogger(__name__)
REMAKE_LATER = 6 * UNREGISTER_WAIT
"""Seconds a soft device's remake waits off the hook for its old name to be freed."""


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


def share_device_name(rdma_device: str, share: str) -> str:
    """The rxe device a share of a NIC gets in its pod: the host device's name and the first
    characters of the share's ID (every namespace sees every RDMA device in shared mode: the name
    must be the node's only one)."""
    tag = "".join(c for c in share.lower() if c.isalnum())[:8]
    return f"{rdma_device}s{tag}"


class RdmaDevice(NicSetting):
    """A NIC's RDMA device: moved with it in exclusive RDMA netns mode; a soft one left out of the
    pod and made again once the NIC is home, or, where the kernel allows, made again in the pod; a
    share's own rxe device on its sub-interface in the pod, where the kernel allows."""

    name = "rdma"
    sub_interfaces = True

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        for nic in nics:
            rdma_device = nic.device.snapshot.host.rdma_device
            if not rdma_device:
                continue
            soft = soft_record(host.sysfs_root, rdma_device)
            in_pod = soft is not None and soft["type"] == "rxe" and host.rxe_in_pod and not host.rdma_exclusive
            if nic.sub_interface:  # the NIC stays on the host, its devices with it
                if in_pod:
                    share = share_device_name(rdma_device, nic.device.share_id or nic.claim.uid)
                    nic.records[self.name] = {"soft": share, "type": "rxe", "in_pod": True, "share": True}
                continue
            if in_pod and soft is not None:
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
        kept = {"share": True} if record.get("share") else {}
        nic.records[self.name] = {"soft": record["soft"], "type": record.get("type", "rxe"), "reason": reason, **kept}

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
        if not isinstance(record, dict) or not record.get("soft") or record.get("share"):
            return  # a share's device was its own, in the pod; the host's never left
        name, link_type = record["soft"], record.get("type", "rxe")
        if not _remake(host, nic, name, link_type, UNREGISTER_WAIT, later=True):
            return
        log.info(
            "soft RDMA device made again on its NIC",
            extra={"kv": {"device": nic.device, "rdma": record["soft"], "netdev": nic.host_ifname}},
        )


def _remake(host: HostNetns, nic: MovedDevice, name: str, link_type: str, wait: float, later: bool) -> bool:
    """Make ``nic``'s soft device ``name`` again on it, at home, waiting up to ``wait`` s for its old
    one's name. With ``later``: a device the kernel refuses then (its old one still tearing down: a
    loaded machine unregisters slowly, seen past 5 s under emulation) is tried again off the hook,
    in a thread of its own, for :data:`REMAKE_LATER` s; False when not made (yet)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            channel = NetlinkChannel(host.ns.socket_in(host.fd, NETLINK_RDMA))
            try:
                left = max(0.0, deadline - time.monotonic())
                make_once_freed(channel, host.sysfs_root, name, link_type, nic.host_ifname, existing_ok=True, wait=left)
            finally:
                channel.close()
            break
        except (RdmaMoveError, OSError) as exc:
            if later:
                args = (host, nic, name, link_type, REMAKE_LATER, False)
                threading.Thread(target=_remake, args=args, name=f"remake-{name}", daemon=True).start()
                log.info("soft RDMA device made again off the hook", extra={"kv": {"rdma": name, "error": str(exc)}})
                return False
            if time.monotonic() >= deadline:
                log.error("soft RDMA device not made again", extra={"kv": {"device": nic.device, "error": str(exc)}})
                return False
            time.sleep(0.5)
    host.on_change()  # a new RDMA device: its char devices are known once the inventory rescans
    return True
