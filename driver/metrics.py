"""Prometheus metrics of the node driver, kept in one registry object that is passed around.

Names, labels and label values are the Go reference driver's (namespace ``dranet``, subsystem
``driver``), so its users' dashboards and alerts keep working: ``dra_plugin_requests_total`` and
``..._latency_seconds`` (kubelet calls), ``nri_plugin_requests_total`` and ``..._latency_seconds``
(runtime hooks), ``published_devices_total{feature="total|rdma"}``,
``last_published_time_seconds``; status ``success`` or ``failed`` (a hook with nothing to do
is a ``success``: the Go driver's ``noop`` is not told apart); ``claim_devices_allocated`` and
``claim_devices_ready`` (read from the driver's state at each scrape,
:meth:`Metrics.watch_claim_devices`). Ours on top: ``dra_plugin_claim_errors_total`` and
``state_write_failures_total{file}`` (:meth:`Metrics.watch_state_writes`: a state file that could
not be saved, e.g. a full or read-only disk; ``file`` is ``checkpoint.json``, ``pods.json`` or
``checkpoint.lock``), ``state_files_mended_total{kind,reason}`` (:meth:`Metrics.watch_state_files_mended`:
a device metadata file or CDI spec found missing or damaged and written again).

A private :class:`CollectorRegistry` (not the client's global default) lets tests and
several in-process drivers each have their own counters; it carries the client's process,
platform and garbage-collector collectors too (``process_resident_memory_bytes``,
``process_cpu_seconds_total``, ``process_open_fds``, ...), as the default registry would.
``device_healthy{device}`` is 1 or 0 per published device (the health check's verdict).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

NAMESPACE = "dranet"
SUBSYSTEM = "driver"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SUCCESS, FAILED = "success", "failed"


ClaimDeviceCounts = Callable[[], tuple[int, int]]
"""Reads ``(allocated, ready)`` device counts from the driver's state (see :class:`ClaimDevices`)."""


class ClaimDevices(Collector):
    """The Go driver's ``claim_devices_allocated`` and ``claim_devices_ready`` gauges, read at scrape.

    ``allocated``: devices of prepared claims, once per pod the claim is reserved for (what
    NodePrepareResources stored), whether or not the NRI hook has attached them yet. ``ready``:
    those of them the hook has attached; ``allocated - ready`` is the number of devices stuck
    mid-attachment. Read from the state files at each scrape, so never out of step with them.
    """

    ALLOCATED = f"{NAMESPACE}_{SUBSYSTEM}_claim_devices_allocated"
    READY = f"{NAMESPACE}_{SUBSYSTEM}_claim_devices_ready"

    def __init__(self, counts: ClaimDeviceCounts) -> None:
        self.counts = counts

    def _families(self, allocated: float | None, ready: float | None) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                self.ALLOCATED,
                "Devices allocated to a pod on this node (prepared by NodePrepareResources), attached or not.",
                value=allocated,
            ),
            GaugeMetricFamily(
                self.READY,
                "Allocated devices on this node the NRI hook has attached; allocated - ready are stuck mid-attachment.",
                value=ready,
            ),
        ]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The two gauges without samples (registration reads no state)."""
        yield from self._families(None, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The two gauges with the current counts; none when the state cannot be read (logged)."""
        try:
            allocated, ready = self.counts()
        except Exception as exc:  # noqa: BLE001 - a scrape must never fail for the state's sake
            log.warning("claim device counts unavailable", extra={"kv": {"error": str(exc)}})
            return
        yield from self._families(allocated, ready)


class StateWriteFailures(Collector):
    """``state_write_failures_total{file}``: failed saves of each state file, read at scrape from
    the checkpoint store's own count (the store is built before the metrics)."""

    NAME = f"{NAMESPACE}_{SUBSYSTEM}_state_write_failures"
    HELP = "State file saves that failed (full or read-only disk, I/O error), by file name."

    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self.counts = counts

    def describe(self) -> Iterator[CounterMetricFamily]:
        """The counter without samples."""
        yield CounterMetricFamily(self.NAME, self.HELP, labels=["file"])

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One sample per file that ever failed."""
        family = CounterMetricFamily(self.NAME, self.HELP, labels=["file"])
        for name, count in sorted(dict(self.counts()).items()):
            family.add_metric([name], count)
        yield family


class StateFilesMended(Collector):
    """``state_files_mended_total{kind,reason}``: files the driver owns that it found missing or
    damaged and wrote again (``kind``: ``metadata``, a device metadata file, or ``cdi``, its CDI
    spec; ``reason``: ``missing``, ``unreadable``, ``truncated``, ``unparsable``, ``differs``), read at
    scrape from the metadata writer's own count."""

    NAME = f"{NAMESPACE}_{SUBSYSTEM}_state_files_mended"
    HELP = "Files the driver owns (device metadata files, their CDI specs) found missing or damaged and written again."

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.counts = counts

    def describe(self) -> Iterator[CounterMetricFamily]:
        """The counter without samples."""
        yield CounterMetricFamily(self.NAME, self.HELP, labels=["kind", "reason"])

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One sample per (kind, reason) that ever happened."""
        family = CounterMetricFamily(self.NAME, self.HELP, labels=["kind", "reason"])
        for (kind, reason), count in sorted(dict(self.counts()).items()):
            family.add_metric([kind, reason], count)
        yield family


class DeviceHealth(Collector):
    """``device_healthy{device}``: 1 when the published device is healthy, else 0, from the last
    health round's verdicts (:meth:`Metrics.set_device_health`).

    A collector over one dict, not a labelled Gauge: a Gauge keeps a child object (with its own
    lock) per device, about 0.7 KiB each, dropped and rebuilt by every round.
    """

    NAME = f"{NAMESPACE}_{SUBSYSTEM}_device_healthy"
    HELP = "1 when the published device is healthy (link carrier, RDMA port ACTIVE, netdev present), else 0."

    def __init__(self) -> None:
        self.health: dict[str, bool] = {}  # replaced whole by each round: a scrape sees one round

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The gauge without samples."""
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=["device"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per device of the last round."""
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["device"])
        for device, healthy in self.health.items():
            family.add_metric([device], 1 if healthy else 0)
        yield family


ShareUsage = Callable[[], dict[str, tuple[int, dict[str, int]]]]
"""Reads, per shared NIC, its shares and the capacity they consumed (``checkpoint.state.share_usage``)."""


class SharedNics(Collector):
    """``nic_shares{device}`` and ``nic_capacity_consumed{device,capacity}`` of shared NICs, read at
    each scrape from the prepared claims (a NIC nobody shares has no sample)."""

    SHARES = f"{NAMESPACE}_{SUBSYSTEM}_nic_shares"
    CONSUMED = f"{NAMESPACE}_{SUBSYSTEM}_nic_capacity_consumed"

    def __init__(self, usage: ShareUsage) -> None:
        self.usage = usage

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(self.SHARES, "Prepared shares (sub-interfaces) of a shared NIC.", labels=["device"]),
            GaugeMetricFamily(
                self.CONSUMED,
                "Capacity of a shared NIC its shares consumed (dra.net/bandwidth in bits per second).",
                labels=["device", "capacity"],
            ),
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The gauges without samples."""
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per shared NIC (and per capacity consumed)."""
        shares, consumed = self._families()
        for device, (count, capacities) in sorted(self.usage().items()):
            shares.add_metric([device], count)
            for name, value in sorted(capacities.items()):
                consumed.add_metric([device, name], value)
        yield shares
        yield consumed


class Metrics:
    """All driver metrics; components get this object instead of module-level collectors."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        # RSS, CPU seconds, open fds (process_*), the interpreter (python_info) and its garbage
        # collector (python_gc_*): read at each scrape, like the default registry's collectors.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        # Every collector is named dranet_driver_... (the Go driver's) and lives in this registry.
        own: dict[str, Any] = {"namespace": NAMESPACE, "subsystem": SUBSYSTEM, "registry": self.registry}
        self.requests = Counter(
            "dra_plugin_requests", "Kubelet DRA requests by method and status.", ["method", "status"], **own
        )
        self.latency = Histogram(
            "dra_plugin_requests_latency_seconds",
            "Kubelet DRA request latency in seconds.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            **own,
        )
        self.claim_errors = Counter(
            "dra_plugin_claim_errors", "Claims answered with a per-claim error, by method.", ["method"], **own
        )
        self.nri_requests = Counter(
            "nri_plugin_requests", "NRI hook calls by method and status.", ["method", "status"], **own
        )
        self.nri_latency = Histogram(
            "nri_plugin_requests_latency_seconds",
            "NRI hook latency in seconds, by method and status.",
            ["method", "status"],
            buckets=LATENCY_BUCKETS,
            **own,
        )
        self.published_devices = Gauge(
            "published_devices_total",
            "Devices in this node's ResourceSlices (feature: total, rdma).",
            ["feature"],
            **own,
        )
        self.last_publish = Gauge(
            "last_published_time_seconds",
            "Unix time of the last successful publish round (slices written, or found current; at least every "
            "resync interval).",
            **own,
        )
        # Ours (the Go driver rescans on every link event and has no such counters).
        self.link_events = Counter(
            "link_events",
            "Host link events by outcome: own (caused by an NRI hook: no work), ignored (an excluded "
            "interface), update (the device it feeds was rebuilt).",
            ["outcome"],
            **own,
        )
        self.inventory_updates = Counter(
            "inventory_updates",
            "Inventory rebuilds by kind: full_scan (start, resync timer, lost link events; a rescan that "
            "found nothing changed counts too) or link (one link's device rebuilt from a link event).",
            ["kind"],
            **own,
        )
        self.pod_network_problems = Counter(
            "pod_network_problems",
            "Pods whose claims' status reports a problem found after RunPodSandbox, by reason: "
            "ipv6-address-in-use (an address found in use on the link: the pod's containers do not start), "
            "started-without-driver (the pod started while the driver was not connected to the runtime).",
            ["reason"],
            **own,
        )
        self.device_healthy = DeviceHealth()
        self.registry.register(self.device_healthy)
        self.state_damage = Gauge(
            "state_damage",
            "State files found damaged at start (1 each): moved aside, or the journal's last record unreadable; "
            "the prepared claims were rebuilt from the API server.",
            ["file", "what"],
            **own,
        )
        self.kernel_info = Gauge(
            "kernel_info",
            "The node's kernel (1): its release, the oldest release supported, and whether it is at least that.",
            ["release", "floor", "supported"],
            **own,
        )
        self.kernel_feature = Gauge(
            "kernel_feature",
            "Kernel features the driver uses (1: this kernel has it, 0: the driver falls back or refuses the "
            "config that needs it; docs/install.md#kernels).",
            ["feature"],
            **own,
        )

    def count_pod_network_problem(self, reason: str) -> None:
        """One more pod with the problem ``reason`` (see ``pod_network_problems``)."""
        self.pod_network_problems.labels(reason).inc()

    def set_state_damage(self, damage: list[tuple[str, str]]) -> None:
        """``state_damage{file, what}`` = 1 for each damaged state file found at start."""
        for file, what in damage:
            self.state_damage.labels(file, what[:200]).set(1)

    def set_kernel(self, release: str, floor: str, supported: bool, features: dict[str, bool]) -> None:
        """``kernel_info`` and one ``kernel_feature`` per feature, as found at start."""
        self.kernel_info.labels(release, floor, str(supported).lower()).set(1)
        for name, available in features.items():
            self.kernel_feature.labels(name).set(1 if available else 0)

    def set_device_health(self, health: dict[str, bool]) -> None:
        """``device_healthy{device}``: 1 healthy, 0 not, for exactly the devices in ``health`` (a
        device no longer published leaves no stale series)."""
        self.device_healthy.health = dict(health)

    def watch_claim_devices(self, counts: ClaimDeviceCounts) -> None:
        """Publish ``claim_devices_allocated``/``_ready`` from ``counts()``, called at each scrape."""
        self.registry.register(ClaimDevices(counts))

    def watch_shares(self, usage: ShareUsage) -> None:
        """Publish ``nic_shares`` and ``nic_capacity_consumed`` from ``usage()``, called at each scrape."""
        self.registry.register(SharedNics(usage))

    def watch_state_writes(self, counts: Callable[[], dict[str, int]]) -> None:
        """Publish ``state_write_failures_total{file}`` from ``counts()`` (file name -> failures)."""
        self.registry.register(StateWriteFailures(counts))

    def watch_state_files_mended(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        """Publish ``state_files_mended_total{kind,reason}`` from ``counts()`` ((kind, reason) -> files)."""
        self.registry.register(StateFilesMended(counts))

    def count_inventory_update(self, kind: str, n: int = 1) -> None:
        """Count ``n`` inventory rebuilds of ``kind`` (``full_scan`` or ``link``)."""
        self.inventory_updates.labels(kind).inc(n)

    def inventory_update_count(self, kind: str) -> float:
        """How many rebuilds of ``kind`` so far (tests read it)."""
        return self.inventory_updates.labels(kind)._value.get()

    def observe_request(self, method: str, ok: bool, seconds: float, claim_errors: int = 0) -> None:
        """Count one kubelet request (``method``: the Go driver's label values, ``PrepareResourceClaims``
        and ``UnprepareResourceClaims``), its claims answered with an error, and its latency."""
        if claim_errors:
            self.claim_errors.labels(method).inc(claim_errors)
        self.requests.labels(method, SUCCESS if ok else FAILED).inc()
        self.latency.labels(method).observe(seconds)

    def observe_hook(self, method: str, status: str, seconds: float) -> None:
        """Count one NRI hook call (``RunPodSandbox``, ...) and record its latency."""
        self.nri_requests.labels(method, status).inc()
        self.nri_latency.labels(method, status).observe(seconds)

    def set_devices(self, total: int, rdma: int) -> None:
        """Record the size of the published inventory."""
        self.published_devices.labels("total").set(total)
        self.published_devices.labels("rdma").set(rdma)

    def mark_published(self, when: float | None = None) -> None:
        """Record a successful publish (the publisher calls this)."""
        self.last_publish.set(time.time() if when is None else when)

    def render(self) -> bytes:
        """The text exposition format of all metrics."""
        return generate_latest(self.registry)
