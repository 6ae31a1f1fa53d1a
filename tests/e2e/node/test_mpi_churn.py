"""Create/delete cycles of the training example's two-worker MPIJob across both nodes: nothing stranded, the
driver flat on both nodes.

Each cycle applies the training example's MPIJob (aligned and unaligned in turn), waits until both workers
are Ready on their two nodes (NICs moved, claims prepared), deletes it and waits until its pods
and claims are gone. Afterwards every NIC of both nodes is back exactly as before, the drivers'
records are empty, and each driver's RSS and open fds did not grow past the first cycle (printed).
``DRANET_MPI_CHURN_CYCLES`` sets the count: a few in ``make test``, 20 in ``make soak``.
"""

from __future__ import annotations

import os
import time

import pytest

from devcluster.cluster import mpi_run, mpijobs
from devcluster.cluster.controlplane import wait_for
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import nic_snapshot, wait_nics_home

pytestmark = E2E_MARKS

CYCLES = int(os.environ.get("DRANET_MPI_CHURN_CYCLES", "4"))
RSS_GROWTH_KIB = 8 * 1024  # allocator noise of a Python daemon over a few hundred claims


@pytest.mark.timeout(3600)
def test_mpijob_churn_strands_nothing_and_keeps_the_drivers_flat(real_node: RealNode, seed_mpi_ns: str) -> None:
    layout, kube, ns = real_node.layout, real_node.kube, seed_mpi_ns
    nodes = [s.index for s in layout.all_nodes]
    before = {i: nic_snapshot(real_node, index=i) for i in nodes}
    baseline: dict[int, tuple[int, int]] = {}
    times = []
    for cycle in range(CYCLES + 1):  # cycle 0 warms up (first pods of these images, first claims)
        which = ("aligned", "unaligned")[cycle % 2]
        t0 = time.monotonic()
        res = mpi_run.run(kube, real_node.kubectl, layout, ns, which, until="workers-ready")
        mpijobs.delete_job(kube, ns, res.job)
        times.append(time.monotonic() - t0)
        for i in nodes:
            wait_nics_home(real_node, before[i], timeout=60, index=i)
        if cycle == 0:
            baseline = {i: real_node.driver_usage(i) for i in nodes}
    usage = {i: real_node.driver_usage(i) for i in nodes}
    for i in nodes:
        wait_for(lambda i=i: not real_node.checkpoint(i).get("claims"), 30, 0.2, f"node {i}: claims unprepared")
        assert not real_node.pod_states(i).get("pods")
    print(
        f"\n[mpi churn] {CYCLES} cycles (+1 warm-up), median {sorted(times)[len(times) // 2]:.1f}s per cycle; "
        + "; ".join(
            f"{layout.node(i).name}: RSS {baseline[i][0]} -> {usage[i][0]} KiB, fds {baseline[i][1]} -> {usage[i][1]}"
            for i in nodes
        )
    )
    for i in nodes:
        assert usage[i][0] - baseline[i][0] < RSS_GROWTH_KIB, (layout.node(i).name, baseline[i], usage[i])
        assert usage[i][1] <= baseline[i][1] + 2, (layout.node(i).name, baseline[i], usage[i])
