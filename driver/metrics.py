"""Prometheus metrics of the node driver, kept in one registry object that is passed around.

Names, labels and label values are the Go reference driver's (namespace ``dranet``, subsystem
``driver``), so its users' dashboards and alerts keep working: ``dra_plugin_requests_total`` and
``..._latency_seconds`` (kubelet calls), ``nri_plugin_requests_total`` and ``..._latency_seconds``
(runtime hooks), ``published_devices_total{feature="total|rdma"}``,
``last_published_time_seconds``; status ``success``, ``failed`` or ``noop`` (a hook with nothing
to do). Ours on top: ``dra_plugin_claim_errors_total``.

A private :class:`CollectorRegistry` (not the client's global default) lets tests and
several in-process drivers each have their own counters.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

NAMESPACE = "dranet"
SUBSYSTEM = "driver"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SUCCESS, FAILED, NOOP = "success", "failed", "noop"
PREPARE, UNPREPARE = "PrepareResourceClaims", "UnprepareResourceClaims"
"""The Go driver's ``method`` label values of the kubelet calls."""


class Metrics:
    """All driver metrics; components get this object instead of module-level collectors."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "dra_plugin_requests",
            "Kubelet DRA requests by method and status.",
            ["method", "status"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.latency = Histogram(
            "dra_plugin_requests_latency_seconds",
            "Kubelet DRA request latency in seconds.",
            ["method"],
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.claim_errors = Counter(
            "dra_plugin_claim_errors",
            "Claims answered with a per-claim error, by method.",
            ["method"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.nri_requests = Counter(
            "nri_plugin_requests",
            "NRI hook calls by method and status.",
            ["method", "status"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.nri_latency = Histogram(
            "nri_plugin_requests_latency_seconds",
            "NRI hook latency in seconds, by method and status.",
            ["method", "status"],
            buckets=LATENCY_BUCKETS,
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.published_devices = Gauge(
            "published_devices_total",
            "Devices in this node's ResourceSlices (feature: total, rdma).",
            ["feature"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.last_publish = Gauge(
            "last_published_time_seconds",
            "Unix time of the last successful ResourceSlice write.",
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        # Ours (the Go driver rescans on every link event and has no such counters).
        self.link_events = Counter(
            "link_events",
            "Host link events by outcome: own (caused by an NRI hook: no work), ignored (an excluded "
            "interface), update (the device it feeds was rebuilt).",
            ["outcome"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )
        self.inventory_updates = Counter(
            "inventory_updates",
            "Inventory rebuilds by kind: full_scan (start, resync timer, lost link events; a rescan that "
            "found nothing changed counts too) or link (one link's device rebuilt from a link event).",
            ["kind"],
            namespace=NAMESPACE,
            subsystem=SUBSYSTEM,
            registry=reg,
        )

    def count_inventory_update(self, kind: str, n: int = 1) -> None:
        """Count ``n`` inventory rebuilds of ``kind`` (``full_scan`` or ``link``)."""
        self.inventory_updates.labels(kind).inc(n)

    def inventory_update_count(self, kind: str) -> float:
        """How many rebuilds of ``kind`` so far (tests, benchmarks)."""
        return self.inventory_updates.labels(kind)._value.get()

    def observe_request(self, method: str, status: str, seconds: float) -> None:
        """Count one kubelet request and record its latency."""
        self.requests.labels(method, status).inc()
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
