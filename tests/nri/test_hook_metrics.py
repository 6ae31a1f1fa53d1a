"""NRI hook counters and latency histograms, under the Go driver's metric names."""

from __future__ import annotations

import pytest

from driver.metrics import Metrics
from driver.nri.plugin import NRIPlugin


class Handler:
    def run_pod_sandbox(self, pod: object) -> None:
        raise RuntimeError("move failed")

    def stop_pod_sandbox(self, pod: object) -> None:
        return None


def test_each_hook_call_is_counted_with_its_outcome_and_latency() -> None:
    metrics = Metrics()
    plugin = NRIPlugin("/nonexistent.sock", handler=Handler(), metrics=metrics)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        plugin._hook("RunPodSandbox", plugin.handler.run_pod_sandbox, None)
    plugin._hook("StopPodSandbox", plugin.handler.stop_pod_sandbox, None)
    plugin._hook("StopPodSandbox", plugin.handler.stop_pod_sandbox, None)
    text = metrics.render().decode()
    assert 'dranet_driver_nri_plugin_requests_total{method="RunPodSandbox",status="failed"} 1.0' in text
    assert 'dranet_driver_nri_plugin_requests_total{method="StopPodSandbox",status="success"} 2.0' in text
    assert (
        'dranet_driver_nri_plugin_requests_latency_seconds_count{method="StopPodSandbox",status="success"} 2.0' in text
    )
