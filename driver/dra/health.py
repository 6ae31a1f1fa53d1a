"""Device health for the kubelet: what each published device's state is, and the gRPC stream that reports it.

The daemon evaluates every device after each scan (:func:`device_health_states`) and hands the
list to a :class:`DeviceHealthFeed`; :class:`DeviceHealthService` (``v1alpha1.DRAResourceHealth``,
served on the DRA socket) sends the complete list on every change and again every few seconds,
because the kubelet turns devices whose last update is older than its timeout into Unknown.
Not to be confused with the HTTP readiness probe (:mod:`driver.probe_server`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dranet_proto import dra_health_v1alpha1_pb2 as health_pb
from dranet_proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from driver.model.device import Device
from driver.netlink.link_health import LinkFacts

LINK_DOWN = "LinkDown"
PORT_NOT_ACTIVE = "PortNotActive"
NETDEV_MISSING = "NetdevMissing"
"""Why a device is unhealthy: the value of its ``dra.net/unhealthy`` taint in the ResourceSlice."""


@dataclass(frozen=True)
class DeviceHealthState:
    """Health of one published device as streamed to the kubelet."""

    pool: str
    device: str
    healthy: bool
    message: str  # why it is unhealthy, or a note ("netdev eth1 is in a pod network namespace")
    reason: str = ""  # LINK_DOWN, PORT_NOT_ACTIVE, NETDEV_MISSING when unhealthy


def _port_states(root: Path, rdma_device: str) -> list[str]:
    states = []
    for port in sorted((root / "class" / "infiniband" / rdma_device / "ports").glob("*/state")):
        try:
            states.append(port.read_text().strip())  # e.g. "4: ACTIVE"
        except OSError:
            continue
    return states


def assess(device: Device, sysfs_root: str, in_use: bool, link: LinkFacts | None = None) -> tuple[bool, str, str]:
    """(healthy, reason, message) of one device.

    Unhealthy: its netdev is administratively up but has no carrier (``LinkDown``; ``link`` comes
    from netlink in the namespace the netdev is in), its RDMA device has ports and none is
    ACTIVE (``PortNotActive``), or its netdev is gone from the host while no pod holds it
    (``NetdevMissing``). An administratively down link tells nothing about its cable: healthy.
    """
    root = Path(sysfs_root)
    host = device.host
    if link is not None and link.admin_up and not link.carrier:
        return False, LINK_DOWN, f"link down: {link.ifname} ({link.where}) has no carrier, operstate {link.operstate}"
    if host.rdma_device:
        states = _port_states(root, host.rdma_device)
        if states and not any(s.endswith("ACTIVE") for s in states):
            return False, PORT_NOT_ACTIVE, f"RDMA device {host.rdma_device}: no ACTIVE port ({', '.join(states)})"
        if not host.ifname:
            if states:
                return True, "", ""
            return False, PORT_NOT_ACTIVE, f"RDMA device {host.rdma_device}: no ACTIVE port (no ports)"
    if host.ifname:
        if link is not None or (root / "class" / "net" / host.ifname).exists():
            return True, "", ""
        if in_use:
            return True, "", f"netdev {host.ifname} is in a pod network namespace"
        return False, NETDEV_MISSING, f"netdev {host.ifname} is missing"
    return True, "", ""  # nothing to probe (e.g. a function without netdev or RDMA)


def evaluate_health(device: Device, sysfs_root: str, in_use: bool) -> tuple[bool, str]:
    """(healthy, message) from sysfs alone (see :func:`assess`)."""
    healthy, _reason, message = assess(device, sysfs_root, in_use)
    return healthy, message


class DeviceHealthFeed:
    """The current health of every published device; notifies streams when it changes."""

    def __init__(self) -> None:
        self._states: list[DeviceHealthState] = []
        self._version = 0
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # created lazily inside the running loop
            self._changed = asyncio.Condition()
        return self._changed

    async def set(self, states: list[DeviceHealthState]) -> None:
        """Replace the device list; wakes the streams only if something changed."""
        states = sorted(states, key=lambda s: (s.pool, s.device))
        if states == self._states and self._version:
            return
        cond = self._condition()
        async with cond:
            self._states = states
            self._version += 1
            cond.notify_all()

    def snapshot(self) -> tuple[int, list[DeviceHealthState]]:
        """The version and the complete device list."""
        return self._version, list(self._states)

    async def wait_change(self, seen: int, timeout: float | None = None) -> bool:
        """Return True once the version differs from ``seen``; False after ``timeout`` seconds."""
        cond = self._condition()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self._version != seen), timeout)
            except TimeoutError:
                return False
            return True


class DeviceHealthService(health_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth``: streams the feed's device health to the kubelet."""

    def __init__(self, feed: DeviceHealthFeed, timeout_seconds: int, resend_seconds: float) -> None:
        self.feed = feed
        self.timeout_seconds = timeout_seconds
        self.resend_seconds = resend_seconds

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        # Send the complete list at once, on every change, and again every resend_seconds:
        # the kubelet turns devices whose last update is older than its timeout into Unknown.
        while True:
            version, states = self.feed.snapshot()
            now = int(time.time())
            yield health_pb.NodeWatchResourcesResponse(
                devices=[
                    health_pb.DeviceHealth(
                        device=health_pb.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                        health=health_pb.HEALTHY if s.healthy else health_pb.UNHEALTHY,
                        last_updated_time=now,
                        health_check_timeout_seconds=self.timeout_seconds,
                        message=s.message,
                    )
                    for s in states
                ]
            )
            await self.feed.wait_change(version, self.resend_seconds)


def device_health_states(
    devices: dict[str, Device],
    pool: str,
    sysfs_root: str,
    in_use: Callable[[str], bool],
    links: dict[str, LinkFacts] | None = None,
) -> list[DeviceHealthState]:
    """Evaluate every published device; ``links``: device name -> its netdev's link, where known."""
    out = []
    links = links or {}
    for name, device in devices.items():
        healthy, reason, message = assess(device, sysfs_root, in_use(name), links.get(name))
        out.append(DeviceHealthState(pool=pool, device=name, healthy=healthy, message=message, reason=reason))
    return out
