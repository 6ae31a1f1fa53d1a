"""RDMA devices following their netdev into the pod and back (exclusive RDMA netns mode)."""

from __future__ import annotations

import logging
import os

from driver.checkpoint.state import MovedDevice
from driver.netlink import rdma_netns
from driver.netlink.namespaces import Namespaces
from driver.netlink.rdma_netns import RdmaMoveError
from driver.netlink.rtnl import NetnsOpError
from driver.netlink_channel import NetlinkChannel

log = logging.getLogger(__name__)


def move_rdma(ns: Namespaces, m: MovedDevice, from_fd: int, to_fd: int) -> None:
    """Move ``m``'s RDMA device between namespaces; :class:`NetnsOpError` naming the device if it cannot."""
    try:
        channel = NetlinkChannel(ns.socket_in(from_fd, rdma_netns.NETLINK_RDMA))
    except OSError as exc:  # no RDMA netlink: the device cannot follow its netdev, refuse the pod
        raise NetnsOpError(m.device, "rdma move", f"RDMA device {m.rdma_device}: no RDMA netlink: {exc}") from exc
    try:
        rdma_netns.move(channel, m.rdma_device or "", to_fd)
    except (RdmaMoveError, OSError) as exc:
        raise NetnsOpError(m.device, "rdma move", f"{exc} (exclusive RDMA netns mode)") from exc
    finally:
        channel.close()


def return_rdma(ns: Namespaces, m: MovedDevice, netns: str) -> None:
    """Bring ``m``'s RDMA device back to the host, best effort; a gone pod netns returned it already (kernel)."""
    try:
        fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC) if netns else -1
    except OSError:
        return
    if fd < 0:
        return
    try:
        move_rdma(ns, m, fd, ns.host_fd)
    except NetnsOpError as exc:
        # Never keep the netdev hostage: an RDMA device left behind returns to the host when
        # the pod's namespace is destroyed (kernel); "not in the source namespace" = never moved.
        log.warning("RDMA device not returned", extra={"kv": {"device": m.device, "error": exc.reason}})
    finally:
        os.close(fd)
