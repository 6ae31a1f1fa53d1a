"""One DRA driver on one node, as the kubelet and the API server see it: Go's ``kubeletplugin.Helper``.

:class:`Helper` takes a driver (:class:`~driver.dra.protocol.DRADriver`) and its name, and runs
what every DRA kubelet plugin needs around it:

* the kubelet plugin (:class:`~driver.dra.plugin.KubeletPlugin`): registration, the DRA service
  calling the driver's ``prepare``/``unprepare``, the ``DRAResourceHealth`` stream;
* the ResourceSlices of the node's pool (:class:`~driver.dra.publisher.SlicePublisher`), from
  the driver's ``devices()`` each time the driver says they changed (:meth:`Helper.devices_changed`);
* device health (:class:`~driver.dra.health.HealthWatch`): the driver's ``health()`` every
  interval; a change goes to the kubelet's stream and, for unhealthy devices, into the slices as
  taints (:class:`~driver.dra.taints.UnhealthyTaints`).

The caller decides when each part runs: :meth:`start`/:meth:`stop` the sockets,
:meth:`publish` and :meth:`watch_health` are loops to run as tasks (a standby instance of a
rolling update serves the kubelet but publishes nothing).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic

from driver.dra.dra_service import RequestMetrics
from driver.dra.field_support import counter_sets_accepted
from driver.dra.health import DeviceHealthFeed, HealthWatch
from driver.dra.plugin import DEREGISTER_DELAY, STOP_GRACE, KubeletPlugin
from driver.dra.protocol import D, DeviceHealthState, DRADriver
from driver.dra.publisher import SlicePublisher
from driver.dra.taints import OFF, UnhealthyTaints, device_taints_accepted
from driver.kube.client import KubeClient

log = logging.getLogger(__name__)


class Helper(Generic[D]):
    """A driver's kubelet plugin, ResourceSlices and device health on one node."""

    def __init__(
        self,
        driver: DRADriver[D],
        kube: KubeClient,
        *,
        driver_name: str,
        node_name: str,
        dra_socket: str,
        registration_socket: str,
        taint_key: str,
        taint_effect: str = "NoSchedule",
        publish_interval: float = 2.0,
        health_interval: float = 1.0,
        metrics: RequestMetrics | None = None,
        on_published: Callable[[list[D], bool], None] | None = None,
        on_health: Callable[[list[DeviceHealthState]], None] | None = None,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``taint_key``/``taint_effect``: the taint of an unhealthy device (effect ``"None"``: no
        taints); ``on_published`` gets the devices after each successful sync and whether anything
        was written; ``on_health`` gets each new health of the devices; ``quiet`` is awaited
        before each slice write round and each health check."""
        self.driver = driver
        self.kube = kube
        self.driver_name, self.node_name = driver_name, node_name
        self.health_feed = DeviceHealthFeed()
        self.on_health = on_health
        self.taints = UnhealthyTaints(taint_effect, taint_key)
        self.taints_kept = True  # the apiserver keeps device taints (check_taints)
        self._health_taints: dict[str, list[dict[str, Any]]] = {}
        # The driver's taints for what devices are (device_taints), written with the health's.
        self._own_taints: dict[str, list[dict[str, Any]]] = {}
        self.plugin = KubeletPlugin(
            driver, driver_name, dra_socket, registration_socket, health=self.health_feed, metrics=metrics
        )
        self.publisher: SlicePublisher[D] = SlicePublisher(
            kube, driver_name, node_name, interval=publish_interval, on_published=on_published, quiet=quiet
        )
        self.health = HealthWatch(driver.health, health_interval, self._health_changed, quiet=quiet)
        # Shared counters published (KEP-4815): off when the apiserver would drop them (check_counters).
        self.counters = True

    @property
    def serving(self) -> bool:
        """Both kubelet sockets accept calls."""
        return self.plugin.serving

    @property
    def registered(self) -> bool | None:
        """The kubelet's last registration verdict (None before it gave one)."""
        return self.plugin.registered

    async def check_taints(self) -> None:
        """Turn tainting off (the health's and the driver's own) when the apiserver would drop device
        taints (asked once, by dry run): a slice it altered would be written again and again."""
        accepted, why = await asyncio.to_thread(
            device_taints_accepted, self.kube, self.driver_name, self.node_name, self.taints.key
        )
        if not accepted:
            self.taints_kept = False
            self._own_taints = {}
            self._set_taints()
            if self.taints.effect != OFF:
                self.taints.effect = OFF
                log.warning("unhealthy devices are not tainted in the ResourceSlice", extra={"kv": {"why": why}})

    async def start(self) -> None:
        """Serve the kubelet: the DRA socket, then the registration socket."""
        await self.plugin.start()

    async def stop(self, grace: float = STOP_GRACE, deregister_delay: float = DEREGISTER_DELAY) -> None:
        """Deregister from the kubelet and stop serving (see :meth:`KubeletPlugin.stop`)."""
        await self.plugin.stop(grace, deregister_delay)

    def devices_changed(self) -> None:
        """The driver's devices changed: publish ``driver.devices()`` and the counter sets they consume
        from (coalesced), and check their health now."""
        devices = list(self.driver.devices())
        self.publisher.update(devices, self.driver.counter_sets(devices) if self.counters else ())
        if self.taints_kept:
            own = {k: [dict(t) for t in v] for k, v in self.driver.device_taints(devices).items() if v}
            if own != self._own_taints:
                self._own_taints = own
                self._set_taints()
        self.health.poke()

    def _set_taints(self) -> None:
        """Each device's health taint, then the driver's own, into the next slice write."""
        merged = {k: list(v) for k, v in self._health_taints.items()}
        for device, own in self._own_taints.items():
            merged[device] = [*merged.get(device, []), *own]
        self.publisher.set_taints(merged)

    async def check_counters(self) -> None:
        """Publish no shared counters when the apiserver would drop them (asked once, by dry run):
        the devices are then published without ``consumesCounters`` too, each allocatable alone."""
        accepted, why = await asyncio.to_thread(counter_sets_accepted, self.kube, self.driver_name, self.node_name)
        if not accepted:
            self.counters = False
            log.warning("devices published without shared counters", extra={"kv": {"why": why}})

    async def publish(self) -> None:
        """Keep the node's ResourceSlices equal to the driver's devices, until cancelled."""
        await self.publisher.run()

    async def watch_health(self) -> None:
        """Check the devices' health every interval, until cancelled."""
        await self.health.run()

    async def _health_changed(self, states: list[DeviceHealthState]) -> None:
        """New device health: to the kubelet's stream, and as taints into the slices."""
        await self.health_feed.set(states)
        if self.on_health is not None:
            self.on_health(states)
        self._health_taints = self.taints.update({s.device: s.reason for s in states if not s.healthy})
        self._set_taints()
