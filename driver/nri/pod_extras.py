"""The claim settings a NIC gets in the pod beyond name, addresses, routes, rules and ethtool:
GSO/GRO sizes, eBPF detachment, VRF and per-interface sysctls (issue 16 part B), and their undoing.

Each costs nothing for NICs whose claim does not ask for it: no socket, no read, no system call.
On the host before the move (:meth:`PodExtras.plan`): the offload sizes are checked against the NIC
(a clear refusal before anything moves) and the host values recorded, with the host's sysctls and
the TC programs the move will drop. The sizes travel in the move's own ``RTM_NEWLINK``
(:meth:`PodExtras.move_attrs`). In the pod: eBPF programs detached and VRFs created before the
NIC is configured (:meth:`PodExtras.in_pod`), sysctls written after (:meth:`PodExtras.after_configure`).
At return: the NIC leaves its VRF, which is deleted (:meth:`PodExtras.before_return`), and once home
the host's sizes and sysctls are set back (:meth:`PodExtras.restore_on_host`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from driver.api.v1alpha1.network_config import InterfaceConfig
from driver.checkpoint.state import MovedDevice, PreparedDevice
from driver.netlink import ebpf, offload_sizes, sysctls, vrf
from driver.netlink.namespaces import Namespaces, NetnsGone
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl
from driver.nri.pod_config import vrf_table

log = logging.getLogger(__name__)


class ExtrasPlanError(Exception):
    """A NIC cannot take its claim's settings (found on the host, before anything moved)."""

    def __init__(self, device: str, step: str, reason: str) -> None:
        super().__init__(f"device {device}: {step} failed: {reason}")
        self.device, self.step, self.reason = device, step, reason


@dataclass
class HostExtras:
    """What :meth:`PodExtras.plan` found on the host for one NIC."""

    offload_sizes: dict[str, int] = field(default_factory=dict)  # host values, restored on return
    sysctls: dict[str, int] = field(default_factory=dict)  # host values, restored on return
    removed_by_move: list[dict[str, object]] = field(default_factory=list)  # TC programs the move drops


def _iface(device: PreparedDevice) -> InterfaceConfig:
    return device.config.interface or InterfaceConfig()


def _program(p: ebpf.Program, how: str) -> dict[str, object]:
    return {"hook": p.hook, "id": p.id, "how": how}


def pod_vrfs(nics: Sequence[tuple[PreparedDevice, LinkState]]) -> dict[str, tuple[str, int]]:
    """The VRFs a pod's NICs ask for: name -> (first device, table). NICs naming one VRF share it:
    its table is the one they set (two different ones: :class:`NetnsOpError`), else the first
    NIC's default (100 + its ifindex)."""
    explicit: dict[str, tuple[str, int]] = {}
    out: dict[str, tuple[str, int]] = {}
    for device, host in nics:
        wanted = _iface(device).vrf
        if wanted is None or not wanted.name:
            continue
        if wanted.table is not None:
            seen = explicit.setdefault(wanted.name, (device.device, wanted.table))
            if seen[1] != wanted.table:
                why = f"vrf {wanted.name}: table {wanted.table} here, {seen[1]} for device {seen[0]} of the same pod"
                raise NetnsOpError(device.device, "vrf create", why)
        out.setdefault(wanted.name, (device.device, vrf_table(_iface(device), host) or 0))
    return {name: (dev, explicit[name][1] if name in explicit else table) for name, (dev, table) in out.items()}


class PodExtras:
    """Applies and undoes the part-B settings for the hooks (one instance, the hooks' thread)."""

    def __init__(self, ns: Namespaces) -> None:
        self.ns = ns

    def plan(self, nics: Sequence[tuple[PreparedDevice, LinkState]]) -> dict[str, HostExtras]:
        """Check and record on the host, per NIC that needs it; :class:`ExtrasPlanError` for the first problem."""
        out = {}
        for device, host in nics:
            iface = _iface(device)
            sizes, wanted, ebpf_off = iface.offload_sizes, sysctls.wanted(iface), iface.disable_ebpf_programs
            if not (sizes or wanted or ebpf_off or iface.vrf):
                continue
            extras = HostExtras()
            step = "offload sizes"
            try:
                if sizes:
                    extras.offload_sizes = offload_sizes.check(self.ns.host_rtnl(), host.index or 0, sizes)
                step = "sysctl"
                if wanted:
                    extras.sysctls = sysctls.read(self.ns.host_fd, host.ifname, list(wanted))
                step = "ebpf"
                if ebpf_off:
                    tc = ebpf.tc_programs(self.ns.host_rtnl(), host.index or 0)
                    extras.removed_by_move = [_program(p, "removed by the namespace move") for p in tc]
            except (offload_sizes.OffloadSizeError, sysctls.SysctlError, OSError) as exc:
                raise ExtrasPlanError(device.device, step, str(exc)) from exc
            out[device.device] = extras
        return out

    @staticmethod
    def move_attrs(device: PreparedDevice) -> bytes:
        """The offload sizes to set with the move (empty: none)."""
        sizes = _iface(device).offload_sizes
        return offload_sizes.encode(sizes) if sizes else b""

    def in_pod(
        self,
        pod_rtnl: Rtnl,
        pod_fd: int,
        nics: Sequence[tuple[PreparedDevice, LinkState]],
        configs: dict[str, PodLinkConfig],
        record: Callable[[dict[str, object]], None] | None = None,
    ) -> dict[str, list[dict[str, object]]]:
        """Detach eBPF programs and create VRFs (setting ``configs[...].master``) in the pod, before the
        NICs are configured; the programs detached, per device. ``record`` gets each VRF created, at
        once (see :func:`driver.netlink.vrf.create`). Raises :class:`NetnsOpError`."""
        detached: dict[str, list[dict[str, object]]] = {}
        for device, _ in nics:
            if _iface(device).disable_ebpf_programs:
                detached[device.device] = self._detach(pod_rtnl, pod_fd, device.device, configs[device.device].ifname)
        vrfs = pod_vrfs(nics)
        indexes = vrf.create(pod_rtnl, vrfs, record)
        for device, _ in nics:
            wanted = _iface(device).vrf
            if wanted is not None and wanted.name in indexes:
                cfg = configs[device.device]
                cfg.master = indexes[wanted.name]
                cfg.routes = [replace(r, table=vrfs[wanted.name][1]) for r in cfg.routes]  # the shared VRF's table
        return detached

    def _detach(self, rtnl: Rtnl, pod_fd: int, device: str, ifname: str) -> list[dict[str, object]]:
        """Detach every program of the NIC, each on its own: one that cannot be detached (an XDP
        program held by a bpf link, for one) is recorded as left attached and logged, and the pod
        starts (dranet too only attempts it). Listing them failing is a hook failure."""
        link = rtnl.link(ifname)
        if link is None:
            raise NetnsOpError(device, "ebpf detach", f"{ifname} not found in the pod namespace")
        try:
            xdp, tc = ebpf.xdp_programs(rtnl, link.index), ebpf.tc_programs(rtnl, link.index)
            tcx = ebpf.tcx_programs(pod_fd, link.index)
        except (ebpf.EbpfError, OSError) as exc:
            raise NetnsOpError(device, "ebpf detach", f"{ifname}: listing programs: {exc}") from exc
        reqs: list[Request] = [ebpf.xdp_detach(device, link.index, p) for p in xdp]
        reqs += [ebpf.tc_detach(device, link.index, p) for p in tc]
        errors: list[str | None] = [None if e is None else e.reason for e in rtnl.run_each(reqs)]
        for p in tcx:
            try:
                ebpf.tcx_detach(pod_fd, link.index, p)
                errors.append(None)
            except ebpf.EbpfError as exc:
                errors.append(str(exc))
        done = [
            _program(p, "detached" if err is None else f"left attached: {err}")
            for p, err in zip((*xdp, *tc, *tcx), errors, strict=True)
        ]
        if any(err is not None for err in errors):
            log.warning("eBPF programs left attached", extra={"kv": {"device": device, "programs": done}})
        elif done:
            log.info("eBPF programs detached", extra={"kv": {"device": device, "programs": done}})
        return done

    @staticmethod
    def after_configure(pod_fd: int, nics: Sequence[tuple[PreparedDevice, str]]) -> None:
        """Write the claims' sysctls for ``(device, pod ifname)`` in the pod; :class:`NetnsOpError`."""
        for device, ifname in nics:
            wanted = sysctls.wanted(device.config.interface)
            if wanted:
                try:
                    sysctls.write(pod_fd, ifname, wanted)
                except (sysctls.SysctlError, OSError) as exc:
                    raise NetnsOpError(device.device, "sysctl", str(exc)) from exc

    def before_return(self, netns: str, pending: Sequence[MovedDevice], created: Sequence[dict[str, Any]] = ()) -> None:
        """Take the NICs out of their VRFs and delete the VRFs the hooks created in the pod (``created``,
        the pod state's record; best effort: a pod namespace that is gone took its VRFs with it). A NIC
        is found by its pod ifindex (a record without one: by its pod name), a VRF only by its record."""
        enslaved = [m for m in pending if m.vrf]
        if not enslaved and not created:
            return
        with contextlib.suppress(NetnsGone, OSError), self.ns.pod(netns) as (rtnl, _):
            indexed = [m for m in enslaved if m.pod_index]
            links = rtnl.links_by_index([m.pod_index or 0 for m in indexed])
            links += rtnl.links_by_name([m.pod_ifname for m in enslaved if not m.pod_index])
            ordered = indexed + [m for m in enslaved if not m.pod_index]
            reqs = [vrf.release(m.device, link.index) for m, link in zip(ordered, links, strict=True) if link]
            reqs += vrf.delete_created(rtnl, "vrf", created)
            for err in rtnl.run_each(reqs):
                if err is not None:
                    log.warning("VRF cleanup", extra={"kv": {"error": str(err)}})

    def restore_on_host(self, m: MovedDevice) -> None:
        """Set a returned NIC's host offload sizes and sysctls back (they followed it / were reset)."""
        if m.host_offload_sizes:
            link = self.ns.host_rtnl().link(m.host_ifname)
            if link is not None:
                self.ns.host_rtnl().run([offload_sizes.restore(m.device, link.index, m.host_offload_sizes)])
        if m.host_sysctls:
            try:
                sysctls.write(self.ns.host_fd, m.host_ifname, m.host_sysctls)
            except sysctls.SysctlError as exc:
                raise NetnsOpError(m.device, "restore sysctl", str(exc)) from exc
