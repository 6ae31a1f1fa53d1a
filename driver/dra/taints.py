"""Device taints on unhealthy devices (``resource.k8s.io/v1`` ``spec.devices[].taints``).

A device the driver's health check finds unhealthy gets one taint, the driver's key (the
network driver's: ``dra.net/unhealthy``), the reason as the value (its ``LinkDown``,
``PortNotActive``, ``NetdevMissing``: a taint value is a label value, so the details go to the
kubelet's health message instead) and the configured effect:

* ``NoSchedule`` (default): the scheduler allocates the device to no new claim that does not
  tolerate the taint; pods already holding it keep it.
* ``NoExecute``: in addition, the kube-controller-manager's device taint eviction controller
  evicts running pods whose claims hold the device (unless they tolerate it).
* ``None``: no taints (health still goes to the kubelet).

The taint is written with the ResourceSlice writes the publisher already makes (same coalescing,
same rate limit) and removed when the device is healthy again. ``timeAdded`` is the moment the
driver first saw the reason, and stays the same while it lasts, so an unchanged taint costs no
write. The apiserver keeps taints only with its ``DRADeviceTaints`` feature gate (alpha in
Kubernetes 1.34); :func:`device_taints_accepted` asks once, by dry run, before the first write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from driver.dra.field_support import stored_device
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)

OFF = "None"
"""The effect that turns tainting off."""


def _rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class UnhealthyTaints:
    """device -> its taint list, from device -> reason (only the unhealthy ones)."""

    def __init__(self, effect: str, key: str) -> None:
        self.effect = effect
        self.key = key
        self._since: dict[str, tuple[str, str]] = {}  # device -> (reason, timeAdded)

    def update(self, unhealthy: Mapping[str, str], now: float | None = None) -> dict[str, list[dict[str, Any]]]:
        """The taints for this set of unhealthy devices (an empty dict when the effect is None)."""
        if self.effect == OFF:
            return {}
        stamp = _rfc3339(time.time() if now is None else now)
        since = {}
        for device, reason in unhealthy.items():
            old = self._since.get(device)
            since[device] = old if old is not None and old[0] == reason else (reason, stamp)
        self._since = since
        return {
            device: [{"key": self.key, "value": reason, "effect": self.effect, "timeAdded": added}]
            for device, (reason, added) in sorted(since.items())
        }


def device_taints_accepted(kube: KubeClient, driver_name: str, node_name: str, key: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver stores device taints (its DRADeviceTaints gate)."""
    device = {"name": "taint-probe", "taints": [{"key": key, "value": "Probe", "effect": "NoSchedule"}]}
    stored, why = stored_device(kube, driver_name, node_name, "taint", device)
    if stored is None:
        return False, why
    if stored.get("taints"):
        return True, "accepted"
    return False, "the apiserver dropped the taint (its DRADeviceTaints feature gate is off)"
