"""The real nodes for end-to-end tests: ``devcluster.cluster.lifecycle.up`` (two nodes) once per package.

A cluster of its own (random name and address range), so it never collides with a person's
``python -m devcluster up`` or another run on the same machine; removed with ``cluster.down`` at
the end, after which nothing of it may be left on the host (`realnode.leftovers`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster import mpijobs
from devcluster.cluster.node_layout import NodeLayout
from devcluster.cluster.pods import Kubectl
from devcluster.demo.allocation import EXAMPLE_DIR
from driver.kube.client import KubeClient
from tests.e2e.node.realnode import RealNode, leftovers, random_layout
from tests.e2e.node.support import seed_namespace
from tests.plugins.least_privilege import forbidden_lines

# Package scope: the node goes away right after the last real-node test, not at the end of
# the whole run, so it does not load the 2 cores during the other suites.
REUSE_ENV = "DRANET_E2E_CLUSTER"  # the name of a running `devcluster up` cluster to test instead


@pytest.fixture(scope="package")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """Two real nodes for tests/e2e (``devcluster up``), removed and checked at the end; or, with
    ``DRANET_E2E_CLUSTER=<name>``, a running cluster of that name (left running: quick reruns)."""
    if os.geteuid() != 0:
        pytest.skip("the real node needs root")
    reuse = os.environ.get(REUSE_ENV)
    if reuse:
        found = cluster.running(NodeLayout(name=reuse))
        if found is None:
            pytest.fail(f"{REUSE_ENV}={reuse}: no running cluster of that name")
        layout = NodeLayout(name=reuse, nodes=found.nodes, cluster_cidr=found.cluster_cidr)
        st = found
    else:
        layout = random_layout()
        t0 = time.monotonic()
        capman = request.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            with capman.global_and_fixture_disabled():  # progress lines of a cold build stay visible
                st = cluster.up(layout)
        else:
            st = cluster.up(layout)
        print(f"\n[real nodes] {layout.name} ({layout.nodes} nodes) up in {time.monotonic() - t0:.1f}s ({st.timings})")
    kube = KubeClient.from_kubeconfig(st.kubeconfig)
    node = RealNode(layout, st, kube, Kubectl(Path(st.kubectl), Path(st.kubeconfig)))
    denials: list[str] = []
    try:
        yield node
        # A 403 anywhere in the session (the drivers' own logs, current and previous
        # container) fails the run.
        denials = [line for s in layout.all_nodes for line in forbidden_lines(node.driver_logs(s.index))]
    finally:
        if not reuse:
            report = cluster.down(layout, progress=lambda _m: None)
            left = leftovers(layout)
            assert not report.problems and not left, f"down left: {report.problems + left}"
    assert not denials, f"the driver was refused (403): {denials[:5]}"


@pytest.fixture
def seed_ns(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace with the training example's two ResourceClaimTemplates (per test)."""
    with seed_namespace(real_node) as name:
        yield name


@pytest.fixture(scope="module")
def seed_mpi_ns(real_node: RealNode) -> Iterator[str]:
    """A namespace with ``kubectl apply -k examples/distributed_training`` done (per module)."""
    name = real_node.namespace()
    try:
        real_node.kubectl.run("apply", "-n", name, "-k", str(EXAMPLE_DIR), timeout=60)
        yield name
    finally:
        mpijobs.delete_namespace(real_node.kube, name)
