"""RunPodSandbox: a pod's prepared NICs recorded on the host, moved into its netns and configured.

All or nothing. What can be known before a move is checked first, against the pod's namespace
(:mod:`driver.nri.pod_checks`): a refused pod has every NIC on the host, untouched. Once the
write-ahead record is on disk (with the ifindex each NIC gets in the pod and what identifies it),
the NICs move in steps that each leave them somewhere known (:mod:`driver.netlink.nic_moves`),
each checked; any failure returns every NIC (:func:`~driver.nri.nic_return.return_all`, which
finds them by that record) and the hook fails naming the device and the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NoReturn

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import DriverState, MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.netlink import nic_moves
from driver.netlink.ethtool import EthtoolPlan
from driver.netlink.link_identity import LinkIdentity, free_indexes
from driver.netlink.namespaces import NetnsGone
from driver.netlink.nic_moves import LinkState, PodLinkConfig
from driver.netlink.rtnl import NetnsOpError, Rtnl
from driver.nri import pod_checks, pod_dhcp
from driver.nri.hook_context import HookContext, HookError
from driver.nri.hook_steps import IN_POD, MOVING
from driver.nri.nic_return import return_all
from driver.nri.pod_config import pod_link_config
from driver.nri.pod_ethtool import EthtoolPlanError
from driver.nri.pod_extras import ExtrasPlanError, HostExtras
from driver.nri.pod_rdma import move_rdma


def _moved_device(
    d: PreparedDevice,
    st: LinkState,
    cfg: PodLinkConfig,
    plan: EthtoolPlan | None,
    extra: HostExtras | None,
    pod_index: int,
) -> MovedDevice:
    """The write-ahead record of one NIC about to move: its host state and what undoes the pod's settings."""
    return MovedDevice(
        device=d.device,
        host_ifname=st.ifname,
        pod_ifname=cfg.ifname,
        permanent_mac=d.snapshot.host.permanent_mac or st.permanent_mac,
        pci_address=d.snapshot.host.pci_address or st.pci_address,
        host_mtu=st.mtu,
        host_mac=st.mac,
        host_addresses=st.addresses,
        host_routes=[r.to_dict() for r in st.routes],
        host_rules=[r.to_dict() for r in st.rules],
        host_neighbors=[n.to_dict() for n in st.neighbors],
        rdma_device=d.snapshot.host.rdma_device,
        pod_mac=cfg.mac or st.mac,
        step=MOVING,
        host_features=dict(plan.original_features) if plan is not None else {},
        host_private_flags=dict(plan.original_private_flags) if plan is not None else {},
        host_offload_sizes=extra.offload_sizes if extra is not None else {},
        host_sysctls=extra.sysctls if extra is not None else {},
        vrf=d.config.interface.vrf.name if d.config.interface and d.config.interface.vrf else None,
        ebpf_detached=list(extra.removed_by_move) if extra is not None else [],
        host_index=st.index,
        pod_index=pod_index,
        identity=(st.identity or LinkIdentity()).to_dict(),
    )


def _refuse(
    ctx: HookContext,
    pod: api.PodSandbox,
    netdevs: list[tuple[PreparedClaim, PreparedDevice]],
    device: str,
    step: str,
    reason: str,
) -> NoReturn:
    """Fail the hook before anything moved: reported, nothing to roll back."""
    msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
    ctx.reports.failed(pod, netdevs, device, step, msg)
    raise HookError(msg)


def attach(
    ctx: HookContext, pod: api.PodSandbox, netns: str, netdevs: list[tuple[PreparedClaim, PreparedDevice]]
) -> None:
    """Move and configure ``netdevs`` into the pod's ``netns``; :class:`HookError` (all returned) if any fails."""
    ifnames = [d.snapshot.host.ifname or "" for _, d in netdevs]  # HookContext.netdevs: all have one
    ctx.own.expect(names=ifnames)
    first = netdevs[0][1].device
    try:
        states = nic_moves.record_host(ctx.ns, ifnames, ctx.sysfs_root)
    except KeyError as exc:
        ctx.reports.failed(pod, netdevs, first, "record", str(exc))
        raise HookError(f"pod {pod.namespace}/{pod.name}: record failed: {exc}") from exc
    ctx.own.expect(indexes=[st.index for st in states.values()])
    ctx.steps.mark("run:recorded")
    configs = {d.device: pod_link_config(d, states[name]) for (_, d), name in zip(netdevs, ifnames, strict=True)}
    nics = [(d, states[name]) for (_, d), name in zip(netdevs, ifnames, strict=True)]
    with contextlib.ExitStack() as stack:
        try:
            pod_rtnl, pod_fd = stack.enter_context(ctx.ns.pod(netns))
            pod_links = pod_rtnl.link_names()
        except (NetnsGone, OSError) as exc:
            _refuse(ctx, pod, netdevs, first, "netns", f"pod network namespace {netns} is unusable: {exc}")
        try:
            pod_checks.check(
                [pod_checks.PlannedNic(d, st, configs[d.device]) for d, st in nics],
                pod_links.values(),
                ctx.sysfs_root,
            )
            plans = ctx.ethtool.plans(
                (d.device, name, d.config.ethtool) for (_, d), name in zip(netdevs, ifnames, strict=True)
            )
            extras = ctx.extras.plan(nics)
            # The ifindex each NIC gets in the pod (its host one when free there): where it is found
            # again whatever happens after the move.
            pod_indexes = free_indexes(pod_rtnl, [st.index or 0 for _, st in nics], set(pod_links))
        except (pod_checks.PodCheckError, EthtoolPlanError, ExtrasPlanError, OSError) as exc:
            device = getattr(exc, "device", first)
            step = exc.step if isinstance(exc, (pod_checks.PodCheckError, ExtrasPlanError)) else "ethtool"
            reason = getattr(exc, "reason", str(exc))
            _refuse(ctx, pod, netdevs, device, step, reason)
        moved = [
            _moved_device(d, st, configs[d.device], plans.get(d.device), extras.get(d.device), index)
            for (d, st), index in zip(nics, pod_indexes, strict=True)
        ]
        _attach_planned(ctx, pod, netns, netdevs, nics, configs, plans, extras, moved, pod_rtnl, pod_fd)


def _attach_planned(
    ctx: HookContext,
    pod: api.PodSandbox,
    netns: str,
    netdevs: list[tuple[PreparedClaim, PreparedDevice]],
    nics: list[tuple[PreparedDevice, LinkState]],
    configs: dict[str, PodLinkConfig],
    plans: dict[str, EthtoolPlan],
    extras: dict[str, HostExtras],
    moved: list[MovedDevice],
    pod_rtnl: Rtnl,
    pod_fd: int,
) -> None:
    """From the write-ahead record on: move, set, check, configure; any failure returns every NIC."""
    state = PodNetState(
        pod_uid=pod.uid, sandbox_id=pod.id, namespace=pod.namespace, name=pod.name, netns_path=netns, devices=moved
    )

    def plan(s: DriverState) -> None:
        s.pods[pod.uid] = state

    ctx.store.update(plan)  # write-ahead: from here every NIC may be in the pod
    ctx.steps.step("run:planned")
    device, step = "", "move"
    moves = [
        nic_moves.Move(
            m.device,
            m.host_index or 0,
            configs[m.device].ifname,
            m.pod_index or 0,
            configs[m.device].mtu,
            configs[m.device].mac,
            ctx.extras.move_attrs(d),
        )
        for m, (d, _) in zip(moved, nics, strict=True)
    ]
    try:
        # All moves in one pipelined send (the kernel still does them one by one); the
        # write-ahead state above already covers every NIC.
        _raise_first(nic_moves.move_links(ctx.ns.host_rtnl(), moves, pod_fd))
        for i in range(len(moved)):
            ctx.steps.step(f"run:moved-{i}")
        step = "set link"
        _raise_first(nic_moves.set_links(pod_rtnl, moves))
        ctx.steps.step("run:set")
        step = "verify"
        links = nic_moves.check_moved(pod_rtnl, moves, {m.device: LinkIdentity.from_dict(m.identity) for m in moved})
        step = "rdma move"
        for m in moved if ctx.rdma_exclusive else ():
            if m.rdma_device:
                device = m.device
                move_rdma(ctx.ns, m, ctx.ns.host_fd, pod_fd)
        step = "ethtool"
        ctx.ethtool.apply_in_pod(pod_fd, {dev: (configs[dev].ifname, p) for dev, p in plans.items()})
        ctx.steps.step("run:ethtool")
        step = "configure"
        detached = ctx.extras.in_pod(pod_rtnl, pod_fd, nics, configs, _record_created(ctx, pod.uid)) if extras else {}
        results = nic_moves.configure_pod_links(pod_rtnl, configs, links)
        if extras:
            ctx.extras.after_configure(pod_fd, [(d, configs[d.device].ifname) for d, _ in nics])
        ctx.steps.step("run:configured")
        step = "dhcp"
        leases = pod_dhcp.take_leases(pod_rtnl, pod_fd, nics, results)
        ctx.steps.mark("run:dhcp")
    except (NetnsOpError, NetnsGone, OSError) as exc:
        if isinstance(exc, NetnsOpError):
            device, step, reason = exc.device, exc.step, exc.reason
        else:
            reason = f"pod network namespace {netns} is unusable: {exc}"
        rollback = return_all(ctx, pod.uid, netns)
        msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
        if rollback:
            msg += f"; rollback: {rollback}"
        ctx.reports.failed(pod, netdevs, device, step, msg)
        raise HookError(msg) from exc
    links_by_device = {m.device: links[m.device] for m in moved}

    def commit(s: DriverState) -> None:
        for m in s.pods[pod.uid].devices:
            m.step = IN_POD
            m.ebpf_detached = m.ebpf_detached + detached.get(m.device, [])
            m.dhcp_lease = leases[m.device].to_dict() if m.device in leases else None
            # The pod's view of a veth's peer, now that it is in the pod: a link the pod makes
            # itself cannot have its peer outside the pod.
            m.identity = LinkIdentity.of(links_by_device[m.device], in_pod=True).to_dict()

    ctx.store.update(commit)
    ctx.pins.pin(pod.uid, netns)
    ctx.steps.step("run:committed")
    ctx.reports.ready(pod, netdevs, results)


def _raise_first(errors: list[NetnsOpError | None]) -> None:
    for err in errors:
        if err is not None:
            raise err


def _record_created(ctx: HookContext, pod_uid: str) -> Callable[[dict[str, object]], None]:
    """Records a link the hook just created in the pod (kind, ifindex, name), before anything else."""

    def record(created: dict[str, object]) -> None:
        def add(s: DriverState) -> None:
            s.pods[pod_uid].created.append(created)

        ctx.store.update(add)

    return record
