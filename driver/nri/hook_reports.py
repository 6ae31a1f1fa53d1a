"""What the NRI hooks report about a pod's NICs: to the log, and to the claim status.

:class:`HookReports` turns a RunPodSandbox outcome into calls on a :class:`StatusSink` (in the
daemon, :class:`~driver.claims.status.ClaimStatusWriter`): one ``pod_network_ready`` per claim
with each NIC's :class:`~driver.claims.status_entries.DeviceResult`, or one ``pod_network_failed``
for the claim of the NIC that failed. A sink that raises never fails the hook.
"""

from __future__ import annotations

import logging
from typing import Protocol

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.status_entries import DeviceResult
from driver.netlink.nic_moves import PodLinkResult

log = logging.getLogger(__name__)


class StatusSink(Protocol):
    """Receives hook outcomes to publish (claim status, events). Must not block."""

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        """Every NIC of ``claim`` is configured in the pod."""

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        """Attaching ``device`` failed at ``step`` (everything was rolled back)."""


class HookReports:
    """Reports a pod's NIC outcomes to ``status`` (nothing but logs when it is None)."""

    def __init__(self, status: StatusSink | None) -> None:
        self.status = status

    def ready(
        self,
        pod: api.PodSandbox,
        netdevs: list[tuple[PreparedClaim, PreparedDevice]],
        results: dict[str, PodLinkResult],
    ) -> None:
        """Every NIC of the pod is configured: one report per claim."""
        if self.status is None:
            return
        for claim in {c.uid: c for c, _ in netdevs}.values():
            out = [
                DeviceResult(d.device, results[d.device].ifname, results[d.device].addresses, results[d.device].mac)
                for c, d in netdevs
                if c.uid == claim.uid
            ]
            try:
                self.status.pod_network_ready(pod.uid, claim, out)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def failed(
        self,
        pod: api.PodSandbox,
        netdevs: list[tuple[PreparedClaim, PreparedDevice]],
        device: str,
        step: str,
        message: str,
    ) -> None:
        """Attaching ``device`` (or, when "", the pod's NICs) failed at ``step``; all was rolled back."""
        log.error(
            "RunPodSandbox failed", extra={"kv": {"pod": pod.uid, "device": device, "step": step, "error": message}}
        )
        if self.status is None:
            return
        for claim, d in netdevs:
            if d.device == device or not device:
                try:
                    self.status.pod_network_failed(pod.uid, claim, device, step, message)
                except Exception:
                    log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})
                break
