"""The real-node tests on a node whose container runtime is CRI-O (OpenShift's) instead of containerd.

One node running CRI-O built from its Go module (`devcluster.builders.crio`, `devcluster.cluster.crio_node`), NRI
on at the chart's default socket, the driver installed with the same chart and values. The same
tests as on containerd, collected here a second time against that node: the seed's pods with
their NICs, RDMA devices and CDI GPUs, and the NICs back intact on delete; a claim's config
applied, and refused by the kernel; the kubelet, the runtime and the driver (kill -9) restarted
while a pod holds NICs; a pod started while the driver is away.

``DRANET_E2E_CRIO_CLUSTER=<name>`` tests a running CRI-O cluster of that name instead
(``python -m devcluster up --runtime crio --nodes 1 --name <name>``), left running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devcluster.builders import crio
from devcluster.cluster.node_layout import NodeLayout
from tests.e2e.node.realnode import E2E_MARKS, RealNode, cluster_for_tests, random_layout

# Collected here too, so they run against this module's CRI-O node (fixtures resolve per module).
from tests.e2e.node.test_claim_config import (  # noqa: F401
    host_nic,
    test_config_the_kernel_refuses_keeps_the_pod_from_starting,
    test_static_address_mtu_and_route_inside_the_pod,
)
from tests.e2e.node.test_faults import (  # noqa: F401
    test_fault_with_a_pod_holding_nics,
    test_pod_started_while_the_driver_is_down_waits_for_it,
)
from tests.e2e.node.test_seed_pods import test_seed_pod_runs_with_its_nics  # noqa: F401

pytestmark = E2E_MARKS
REUSE_ENV = "DRANET_E2E_CRIO_CLUSTER"


def _crio_layout() -> NodeLayout:
    return random_layout(nodes=1, runtime="crio")


@pytest.fixture(scope="module")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """One real node running CRI-O (CRI-O built first if it is not: ``make binaries`` does it)."""
    if os.geteuid() == 0:
        crio.build_crio()
    with cluster_for_tests(request, _crio_layout, os.environ.get(REUSE_ENV)) as node:
        assert node.layout.runtime == "crio", f"{REUSE_ENV}: cluster {node.layout.name!r} runs {node.layout.runtime}"
        yield node


@pytest.fixture
def ns(seed_ns: str) -> str:
    """The seed's templates (the fault tests use them; the config tests add their own)."""
    return seed_ns


def test_the_node_runs_crio_and_the_driver_talks_nri_to_it(real_node: RealNode) -> None:
    node = real_node.kube.read_node(real_node.node)
    runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert runtime == f"cri-o://{crio.CRIO_VERSION.removeprefix('v')}", runtime
    logs = real_node.driver_logs()
    assert '"runtime": "cri-o"' in logs or "runtime=cri-o" in logs, logs[-2000:]
    assert "NRI plugin registered" in logs
