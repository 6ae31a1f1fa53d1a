"""What every NRI hook works with: the checkpoint, the namespaces, the per-NIC helpers, the steps.

Also the two things every hook module names: :class:`HookError` and a pod's netns path.
"""

from __future__ import annotations

from dataclasses import dataclass

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PodNetState, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.netlink.namespaces import Namespaces
from driver.netlink.own_changes import OwnChanges
from driver.nri.hook_reports import HookReports
from driver.nri.hook_steps import StepClock
from driver.nri.netns_pins import NetnsPins
from driver.nri.pod_ethtool import PodEthtool
from driver.nri.pod_extras import PodExtras


class HookError(Exception):
    """A hook failed; the message names the pod, the device and the step."""


def pod_netns_path(pod: api.PodSandbox) -> str:
    """The pod's network namespace path, or "" for a hostNetwork pod."""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            return ns.path
    return ""


@dataclass
class HookContext:
    """The node side shared by the hooks that move NICs in (:mod:`~driver.nri.nic_attach`) and back
    (:mod:`~driver.nri.nic_return`)."""

    store: CheckpointStore
    ns: Namespaces
    # Announces each hook and the host links it changes, so their link events cost no
    # scan and background work steps aside while the hook runs (daemon: shared with them).
    own: OwnChanges
    sysfs_root: str
    # Exclusive RDMA netns mode: RDMA devices move with their netdev (detected at daemon start).
    rdma_exclusive: bool
    ethtool: PodEthtool
    extras: PodExtras
    reports: HookReports
    steps: StepClock
    pins: NetnsPins

    def netdevs(self, pod_uid: str) -> list[tuple[PreparedClaim, PreparedDevice]]:
        """The pod's prepared devices that have a netdev (the ones that move)."""
        claims = self.store.read(lambda s: s.claims_for_pod(pod_uid))
        return [(c, d) for c in claims for d in c.devices if d.snapshot.host.ifname]

    def pod_state(self, pod_uid: str) -> PodNetState | None:
        """The pod's NIC state in the checkpoint, None when it holds none of ours."""
        return self.store.read(lambda s: s.pods.get(pod_uid))
