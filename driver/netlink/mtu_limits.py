"""The MTU a NIC can take: its driver's limits (``IFLA_MIN_MTU``/``IFLA_MAX_MTU``) and, for an SR-IOV
VF, its PF's MTU (a VF cannot carry frames its PF drops).

Checked at prepare (:func:`check_host_nic`, the NIC on the host) and again in RunPodSandbox before
the NIC moves (:func:`problem`, from the record the hook takes anyway): the kernel refuses such an
MTU only once the NIC is already in the pod.
"""

from __future__ import annotations

import os
import socket

from driver.netlink.channel import netlink_socket
from driver.netlink.link_info import LinkInfo
from driver.netlink.rtnl import Rtnl


def pf_mtu(ifname: str, sysfs_root: str = "/sys") -> tuple[str, int] | None:
    """``(PF name, its MTU)`` for the VF netdev ``ifname`` (``device/physfn/net/*/mtu``); None when
    ``ifname`` is not a VF or its PF has no netdev."""
    base = f"{sysfs_root}/class/net/{ifname}/device/physfn/net"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    for name in names:
        try:
            with open(f"{base}/{name}/mtu", "rb") as f:
                return name, int(f.read(32).strip())
        except (OSError, ValueError):
            continue
    return None


def problem(mtu: int, min_mtu: int | None, max_mtu: int | None, pf: tuple[str, int] | None) -> str | None:
    """Why the NIC cannot take ``mtu`` (None: it can); the message names the field."""
    if max_mtu and mtu > max_mtu:
        return f"interface.mtu: {mtu} is above the NIC's maximum MTU {max_mtu}"
    if min_mtu and mtu < min_mtu:
        return f"interface.mtu: {mtu} is below the NIC's minimum MTU {min_mtu}"
    if pf is not None and mtu > pf[1]:
        return f"interface.mtu: {mtu} is above the MTU {pf[1]} of its PF {pf[0]} (a VF cannot exceed its PF)"
    return None


class HostLinks:
    """Links of the driver's own netns looked up over one netlink socket, opened on first use: all of
    a claim's NICs are checked over one instead of a socket each."""

    def __init__(self) -> None:
        self._rtnl: Rtnl | None = None

    def link(self, ifname: str) -> LinkInfo | None:
        """``ifname``'s link; None when it is not there or cannot be asked."""
        try:
            if self._rtnl is None:
                self._rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE))
            return self._rtnl.link(ifname)
        except OSError:
            self.close()  # the next lookup on a fresh socket: never read a late answer as its own
            return None

    def close(self) -> None:
        if self._rtnl is not None:
            self._rtnl.close()
            self._rtnl = None


def check_host_nic(ifname: str, mtu: int, sysfs_root: str = "/sys", links: HostLinks | None = None) -> str | None:
    """Prepare-time check in the driver's own netns: why ``ifname`` cannot take ``mtu`` (None: it can,
    or it is not there to ask: the hook checks again before the move). ``links``: the caller's
    socket (else one for this check alone)."""
    own = links is None
    lookup = HostLinks() if links is None else links
    try:
        link = lookup.link(ifname)
    finally:
        if own:
            lookup.close()
    limits = (link.min_mtu, link.max_mtu) if link is not None else (None, None)
    found = problem(mtu, *limits, pf_mtu(ifname, sysfs_root))
    return f"device {ifname}: {found}" if found else None
