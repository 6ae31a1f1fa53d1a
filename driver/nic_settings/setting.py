"""What a NIC setting is: one interface (:class:`NicSetting`) over a plan per NIC (:class:`Nic`).

A claim's config sets things on a NIC in the pod: addresses and routes, rules, neighbors, sysctls,
ethtool features, GSO/GRO sizes, a VRF, a DHCP lease; it may detach eBPF programs and move the
RDMA device with the NIC. Each of these is one module of :mod:`driver.nic_settings` and one object
implementing :class:`NicSetting`. The NRI hooks run every registered setting
(:data:`driver.nic_settings.registry.SETTINGS`, in its order on the way in, in reverse on the way
back) at each moment of a NIC's trip, and each setting does its part for the NICs whose claim asks
for it (the others cost it nothing: no socket, no read):

======================  =========================================================================
moment                  method
======================  =========================================================================
NodePrepareResources    :meth:`~NicSetting.prepare_problems`: what the NIC on the host cannot take
RunPodSandbox, on the   :meth:`~NicSetting.plan`: check the NIC can take it (:class:`SettingRefused`
host, nothing moved     refuses the pod with every NIC untouched), record what the host had in
                        ``nic.records[name]`` (written ahead, before the move) and plan the pod side
the NIC's second        :meth:`~NicSetting.link_attrs`: attributes of the request that sets MTU and
request, in the pod     MAC there
in the pod              :meth:`~NicSetting.in_pod`: the setting's own work before configuration
                        :meth:`~NicSetting.requests`: its part of the configuration batch (one
                        pipelined send for every NIC of the pod)
                        :meth:`~NicSetting.after_configure`: once the NICs are configured and up
StopPodSandbox (and     :meth:`~NicSetting.before_return`: in the pod, before the NICs leave
every rollback)         :meth:`~NicSetting.restore_requests`: its part of the host's restore batch
                        :meth:`~NicSetting.after_return`: on the host, once the NIC is home
======================  =========================================================================

The order of :data:`~driver.nic_settings.registry.SETTINGS` is the kernel's: a VRF exists before
a NIC is enslaved to it, and enslaving comes before the addresses (it cycles the link); routes
come after the addresses and the link up; sysctls are written once the NIC is up, the DHCP lease
taken once it is configured.

Undoing reads only what :meth:`NicSetting.plan` (and the pod-side methods) put in the NIC's
records: the pod state keeps them by setting name (``MovedDevice.records``), so a restarted driver
undoes what a previous one did. Decoding the claim's config is not a setting's job: that is the
typed config of :mod:`driver.api.v1alpha1`, read from ``nic.device.config``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig
from driver.checkpoint.state import MovedDevice, PreparedClaim, PreparedDevice
from driver.model.device import Device
from driver.netlink import ethtool_genl, kernel_features
from driver.netlink.kernel_features import KernelFeatures
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import Namespaces, NetnsGone, is_netns_fd
from driver.netlink.nic_moves import LinkState, PodLinkConfig, PodLinkResult
from driver.netlink.rtnl import Request, Rtnl
from driver.nic_settings.writable_proc_sys import WritableProcSys


class SettingRefused(Exception):
    """A NIC cannot take its claim's setting, found before anything moved: the pod is refused."""

    def __init__(self, device: str, step: str, reason: str) -> None:
        super().__init__(f"device {device}: {step} failed: {reason}")
        self.device, self.step, self.reason = device, step, reason


class HostNetns:
    """The host's network namespace as the hooks reach it: its rtnetlink socket and fd, the ethtool
    client (opened on first use), where sysfs is, whether RDMA devices move with their netdev, who
    to tell when the host's devices changed behind the link events' back, the kernel's features."""

    def __init__(
        self,
        ns: Namespaces,
        sysfs_root: str = "/sys",
        rdma_exclusive: bool = False,
        on_change: Callable[[], None] | None = None,
        kernel: KernelFeatures | None = None,
        rxe_in_pod: bool = False,
    ) -> None:
        self.ns = ns
        self.sysfs_root = sysfs_root
        self.rdma_exclusive = rdma_exclusive
        self.rxe_in_pod = rxe_in_pod
        """Whether a Soft-RoCE device made in a pod's namespace carries its traffic (Linux 7.1 on,
        asked of the kernel at daemon start: :func:`driver.netlink.rdma_nldev.rxe_netns_probe`)."""
        self.kernel = kernel or kernel_features.detect()
        """What the kernel offers (the daemon's, found at its start; else judged here by version)."""
        self.on_change = on_change or (lambda: None)
        """Called when a setting changed the host's devices in a way no link event tells (a soft
        RDMA device made again): the inventory rescans."""
        self._ethtool: ethtool_genl.Ethtool | None = None
        self.proc_sys = WritableProcSys()
        """Where files of a read-only ``/proc/sys`` are written (a thread made on first use)."""

    @property
    def fd(self) -> int:
        """An fd of the host's network namespace."""
        return self.ns.host_fd

    def rtnl(self) -> Rtnl:
        """The hooks' rtnetlink socket in the host namespace."""
        return self.ns.host_rtnl()

    def ethtool(self) -> ethtool_genl.Ethtool:
        """The ethtool (generic netlink) client in the host namespace, opened once."""
        if self._ethtool is None:
            self._ethtool = ethtool_genl.Ethtool(self.ns.socket_in(self.fd, ethtool_genl.NETLINK_GENERIC))
        return self._ethtool


class PodNetns:
    """A pod's network namespace while a hook works in it, opened on first use (a setting a pod's
    claims do not ask for costs nothing) and closed with the hook (:meth:`close`); ``host``: the
    host's, from which it is reached.

    ``names``: the names of the links the pod has before any NIC moves in (read by the hook for
    its checks); ``created``: the links the hooks made in it (the pod state's record, for the
    return); ``on_created``: records a link just made there, before anything else can fail.
    """

    def __init__(
        self,
        host: HostNetns,
        path: str,
        *,
        created: Sequence[dict[str, Any]] = (),
        on_created: Callable[[dict[str, object]], None] | None = None,
    ) -> None:
        self.host, self.path = host, path
        self.names: Collection[str] = ()
        # (ifindex, CIDR) -> (device, usable while tentative): the new IPv6 addresses still under
        # duplicate address detection once the NICs are configured (driver.nri.dad_watch follows them).
        self.tentative: dict[tuple[int, str], tuple[str, bool]] = {}
        self.created = created
        self.on_created = on_created or (lambda _link: None)
        self._fd = -1
        self._rtnl: Rtnl | None = None

    @property
    def fd(self) -> int:
        """An fd of the pod's namespace; :class:`NetnsGone` when it no longer exists."""
        if self._fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC) if self.path else -1
            except FileNotFoundError as exc:
                raise NetnsGone(self.path) from exc
            if fd < 0 or not is_netns_fd(fd):  # an unmounted bind mount is a plain file
                if fd >= 0:
                    os.close(fd)
                raise NetnsGone(self.path)
            self._fd = fd
        return self._fd

    @property
    def rtnl(self) -> Rtnl:
        """An rtnetlink socket in the pod's namespace; :class:`NetnsGone` when it no longer exists."""
        if self._rtnl is None:
            self._rtnl = Rtnl(self.host.ns.socket_in(self.fd, socket.NETLINK_ROUTE))
        return self._rtnl

    def ethtool(self) -> ethtool_genl.Ethtool:
        """A new ethtool client in the pod's namespace (the caller closes it)."""
        return self.host.ethtool().sibling(self.host.ns.socket_in(self.fd, ethtool_genl.NETLINK_GENERIC))

    def close(self) -> None:
        """Close what was opened."""
        if self._rtnl is not None:
            self._rtnl.close()
            self._rtnl = None
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


@dataclass
class Nic:
    """One NIC of a pod on its way in (RunPodSandbox): the plan the hook and every setting work on."""

    claim: PreparedClaim
    device: PreparedDevice
    host: LinkState  # the NIC as the host has it, recorded before the move
    pod: PodLinkConfig  # what it gets in the pod (settings fill in their part in :meth:`NicSetting.plan`)
    pod_index: int = 0  # the ifindex it gets in the pod
    # Per setting, by its name: what undoing it needs (host values, what it did in the pod). Written
    # ahead with the NIC (``MovedDevice.records``) and again once it is in the pod.
    records: dict[str, Any] = field(default_factory=dict)
    link: LinkInfo | None = None  # the NIC as the pod has it, once moved and checked
    result: PodLinkResult | None = None  # what the claim's status reports, once configured

    @property
    def name(self) -> str:
        """The device's name (the published one: every error names it)."""
        return self.device.device

    @property
    def config(self) -> NetworkConfig:
        """The claim's config for this NIC, decoded and checked at prepare."""
        return self.device.config

    @property
    def interface(self) -> InterfaceConfig:
        """The config's ``interface`` section (empty when it has none)."""
        return self.device.config.interface or InterfaceConfig()

    @property
    def sub_interface(self) -> bool:
        """Whether the pod gets a sub-interface of the NIC (a share of it) rather than the NIC."""
        return self.device.sub_interface

    @property
    def index(self) -> int:
        """The NIC's ifindex in the pod, once moved."""
        return self.link.index if self.link is not None else self.pod_index


class NicSetting(Protocol):
    """One thing a claim sets on a NIC, at every moment of the NIC's trip (see the module's table).

    A setting subclasses this protocol to inherit the methods it does not need (they do nothing).
    Pod-side methods raise :class:`~driver.netlink.rtnl.NetnsOpError` naming the device and the
    step: the hook then returns every NIC. Return-side methods see each NIC as the pod state has
    it (:class:`~driver.checkpoint.state.MovedDevice`) and act on what ``records[name]`` holds.
    """

    name: str
    """The key of the setting's records in the pod state: never renamed (older files use it)."""
    sub_interfaces: bool = False
    """Whether it also works on a shared NIC's sub-interface (made in the pod, never on the host):
    :meth:`plan`, :meth:`link_attrs`, :meth:`in_pod` and the way back see sub-interfaces only when
    true (the others record and restore the host's NIC, which a sub-interface never changes); the
    claim's own entries in :meth:`requests` apply to every NIC."""

    def prepare_problems(self, device: Device, config: NetworkConfig) -> list[str]:
        """At NodePrepareResources, in the driver's own namespace: why the NIC cannot take the
        config (empty: it can, or the setting is not asked for)."""
        return []

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """On the host, nothing moved yet: check, record (``nic.records[name]``), plan the pod side.

        Raises :class:`SettingRefused`. ``pod`` may be read (its link names), never changed.
        """
        return None

    def link_attrs(self, nic: Nic) -> bytes:
        """Link attributes of the NIC's second request, in the pod (empty: none)."""
        return b""

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """The setting's own work in the pod, the NICs moved and checked, before configuration."""
        return None

    def requests(self, nic: Nic) -> list[Request]:
        """The setting's part of the pod's configuration batch for ``nic`` (at ``nic.index``)."""
        return []

    def after_configure(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Once every NIC is configured and up in the pod (``nic.result`` set)."""
        return None

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """In the pod, before the NICs leave it; best effort (a gone namespace took it all)."""
        return None

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        """The setting's part of the host's restore batch for ``nic``, home at ``index``."""
        return []

    def after_return(self, nic: MovedDevice, host: HostNetns) -> None:
        """On the host, once ``nic`` is home."""
        return None
