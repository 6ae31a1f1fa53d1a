"""Per-interface sysctls (``/proc/sys/net/ipv{4,6}/conf/<if>/...``) of a NIC in the pod, the host's back.

A claim's ``forwarding`` (IPv4 and IPv6, as dranet), ``arpIgnore`` and ``arpAnnounce`` are written
in the pod after the move: the kernel gives a NIC that changes namespace the new namespace's
defaults, which is also why the host values are recorded before the move and written back after
the return. NICs whose claim sets none cost nothing.

The driver is not ``privileged``, so its ``/proc/sys`` is read-only. IPv4's settings go over
rtnetlink instead (``RTM_NEWLINK`` with ``IFLA_AF_SPEC``/``AF_INET``/``IFLA_INET_CONF``, which the
kernel has taken since 3.x): the NIC's namespace is the socket's, its ifindex names it. IPv6's
are not settable over rtnetlink, so they are written to the file; where that mount is read-only,
from the thread of :class:`~driver.nic_settings.writable_proc_sys.WritableProcSys`. Reads go to
the files (readable everywhere). ``/proc/sys/net`` shows the network namespace of the thread that
opens a file, so every file access runs with the thread moved into the target namespace for the
duration (:func:`~driver.netlink.channel.inside_netns`) and back.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from collections.abc import Sequence

from driver.api.v1alpha1.network_config import InterfaceConfig
from driver.checkpoint.state import MovedDevice
from driver.netlink.channel import attr, inside_netns
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, newlink
from driver.nic_settings.addresses import new_ipv6
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused
from driver.nic_settings.writable_proc_sys import WritableProcSys

log = logging.getLogger(__name__)

OPTIMISTIC_DAD = {"ipv6/optimistic_dad": 1, "ipv6/use_optimistic": 1}
"""Written for a NIC that gets new IPv6 addresses, before they are added: they are then detected
optimistically (RFC 4429): bound and used at once, and preferred as a source like any other, while
the kernel probes the link (a NIC that changes namespace has the new namespace's defaults, 0)."""
OPTIONAL = frozenset({"ipv6/forwarding"})
"""Keys a NIC may lack (no IPv6 on it: ``ipv6.disable=1``, an MTU below 1280): skipped, not an error."""


IFLA_AF_SPEC, IFLA_INET_CONF = 26, 1
IPV4_DEVCONF = {"ipv4/forwarding": 1, "ipv4/arp_announce": 18, "ipv4/arp_ignore": 19}
"""The keys rtnetlink sets, by their ``IPV4_DEVCONF_*`` index (include/uapi/linux/ip.h)."""


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


def inet_conf(device: str, index: int, values: dict[str, int]) -> Request:
    """RTM_NEWLINK setting IPv4 interface settings (keys of :data:`IPV4_DEVCONF`) of ``index``."""
    conf = b"".join(attr(IPV4_DEVCONF[k], struct.pack("=I", v)) for k, v in values.items())
    extra = attr(IFLA_AF_SPEC, attr(socket.AF_INET, attr(IFLA_INET_CONF, conf)))
    return newlink(device, index, extra=extra, step="sysctl")


def write(
    ns_fd: int,
    ifname: str,
    values: dict[str, int],
    *,
    rtnl: Rtnl | None = None,
    index: int | None = None,
    proc_sys: WritableProcSys | None = None,
) -> None:
    """Write ``values`` for ``ifname`` (ifindex ``index``) in ``ns_fd``'s netns, whose rtnetlink
    socket is ``rtnl``: IPv4's over rtnetlink (without ``rtnl``/``index``: to the files), the rest
    to the files, through ``proc_sys`` where the mount is read-only. :class:`SysctlError` on the
    first failure."""
    by_netlink = {k: v for k, v in values.items() if k in IPV4_DEVCONF} if rtnl is not None and index else {}
    if by_netlink:
        try:
            rtnl.run([inet_conf(ifname, index or 0, by_netlink)])  # type: ignore[union-attr]
        except NetnsOpError as exc:
            keys = ", ".join(path(k, ifname) for k in by_netlink)
            raise SysctlError(f"{keys} (over rtnetlink, ifindex {index}): {exc.reason}") from None
    files = {k: v for k, v in values.items() if k not in by_netlink}
    if not files:
        return
    try:
        _write_files(ns_fd, ifname, files)
    except _ReadOnly:
        if proc_sys is None:
            raise SysctlError(f"{path(next(iter(files)), ifname)}: {os.strerror(errno.EROFS)}") from None
        try:
            proc_sys.run(_write_files, ns_fd, ifname, files)
        except _ReadOnly as exc:
            raise SysctlError(f"{exc.filename}: {os.strerror(errno.EROFS)}") from None
        except OSError as exc:  # ProcSysReadOnly: why it could not be made writable
            raise SysctlError(f"{path(next(iter(files)), ifname)}: {exc.strerror or exc}") from None


class _ReadOnly(OSError):
    """A file of ``/proc/sys`` is on a read-only mount (tried again where it is writable)."""


def _write_files(ns_fd: int, ifname: str, values: dict[str, int]) -> None:
    with inside_netns(ns_fd):
        for key, value in values.items():
            file = path(key, ifname)
            try:
                fd = os.open(file, os.O_WRONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if key in OPTIONAL:
                    continue
                raise SysctlError(_missing(key, ifname)) from None
            except OSError as exc:
                if exc.errno == errno.EROFS:
                    raise _ReadOnly(errno.EROFS, "read-only", file) from None
                raise SysctlError(f"{file}: {os.strerror(exc.errno or errno.EIO)}") from None
            try:
                os.write(fd, f"{value}\n".encode())
            except OSError as exc:
                reason = os.strerror(exc.errno or errno.EIO)
                raise SysctlError(f"{file}: writing {value}: {reason}") from None
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

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Optimistic duplicate address detection on the NICs that get new IPv6 addresses. Where it
        cannot be set (a kernel without it, ``/proc/sys`` not writable) the addresses are detected
        the usual way, and the pod's containers wait for that (:mod:`driver.nri.dad_watch`)."""
        for nic in nics:
            if not new_ipv6(nic):
                continue
            try:
                write(pod.fd, nic.pod.ifname, OPTIMISTIC_DAD, proc_sys=pod.host.proc_sys)
            except (SysctlError, OSError) as exc:
                log.info("optimistic IPv6 address detection not set", extra={"kv": {"nic": nic.name, "why": str(exc)}})

    def after_configure(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        for nic in nics:
            values = wanted(nic.interface)
            if values:
                index = nic.link.index if nic.link is not None else nic.pod_index
                try:
                    write(pod.fd, nic.pod.ifname, values, rtnl=pod.rtnl, index=index, proc_sys=pod.host.proc_sys)
                except (SysctlError, OSError) as exc:
                    raise NetnsOpError(nic.name, "sysctl", str(exc)) from exc

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        """The recorded IPv4 values again, in the return's batch (the NIC found home at ``index``):
        the kernel gave it the host's defaults on its way back."""
        values = {k: v for k, v in (nic.records.get(self.name) or {}).items() if k in IPV4_DEVCONF}
        return [inet_conf(nic.device, index, values)] if values else []

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """The recorded values rtnetlink cannot set (IPv6's), to the files, by the NIC's host name."""
        values = {k: v for k, v in (nic.records.get(self.name) or {}).items() if k not in IPV4_DEVCONF}
        if values:
            try:
                write(host.fd, nic.host_ifname, values, proc_sys=host.proc_sys)
            except (SysctlError, OSError) as exc:
                raise NetnsOpError(nic.device, "restore sysctl", str(exc)) from exc
