"""A pod's NICs in at RunPodSandbox: planned against the host and the pod, moved, configured; all or nothing.

Write-ahead: before the first netlink call, the pod's :class:`~driver.checkpoint.state.PodNetState`
is persisted with every NIC in step ``moving`` together with everything needed to restore it on
the host. A driver killed at any point therefore finds, on restart, each NIC that may have left
the host and puts it back (Synchronize). One checkpoint write before and one after the netlink
work keep the fsync cost off the per-NIC path.

The work goes over a plan per NIC (:mod:`driver.nri.pod_plan`): what can be known before a move
is checked first, against the pod's namespace (names the pod has or its NICs share, MTUs, the
shares' limits and every setting's own checks): a refused pod has every NIC on the host,
untouched. Once the write-ahead record is on disk (with the ifindex each NIC gets in the pod and
what identifies it), the NICs move in steps that each leave them somewhere known
(:mod:`driver.netlink.nic_moves`), each checked; shares are made in the pod
(:mod:`driver.nri.shares`); then the settings work in the pod (:mod:`driver.nic_settings`), every
NIC's configuration going to the kernel in one pipelined batch. Any failure returns every NIC
(:mod:`driver.nri.nic_return`) and the hook fails naming the device and the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import NoReturn

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import DriverState, PodNetState
from driver.netlink.kernel_features import MOVE_IFINDEX
from driver.netlink.namespaces import NetnsGone
from driver.netlink.nic_moves import LinkState, Move, configure_pod_links, move_links, record_links, set_links
from driver.netlink.rtnl import NetnsOpError, Request
from driver.nic_settings.setting import Nic, PodNetns, SettingRefused
from driver.nri.address_pool import PoolError
from driver.nri.claim_reports import ClaimReports, HookError
from driver.nri.nic_return import NicReturn, NodeParts
from driver.nri.pod_plan import (
    Netdev,
    check_in_pod,
    check_names_and_mtus,
    for_setting,
    in_pod_state,
    moved_device,
    nic_plan,
    pod_indexes,
)
from driver.nri.shares import SharePlanner, create_request


class PodAttach:
    """Moves a pod's NICs in: over the checkpoint, the host's namespace, the hooks' announcements of
    the links they change, their step clock and pinned namespaces, the settings, the IPv6 detection
    (the pod's new addresses followed), the shares' planner, the claims' reports and the return
    (every rollback)."""

    def __init__(self, node: NodeParts, shares: SharePlanner, reports: ClaimReports, returns: NicReturn) -> None:
        self.node = node
        self.shares = shares
        self.reports = reports
        self.returns = returns

    def attach(self, pod: api.PodSandbox, netns: str, netdevs: list[Netdev]) -> None:
        """Plan every NIC against the host and the pod, then move them in; :class:`HookError` if any
        cannot go (nothing touched) or fails on the way (all returned)."""
        ifnames = [d.snapshot.host.ifname or "" for _, d in netdevs]  # netdevs_of: all have one
        self.node.own.expect(names=ifnames)
        try:
            hosts = record_links(self.node.host.ns, ifnames, self.node.host.sysfs_root)
        except KeyError as exc:
            self.reports.failed(pod, netdevs, netdevs[0][1].device, "record", str(exc))
            raise HookError(f"pod {pod.namespace}/{pod.name}: record failed: {exc}") from exc
        self.node.own.expect(indexes=[h.index for h in hosts.values()])
        self.node.steps.mark("run:recorded")
        try:
            leased = self.shares.leases(netdevs, hosts)
        except PoolError as exc:
            self.reports.failed(pod, netdevs, netdevs[0][1].device, "address pool", str(exc))
            raise HookError(f"pod {pod.namespace}/{pod.name}: address pool failed: {exc}") from exc
        plans = zip(netdevs, ifnames, strict=True)
        nics = [nic_plan(c, d, hosts[name], leased.get(d.device)) for (c, d), name in plans]
        target = PodNetns(self.node.host, netns, on_created=self._recorder(pod.uid))
        try:
            self._plan(pod, target, nics, hosts)
            self._move_in(pod, target, nics)
        finally:
            target.close()

    def _plan(self, pod: api.PodSandbox, target: PodNetns, nics: list[Nic], hosts: Mapping[str, LinkState]) -> None:
        """What can be known before a move, against the pod's namespace: every refusal is here, and
        each NIC's ifindex in the pod (its host one when free there); ``hosts``: the NICs as the
        host has them (a share's limits are its NIC's)."""
        try:
            links = target.rtnl.link_names()
        except (NetnsGone, OSError) as exc:
            reason = f"pod network namespace {target.path} is unusable: {exc}"
            self._refuse(pod, nics, nics[0].name, "netns", reason)
        target.names = set(links.values())
        try:
            check_names_and_mtus(nics, target.names, self.node.host.sysfs_root)
            self.shares.check(pod.uid, nics, hosts)
            for setting in self.node.settings:
                setting.plan(for_setting(setting, nics), self.node.host, target)
            indexes = pod_indexes(self.node.host, target, nics, links)
        except SettingRefused as exc:
            self._refuse(pod, nics, exc.device, exc.step, exc.reason)
        except OSError as exc:
            self._refuse(pod, nics, nics[0].name, "record", str(exc))
        for nic, index in zip(nics, indexes, strict=True):
            nic.pod_index = index

    def _move_in(self, pod: api.PodSandbox, target: PodNetns, nics: list[Nic]) -> None:
        """From the write-ahead record on: move, set, check, the settings in the pod, configure;
        any failure returns every NIC."""
        state = PodNetState(
            pod_uid=pod.uid,
            sandbox_id=pod.id,
            namespace=pod.namespace,
            name=pod.name,
            netns_path=target.path,
            devices=[moved_device(nic) for nic in nics],
        )

        def plan(s: DriverState) -> None:
            s.pods[pod.uid] = state

        self.node.store.update(plan)  # write-ahead: from here every NIC may be in the pod
        self.node.steps.step("run:planned")
        moves = [self._move(nic) for nic in nics]
        whole = [m for m, nic in zip(moves, nics, strict=True) if not nic.sub_interface]
        device, step = "", "move"
        try:
            # All moves in one pipelined send (the kernel still does them one by one); the
            # write-ahead state above already covers every NIC. Shares are made in the pod.
            _raise_first(move_links(self.node.host.rtnl(), whole, target.fd, self.node.host.kernel.has(MOVE_IFINDEX)))
            step = "create"
            subs = [create_request(nic, target.fd) for nic in nics if nic.sub_interface]
            _raise_first(self.node.host.rtnl().run_each(subs))
            for i in range(len(nics)):
                self.node.steps.step(f"run:moved-{i}")
            step = "set link"
            # The settings by ifindex, and every NIC read back for the check, in one round trip.
            errors, found = set_links(target.rtnl, whole, [m.pod_index for m in moves])
            _raise_first(errors)
            self.node.steps.step("run:set")
            step = "verify"
            links = check_in_pod(moves, nics, found)
            step = "in pod"
            for setting in self.node.settings:
                setting.in_pod(for_setting(setting, nics), target)
            self.node.steps.step("run:in-pod")
            step = "configure"
            reqs: list[Request] = [
                r for nic in nics for s in self.node.settings if for_setting(s, [nic]) for r in s.requests(nic)
            ]
            results = configure_pod_links(target.rtnl, reqs, {nic.name: (nic.pod, links[nic.name]) for nic in nics})
            for nic in nics:
                nic.result = results[nic.name]
            for setting in self.node.settings:
                setting.after_configure(for_setting(setting, nics), target)
            self.node.steps.step("run:configured")
        except (NetnsOpError, NetnsGone, OSError) as exc:
            if isinstance(exc, NetnsOpError):
                device, step, reason = exc.device, exc.step, exc.reason
            else:
                reason = f"pod network namespace {target.path} is unusable: {exc}"
            target.close()
            rollback = self.returns.return_all(pod.uid, target.path)
            msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
            if rollback:
                msg += f"; rollback: {rollback}"
            self.reports.failed(pod, [(nic.claim, nic.device) for nic in nics], device, step, msg)
            raise HookError(msg) from exc
        self.node.store.update(lambda s: s.pods.__setitem__(pod.uid, in_pod_state(s.pods[pod.uid], nics, links)))
        self.node.pins.pin(pod.uid, target.path)
        self.node.steps.step("run:committed")
        if target.tentative:  # followed in the background: the pod's containers may use them at once
            pending = {key: device for key, (device, _) in target.tentative.items()}
            usable = all(optimistic for _, optimistic in target.tentative.values())
            self.node.dad.watch(pod.uid, self.node.pins.path(pod.uid, target.path), pending, usable)
        self.reports.ready(pod, nics)

    def _move(self, nic: Nic) -> Move:
        """The NIC's two requests: into the pod at its planned ifindex and name, then its MTU, MAC and
        the settings' link attributes there."""
        attrs = b"".join(setting.link_attrs(nic) for setting in self.node.settings if for_setting(setting, [nic]))
        return Move(nic.name, nic.host.index or 0, nic.pod.ifname, nic.pod_index, nic.pod.mtu, nic.pod.mac, attrs)

    def _recorder(self, pod_uid: str) -> Callable[[dict[str, object]], None]:
        """Records a link the hook just created in the pod (kind, ifindex, name), before anything else."""

        def record(created: dict[str, object]) -> None:
            def add(s: DriverState) -> None:
                pod = s.pods[pod_uid]
                s.pods[pod_uid] = replace(pod, created=[*pod.created, created])

            self.node.store.update(add)

        return record

    def _refuse(self, pod: api.PodSandbox, nics: list[Nic], device: str, step: str, reason: str) -> NoReturn:
        """Fail the hook before anything moved: reported, nothing to roll back."""
        msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
        self.reports.failed(pod, [(nic.claim, nic.device) for nic in nics], device, step, msg)
        raise HookError(msg)


def _raise_first(errors: list[NetnsOpError | None]) -> None:
    for err in errors:
        if err is not None:
            raise err
