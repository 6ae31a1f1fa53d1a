"""Prometheus metrics of the node driver, kept in one registry object that is passed around.

A private :class:`CollectorRegistry` (not the client's global default) lets tests and
several in-process drivers each have their own counters.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

NAMESPACE = "dranet"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """All driver metrics; components get this object instead of module-level collectors."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        reg = self.registry
        by_call = ["method", "status"]
        self.requests = Counter(
            "dra_plugin_requests",
            "Kubelet DRA gRPC requests by method and status (ok|error).",
            by_call,
            namespace=NAMESPACE,
            registry=reg,
        )
        self.latency = Histogram(
            "dra_plugin_latency_seconds",
            "Kubelet DRA gRPC request latency by method and status.",
            by_call,
            namespace=NAMESPACE,
            registry=reg,
            buckets=LATENCY_BUCKETS,
        )
        self.claim_errors = Counter(
            "dra_plugin_claim_errors",
            "Claims answered with a per-claim error, by method.",
            ["method"],
            namespace=NAMESPACE,
            registry=reg,
        )
        self.published_devices = Gauge(
            "published_devices", "Devices in this node's ResourceSlices.", namespace=NAMESPACE, registry=reg
        )
        self.published_rdma_devices = Gauge(
            "published_rdma_devices", "Published devices with dra.net/rdma=true.", namespace=NAMESPACE, registry=reg
        )
        self.last_publish = Gauge(
            "last_publish_timestamp_seconds",
            "Unix time of the last successful ResourceSlice write.",
            namespace=NAMESPACE,
            registry=reg,
        )

    def observe_request(self, method: str, status: str, seconds: float) -> None:
        """Count one gRPC request and record its latency."""
        self.requests.labels(method, status).inc()
        self.latency.labels(method, status).observe(seconds)

    def set_devices(self, total: int, rdma: int) -> None:
        """Record the size of the published inventory."""
        self.published_devices.set(total)
        self.published_rdma_devices.set(rdma)

    def mark_published(self, when: float | None = None) -> None:
        """Record a successful publish (the publisher calls this)."""
        self.last_publish.set(time.time() if when is None else when)

    def render(self) -> bytes:
        """The text exposition format of all metrics."""
        return generate_latest(self.registry)
