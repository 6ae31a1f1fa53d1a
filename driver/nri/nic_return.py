"""StopPodSandbox / RemovePodSandbox (and every rollback): a pod's NICs back to the host, as recorded.

Write-ahead like the move in: the NICs are marked ``returning`` before the first netlink call,
and only those found home (or found nowhere: a virtual NIC destroyed with its namespace) are
marked ``returned``; the pod's state is dropped once all are. Idempotent, so a retried stop, a
restarted driver (Synchronize) and the kubelet's unprepare can all call it.
"""

from __future__ import annotations

import logging

from driver.checkpoint.state import DriverState, MovedDevice
from driver.netlink import nic_home
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.nic_moves import LinkState
from driver.netlink.pod_rules import Neighbor, Rule
from driver.netlink.rtnl import NetnsOpError, Route
from driver.nri import pod_dhcp
from driver.nri.hook_context import HookContext
from driver.nri.hook_steps import RETURNED, RETURNING
from driver.nri.pod_rdma import return_rdma

log = logging.getLogger(__name__)


def _link_state(moved: MovedDevice) -> LinkState:
    return LinkState(
        ifname=moved.host_ifname,
        mtu=moved.host_mtu or 0,
        mac=moved.host_mac or "",
        addresses=list(moved.host_addresses),
        routes=[Route.from_dict(r) for r in moved.host_routes],
        rules=[Rule.from_dict(r) for r in moved.host_rules],
        neighbors=[Neighbor.from_dict(n) for n in moved.host_neighbors],
        permanent_mac=moved.permanent_mac,
        pci_address=moved.pci_address,
        index=moved.host_index,
    )


def _return_item(m: MovedDevice) -> nic_home.ReturnItem:
    """How to find ``m`` and what to give it back. Its pod MAC only helps records without an identity."""
    return nic_home.ReturnItem(
        m.device,
        m.pod_ifname,
        _link_state(m),
        pod_index=m.pod_index,
        identity=LinkIdentity.from_dict(m.identity) if m.identity is not None else None,
        extra_macs=(m.pod_mac,) if m.pod_mac and m.pod_mac != m.host_mac else (),
    )


def return_all(ctx: HookContext, pod_uid: str, netns: str = "") -> str:
    """Return every NIC of the pod to the host; idempotent. Returns "" or the errors."""
    state = ctx.pod_state(pod_uid)
    if state is None:
        return ""
    ctx.own.expect(
        names=[m.host_ifname for m in state.devices if m.step != RETURNED],
        indexes=[m.host_index for m in state.devices if m.step != RETURNED and m.host_index],
    )

    def plan(s: DriverState) -> None:
        for m in s.pods[pod_uid].devices:
            if m.step != RETURNED:
                m.step = RETURNING

    ctx.store.update(plan)
    ctx.steps.step("stop:planned")
    netns = ctx.pins.path(pod_uid, netns or state.netns_path)
    pending = [m for m in state.devices if m.step != RETURNED]
    # Leases are released from the pod, before their NICs leave it.
    pod_dhcp.release_in(ctx.ns, netns, [(m.device, m.pod_ifname, m.dhcp_lease) for m in pending if m.dhcp_lease])
    for m in pending:
        if ctx.rdma_exclusive and m.rdma_device:  # RDMA devices first, as the Go driver (#180)
            return_rdma(ctx.ns, m, netns)
    ctx.extras.before_return(netns, pending, state.created)  # out of their VRFs, which go (only those made here)
    # Coming home, a NIC shows up in the host under its pod name before the rename.
    ctx.own.expect(names=[m.pod_ifname for m in pending])
    results = nic_home.return_links(
        ctx.ns, netns, [_return_item(m) for m in pending], announce=lambda indexes: ctx.own.expect(indexes=indexes)
    )
    ctx.steps.mark("stop:moved-and-restored")
    errors, done = [], []
    returned: dict[str, str] = {}
    for i, m in enumerate(state.devices):
        if m.step == RETURNED:
            continue
        result = results[m.device]
        try:
            if isinstance(result, NetnsOpError):
                raise result
            done.append(m.device)
            if m.host_features or m.host_private_flags:
                # After the return, on the host: also right when the pod netns is gone.
                ctx.ethtool.restore_on_host(m.device, m.host_ifname, m.host_features, m.host_private_flags)
            ctx.extras.restore_on_host(m)
            returned[m.device] = f"{m.host_ifname} (found in {result})"
        except (NetnsOpError, OSError) as exc:
            errors.append(str(exc))
            if isinstance(exc, NetnsOpError) and exc.step == "find":
                # Nowhere to be found: a virtual NIC (veth, ...) destroyed with its netns.
                # Retrying forever cannot bring it back; forget it (loudly).
                done.append(m.device)
            log.error("NIC return failed", extra={"kv": {"pod": pod_uid, "device": m.device, "error": str(exc)}})
        ctx.steps.step(f"stop:returned-{i}")
    if returned:
        log.info("NICs returned", extra={"kv": {"pod": pod_uid, "devices": returned}})

    def commit(s: DriverState) -> None:
        pod = s.pods.get(pod_uid)
        if pod is None:
            return
        for m in pod.devices:
            if m.device in done:
                m.step = RETURNED
        if all(m.step == RETURNED for m in pod.devices):
            del s.pods[pod_uid]

    ctx.store.update(commit)
    if ctx.pod_state(pod_uid) is None:
        ctx.pins.unpin(pod_uid)
    ctx.steps.step("stop:committed")
    return "; ".join(errors)
