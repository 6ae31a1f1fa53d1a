"""The RDMA device count is computed in one place, from the attribute discovery really publishes,
whatever ``--driver-name`` is: a real `dranet run` on the ND H100 v5 fixture (8 IB NICs)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.metrics_driver import metrics_driver


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


@pytest.mark.parametrize("driver_name", ["dra.net", "rdma.example.com"])
def test_rdma_count_with_any_driver_name(nd_h100_sysfs: Path, driver_name: str) -> None:
    extra = ["--driver-name", driver_name, "--publish-interval", "0.1", "--filter", ""]
    with metrics_driver(nd_h100_sysfs, *extra) as driver:
        api = driver.api
        deadline = time.monotonic() + 30
        while True:  # until the first ResourceSlice write is done (the publisher updates the gauges)
            text = driver.scrape()
            if (_metric(text, "dranet_driver_last_published_time_seconds") or 0) > 0:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        published = [dev for s in api.slices.values() for dev in s["spec"]["devices"]]
        assert all(s["spec"]["driver"] == driver_name for s in api.slices.values())
        # The attribute vocabulary is dra.net's whatever the driver is called (see docs/reference.md).
        rdma = [dev for dev in published if dev["attributes"].get("dra.net/rdma") == {"bool": True}]
        assert len(rdma) >= 8  # the 8 IB NICs (and the uplink's RDMA-capable VF: no exclusion here)
        assert _metric(text, 'dranet_driver_published_devices_total{feature="rdma"}') == len(rdma)
        assert _metric(text, 'dranet_driver_published_devices_total{feature="total"}') == len(published)
        # Read from the daemon's state files at the scrape: no claim prepared here.
        assert _metric(text, "dranet_driver_claim_devices_allocated") == 0
        assert _metric(text, "dranet_driver_claim_devices_ready") == 0
