"""The real nodes for end-to-end tests: ``devcluster.cluster.up`` (two nodes) once per package.

A cluster of its own (random name and address range), so it never collides with a person's
``python -m devcluster up`` or another run on the same machine; removed with ``cluster.down`` at
the end, after which nothing of it may be left on the host (`realnode.leftovers`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devcluster.cluster import mpijobs
from devcluster.cluster.node_layout import DEFAULT_RUNTIME
from devcluster.demo.allocation import EXAMPLE_DIR
from tests.e2e.node.realnode import REUSE_ENV, RealNode, cluster_for_tests, random_layout
from tests.e2e.node.support import seed_namespace

RUNTIME_ENV = "DRANET_E2E_RUNTIME"


# Package scope: the node goes away right after the last real-node test, not at the end of
# the whole run, so it does not load the 2 cores during the other suites.
@pytest.fixture(scope="package")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """Two real nodes for tests/e2e (``devcluster up``), removed and checked at the end; or, with
    ``DRANET_E2E_CLUSTER=<name>``, a running cluster of that name (left running: quick reruns).
    ``DRANET_E2E_RUNTIME=crio`` gives the nodes CRI-O instead of containerd."""
    runtime = os.environ.get(RUNTIME_ENV, DEFAULT_RUNTIME)
    with cluster_for_tests(request, lambda: random_layout(runtime=runtime), os.environ.get(REUSE_ENV)) as node:
        yield node


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    """A fresh, empty namespace (per test); modules that need more in it define their own."""
    name = real_node.namespace()
    try:
        yield name
    finally:
        real_node.delete_namespace(name)


@pytest.fixture
def seed_ns(real_node: RealNode) -> Iterator[str]:
    """A fresh namespace with the seed's two ResourceClaimTemplates (per test)."""
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
