"""A pod's NICs back to the host as recorded: write-ahead, found by what they are, restored, undone.

The return (StopPodSandbox, RemovePodSandbox, every rollback, a restarted driver's Synchronize, the
kubelet's unprepare) is write-ahead like the move in: the NICs are marked ``returning`` before the
first netlink call, and only those found home (or found nowhere: a virtual NIC destroyed with its
namespace) are marked ``returned``; the pod's state is dropped once all are. Idempotent. In the
pod the settings undo their part first (in reverse order: DHCP leases released, NICs out of their
VRFs, RDMA devices home) and the shares' sub-interfaces are deleted; the NICs come home through
:func:`driver.netlink.nic_home.return_links`, and each setting's host part is undone once its NIC
is home.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from driver.checkpoint.state import RETURNED, RETURNING, DriverState, MovedDevice, PodNetState
from driver.checkpoint.store import CheckpointStore
from driver.netlink import nic_home
from driver.netlink.hook_activity import HookActivity
from driver.netlink.kernel_features import MOVE_IFINDEX
from driver.netlink.link_identity import LinkIdentity
from driver.netlink.nic_moves import LinkState
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.setting import HostNetns, NicSetting, PodNetns
from driver.nri.dad_watch import DadWatch
from driver.nri.pod_netns import NetnsPins
from driver.nri.shares import SUB_INTERFACE, delete_subs
from driver.nri.step_clock import StepClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeParts:
    """What the hooks' attach and return share on a node: the checkpoint's record of its pods, the
    host's namespace, the hooks' announcements of the links they change, their step clock, the
    pinned namespaces, the NIC settings (in order) and the IPv6 detection."""

    store: CheckpointStore
    host: HostNetns
    own: HookActivity
    steps: StepClock
    pins: NetnsPins
    settings: tuple[NicSetting, ...]
    dad: DadWatch


class NicReturn:
    """Gives a pod's NICs back: the checkpoint's record of them, the host's namespace, the hooks'
    announcements of the links they change, their step clock, the pinned namespaces, the settings
    (undone in reverse order) and the IPv6 detection (a pod's addresses forgotten)."""

    def __init__(self, node: NodeParts) -> None:
        self.node = node

    def return_all(self, pod_uid: str, netns: str = "", outcome: dict[str, str | NetnsOpError] | None = None) -> str:
        """Return every NIC of the pod to the host as recorded; idempotent. Returns "" or the errors;
        ``outcome`` (when given) gets, per device, how it was found (``pod``, ``host``,
        ``netns-gone``) or why not."""
        state = self.node.store.read(lambda s: s.pods.get(pod_uid))
        if state is None:
            return ""
        self.node.dad.forget(pod_uid)
        self.node.own.expect(
            names=[m.host_ifname for m in state.devices if m.step != RETURNED],
            indexes=[m.host_index for m in state.devices if m.step != RETURNED and m.host_index],
        )

        def plan(s: DriverState) -> None:
            pod = s.pods[pod_uid]
            devices = [m if m.step == RETURNED else replace(m, step=RETURNING) for m in pod.devices]
            s.pods[pod_uid] = replace(pod, devices=devices)

        self.node.store.update(plan)
        self.node.steps.step("stop:planned")
        netns = self.node.pins.path(pod_uid, netns or state.netns_path)
        pending = [m for m in state.devices if m.step != RETURNED]
        moved = [m for m in pending if SUB_INTERFACE not in m.records]
        source = PodNetns(self.node.host, netns, created=state.created)
        try:
            for setting in reversed(self.node.settings):  # DHCP leases released, out of the VRFs, RDMA devices home
                setting.before_return([m for m in pending if setting.sub_interfaces or m in moved], source)
            deleted = delete_subs(source, [m for m in pending if m not in moved])
        finally:
            source.close()
        # Coming home, a NIC shows up in the host under its pod name before the rename.
        self.node.own.expect(names=[m.pod_ifname for m in moved])
        results: dict[str, str | NetnsOpError] = dict(deleted)
        results.update(
            nic_home.return_links(
                self.node.host.ns,
                netns,
                [self._return_item(m) for m in moved],
                announce=lambda indexes: self.node.own.expect(indexes=indexes),
                choose_index=self.node.host.kernel.has(MOVE_IFINDEX),
            )
        )
        self.node.steps.mark("stop:moved-and-restored")
        if outcome is not None:
            outcome.update(results)
        errors, done = self._after_return(pod_uid, state, results)

        def commit(s: DriverState) -> bool:
            """Mark the NICs home; True when the pod holds none any more (its state dropped)."""
            pod = s.pods.get(pod_uid)
            if pod is None:
                return True
            devices = [replace(m, step=RETURNED) if m.device in done else m for m in pod.devices]
            if all(m.step == RETURNED for m in devices):
                del s.pods[pod_uid]
                return True
            s.pods[pod_uid] = replace(pod, devices=devices)
            return False

        if self.node.store.update(commit):
            self.node.pins.unpin(pod_uid)
        self.node.steps.step("stop:committed")
        return "; ".join(errors)

    def _return_item(self, m: MovedDevice) -> nic_home.ReturnItem:
        """How to find ``m`` and what to give it back. Its pod MAC only helps records without an identity."""
        host = LinkState(
            ifname=m.host_ifname,
            mtu=m.host_mtu or 0,
            mac=m.host_mac or "",
            permanent_mac=m.permanent_mac,
            pci_address=m.pci_address,
            index=m.host_index,
        )
        return nic_home.ReturnItem(
            m.device,
            m.pod_ifname,
            host,
            pod_index=m.pod_index,
            identity=LinkIdentity.from_dict(m.identity) if m.identity is not None else None,
            extra_macs=(m.pod_mac,) if m.pod_mac and m.pod_mac != m.host_mac else (),
            # In the settings' order, as the pod's configuration was built.
            restores=lambda index: [r for s in self.node.settings for r in s.restore_requests(m, index)],
        )

    def _after_return(
        self, pod_uid: str, state: PodNetState, results: dict[str, str | NetnsOpError]
    ) -> tuple[list[str], list[str]]:
        """Each NIC's settings undone on the host once it is home; (errors, devices done)."""
        errors: list[str] = []
        done: list[str] = []
        returned: dict[str, str] = {}
        for i, m in enumerate(state.devices):
            if m.step == RETURNED:
                continue
            result = results[m.device]
            try:
                if isinstance(result, NetnsOpError):
                    raise result
                done.append(m.device)
                if SUB_INTERFACE in m.records:  # the NIC never left the host: nothing to restore there
                    returned[m.device] = f"sub-interface {m.pod_ifname} of {m.host_ifname}: {result}"
                    self.node.steps.step(f"stop:returned-{i}")
                    continue
                for setting in reversed(self.node.settings):  # also right when the pod netns is gone
                    setting.after_return(m, self.node.host)
                returned[m.device] = f"{m.host_ifname} (found in {result})"
            except (NetnsOpError, OSError) as exc:
                errors.append(str(exc))
                if isinstance(exc, NetnsOpError) and exc.step == "find":
                    # Nowhere to be found: a virtual NIC (veth, ...) destroyed with its netns.
                    # Retrying forever cannot bring it back; forget it (loudly).
                    done.append(m.device)
                log.error("NIC return failed", extra={"kv": {"pod": pod_uid, "device": m.device, "error": str(exc)}})
            self.node.steps.step(f"stop:returned-{i}")
        if returned:
            log.info("NICs returned", extra={"kv": {"pod": pod_uid, "devices": returned}})
        return errors, done
