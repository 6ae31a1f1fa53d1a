"""Per-interface sysctls (``/proc/sys/net/ipv{4,6}/conf/<if>/...``) of a NIC in the pod, the host's back.

``/proc/sys/net`` shows the network namespace of the thread that opens a file, so every access
runs with the calling thread moved into the target namespace for the duration
(:func:`~driver.netlink_channel.inside_netns`) and back. A claim's ``forwarding`` (IPv4 and
IPv6, as dranet), ``arpIgnore`` and ``arpAnnounce`` are written in the pod after the move: the
kernel gives a NIC that changes namespace the new namespace's defaults, which is also why the
host values are recorded before the move and written back after the return. NICs whose claim
sets none cost nothing (no ``setns``).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from driver.api.v1alpha1.network_config import InterfaceConfig
from driver.checkpoint.state import MovedDevice
from driver.netlink.rtnl import NetnsOpError
from driver.netlink_channel import inside_netns
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

OPTIONAL = frozenset({"ipv6/forwarding"})
"""Keys a NIC may lack (no IPv6 on it: ``ipv6.disable=1``, an MTU below 1280): skipped, not an error."""


class SysctlError(Exception):
    """A sysctl could not be read or written; names the file and the reason."""


def wanted(iface: InterfaceConfig | None) -> dict[str, int]:
    """The sysctls a claim's ``interface`` sets, as ``{"ipv4/arp_ignore": 1, ...}`` (empty: none)."""
    if iface is None or not iface.sysctls_set:
        return {}
    out: dict[str, int] = {}
    if iface.forwarding is not None:
        out["ipv4/forwarding"] = out["ipv6/forwarding"] = int(iface.forwarding)
    if iface.arp_ignore is not None:
        out["ipv4/arp_ignore"] = iface.arp_ignore
    if iface.arp_announce is not None:
        out["ipv4/arp_announce"] = iface.arp_announce
    return out


def path(key: str, ifname: str) -> str:
    """The file of ``key`` (``ipv4/arp_ignore``) for ``ifname``."""
    family, name = key.split("/", 1)
    return f"/proc/sys/net/{family}/conf/{ifname}/{name}"


def _missing(key: str, ifname: str) -> str:
    return f"{path(key, ifname)}: no such setting (is {ifname} in this namespace?)"


def read(ns_fd: int, ifname: str, keys: list[str]) -> dict[str, int]:
    """The current values of ``keys`` for ``ifname`` in ``ns_fd``'s netns (optional keys it lacks left out)."""
    out = {}
    with inside_netns(ns_fd):
        for key in keys:
            try:
                with open(path(key, ifname)) as f:
                    out[key] = int(f.read().strip())
            except FileNotFoundError:
                if key not in OPTIONAL:
                    raise SysctlError(_missing(key, ifname)) from None
            except (OSError, ValueError) as exc:
                raise SysctlError(f"{path(key, ifname)}: cannot read: {exc}") from None
    return out


def write(ns_fd: int, ifname: str, values: dict[str, int]) -> None:
    """Write ``values`` for ``ifname`` in ``ns_fd``'s netns; :class:`SysctlError` on the first failure."""
    with inside_netns(ns_fd):
        for key, value in values.items():
            try:
                fd = os.open(path(key, ifname), os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if key in OPTIONAL:
                    continue
                raise SysctlError(_missing(key, ifname)) from None
            except OSError as exc:
                raise SysctlError(f"{path(key, ifname)}: {os.strerror(exc.errno or errno.EIO)}") from None
            try:
                os.write(fd, f"{value}\n".encode())
            except OSError as exc:
                reason = os.strerror(exc.errno or errno.EIO)
                raise SysctlError(f"{path(key, ifname)}: writing {value}: {reason}") from None
            finally:
                os.close(fd)


class Sysctls(NicSetting):
    """``interface.forwarding``, ``arpIgnore`` and ``arpAnnounce``, written in the pod once the NIC is up."""

    name = "sysctls"
    sub_interfaces = True

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Record the host's values of what the claim sets."""
        for nic in nics:
            keys = wanted(nic.interface)
            if keys:
                try:
                    nic.records[self.name] = read(host.fd, nic.host.ifname, list(keys))
                except (SysctlError, OSError) as exc:
                    raise SettingRefused(nic.name, "sysctl", str(exc)) from exc

    def after_configure(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        for nic in nics:
            values = wanted(nic.interface)
            if values:
                try:
                    write(pod.fd, nic.pod.ifname, values)
                except (SysctlError, OSError) as exc:
                    raise NetnsOpError(nic.name, "sysctl", str(exc)) from exc

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """The kernel gave the NIC the host's defaults on its way back: the recorded values again."""
        values = nic.records.get(self.name)
        if values:
            try:
                write(host.fd, nic.host_ifname, values)
            except SysctlError as exc:
                raise NetnsOpError(nic.device, "restore sysctl", str(exc)) from exc
