"""200 create/delete cycles of a 4-NIC pod on the real node: nothing stranded, driver flat.

Two streams run side by side (4 NICs on NUMA 0, 4 on NUMA 1; 100 cycles each) so the 200
cycles take half the wall time. Each cycle: create the pod (its claim from a template), wait
until the kubelet reports it Ready (its NICs moved by then), delete it, wait until it is gone.
Afterwards every NIC is back on the host exactly as before, the driver's state files are
empty, and its RSS and open fds did not grow past the warm-up (they are printed).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.cluster.controlplane import create_objects, wait_for
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import delete_pod, nic_snapshot, start_pod, wait_nics_home, wait_running

pytestmark = E2E_MARKS

CYCLES = int(os.environ.get("DRANET_CHURN_CYCLES", "200"))
WARMUP = 10  # cycles per stream before the baseline RSS/fds are taken (at most a quarter)


def nic_template(ns: str, name: str, numa: int) -> dict[str, Any]:
    """4 RDMA NICs on one NUMA node, no GPUs (so two pods can run at once)."""
    expr = f'device.attributes["dra.net"]["rdma"] == true && device.attributes["dra.net"]["numaNode"] == {numa}'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "nic",
                            "exactly": {
                                "deviceClassName": "dranet.net",
                                "count": 4,
                                "selectors": [{"cel": {"expression": expr}}],
                            },
                        }
                    ]
                }
            }
        },
    }


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    name = real_node.namespace()
    create_objects(real_node.kube, [nic_template(name, "numa0", 0), nic_template(name, "numa1", 1)], name)
    try:
        yield name
    finally:
        real_node.delete_namespace(name)


@pytest.mark.timeout(3600)
def test_churn_200_cycles(real_node: RealNode, ns: str, request: pytest.FixtureRequest) -> None:
    before = nic_snapshot(real_node)
    assert len(before) == 8
    per_stream = CYCLES // 2
    baseline: dict[str, tuple[int, int]] = {}
    errors: list[str] = []
    durations: list[float] = []
    lock = threading.Lock()
    warm = threading.Barrier(2)

    def stream(template: str) -> None:
        try:
            for i in range(per_stream):
                if i == min(WARMUP, per_stream // 4):
                    if warm.wait() == 0:  # one thread takes the baseline once both are warm
                        baseline["warm"] = real_node.driver_usage()
                t0 = time.monotonic()
                pod = f"churn-{template}-{i}"
                start_pod(real_node, ns, pod, template)
                wait_running(real_node, ns, pod, timeout=120)
                delete_pod(real_node, ns, pod, timeout=120)
                with lock:
                    durations.append(time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{template}: {exc}")
            warm.abort()

    threads = [threading.Thread(target=stream, args=(t,)) for t in ("numa0", "numa1")]
    t_start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t_start
    assert not errors, errors
    # Zero stranded: all 8 NICs home, exactly as they were; no state left in the driver.
    wait_nics_home(real_node, before)
    wait_for(lambda: not real_node.checkpoint().get("claims"), 60, 0.5, "every claim unprepared")
    assert not real_node.pod_states().get("pods")
    end = real_node.driver_usage()
    rss0, fds0 = baseline["warm"]
    durations.sort()
    report = (
        f"churn: {len(durations)} cycles in {elapsed:.0f}s (2 streams; cycle median "
        f"{durations[len(durations) // 2]:.2f}s, max {durations[-1]:.2f}s); driver RSS "
        f"{rss0 / 1024:.1f} MiB after warm-up -> {end[0] / 1024:.1f} MiB, open fds {fds0} -> {end[1]}"
    )
    capman = request.config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():  # the numbers belong in the run's output
            print("\n" + report, flush=True)
    else:
        print(report)
    assert len(durations) == 2 * per_stream
    assert end[0] <= rss0 + 8 * 1024, report  # KiB: flat within 8 MiB
    assert end[1] <= fds0 + 4, report
