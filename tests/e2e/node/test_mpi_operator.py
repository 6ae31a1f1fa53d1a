"""The seed's two MPIJobs, unchanged, under the real MPI Operator (built from its Go module).

Per job: the operator makes its ConfigMap, ssh Secret, Service and two worker pods; the
scheduler allocates each worker's claim (the seed's template: GPUs 0-3 on NUMA 0, and 4 RDMA
NICs on NUMA 0 for the aligned job, NUMA 1 for the unaligned one) on a different node (required
anti-affinity); the worker on the real node runs the seed's worker.sh with its 4 NICs, their RDMA
device nodes and NCCL_IB_HCA inside; the worker bound to the Node without a kubelet never starts,
so (launcherCreationPolicy: WaitForWorkersReady) the launcher is never created. Deleting the
MPIJob releases every claim and returns every NIC intact. See devcluster/mpijobs.py for what is
real and what stands in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from devcluster import mpi_operator, mpijobs
from devcluster.components import ensure_node_binaries
from devcluster.controlplane import wait_for
from devcluster.images import image_present
from devcluster.pods import pod_view
from driver.kube.client import RESOURCE_API
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import nic_snapshot, wait_nics_home

pytestmark = E2E_MARKS
NAMESPACE = "mpi-seed"
EXPECTED_NIC_NUMA = {"aligned": 0, "unaligned": 1}  # the templates' NIC numaNode selectors
GPUS = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the templates' pciBusID list: the NUMA 0 GPUs


def api_env(node: RealNode) -> list[dict[str, str]]:
    host, port = node.state.server.removeprefix("https://").rsplit(":", 1)
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]


@pytest.fixture(scope="module")
def mpi(real_node: RealNode) -> Iterator[mpijobs.MPISetup]:
    t0 = time.monotonic()
    ctr = ensure_node_binaries().ctr
    with mpijobs.mpi_setup(real_node.kube, real_node.layout, ctr, api_env(real_node), NAMESPACE) as setup:
        print(f"\n[mpi] operator {mpi_operator.VERSION} running, second node ready in {time.monotonic() - t0:.1f}s")
        yield setup


@pytest.mark.parametrize("which", ["aligned", "unaligned"])
def test_seed_mpijob_under_the_operator(real_node: RealNode, mpi: mpijobs.MPISetup, which: str) -> None:
    kube, ns = real_node.kube, NAMESPACE
    before = nic_snapshot(real_node)
    job = mpijobs.load_mpijob(which, ns)
    name = job["metadata"]["name"]
    t0 = time.monotonic()
    mpijobs.apply(kube, job)
    mpijobs.wait_scheduled(kube, ns, name, workers=2)

    def real_worker_ready() -> bool:
        r = mpijobs.report(kube, ns, job)
        return any(p.node == real_node.node and p.ready for p in r.pods)

    wait_for(real_worker_ready, 180, 0.5, "the worker on the real node Ready")
    started = time.monotonic() - t0
    time.sleep(5)  # give the operator time to (wrongly) create a launcher
    r = mpijobs.report(kube, ns, job)

    # The operator's objects and pods.
    assert {f"ConfigMap {name}-config", f"Secret {name}-ssh", f"Service {name}"} <= set(r.objects), r.objects
    workers = [p for p in r.pods if p.role == "worker"]
    assert len(workers) == 2 and {p.name for p in workers} == {f"{name}-worker-0", f"{name}-worker-1"}
    assert not [p for p in r.pods if p.role == "launcher"] and r.launcher == "not created"
    on_real = [p for p in workers if p.node == real_node.node]
    on_other = [p for p in workers if p.node == mpi.second_node.name]
    assert len(on_real) == 1 and len(on_other) == 1, "required anti-affinity: one worker per node"
    real, other = on_real[0], on_other[0]
    assert real.ready and not other.ready and other.phase == "Pending"

    # Each worker's claim: the 4 NUMA-0 GPUs and 4 RDMA NICs on the template's NUMA node, on its node.
    nic_numa = EXPECTED_NIC_NUMA[which]
    for p in workers:
        assert p.claim is not None and p.claim.node == p.node, p
        assert [d for d, _ in p.claim.gpus] == GPUS and {n for _, n in p.claim.gpus} == {0}
        assert len(p.claim.nics) == 4 and {n for _, n, _ in p.claim.nics} == {nic_numa}, p.claim.nics
    expected_ifnames = real_node.layout.nics[4 * nic_numa : 4 * nic_numa + 4]
    assert real.claim is not None and sorted(i for _, _, i in real.claim.nics) == sorted(expected_ifnames)

    # Inside the real worker: its NICs (gone from the host), the RDMA nodes, NCCL_IB_HCA, sshd up.
    view = pod_view(real_node.kubectl, ns, real.name)
    assert set(expected_ifnames) <= set(view.interfaces), sorted(view.interfaces)
    assert not set(expected_ifnames) & set(real_node.host_nics())
    hcas = [f"mlx5_{4 * nic_numa + i}" for i in range(4)]
    assert view.env.get("NCCL_IB_HCA") == "=" + ",".join(hcas)
    assert len([n for n in view.rdma_nodes if "uverbs" in n]) == 4
    log = real_node.kubectl.run("logs", "-n", ns, real.name)
    assert f'NCCL_IB_HCA="={",".join(hcas)}"' in log and "Server listening" in log, log
    # The pod the scheduler bound to the Node without a kubelet: nothing ran it.
    pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{other.name}")
    assert not pod["status"].get("containerStatuses") and not pod["status"].get("startTime")
    other.why_not_running = (
        f"bound to {mpi.second_node.name}, a Node object without a kubelet: never started; so the "
        "launcher (WaitForWorkersReady) is never created"
    )
    print(f"\n[mpi] {which}: real worker Ready {started:.1f}s after the MPIJob was created")
    print("\n".join(mpijobs.format_report(r)))
    print(
        "  inside " + real.name + ": " + ", ".join(sorted(view.interfaces)) + f"; NCCL_IB_HCA={view.env['NCCL_IB_HCA']}"
    )

    # Delete: every claim released, every NIC home as it was, nothing prepared any more.
    seconds = mpijobs.delete_job(kube, ns, name, mpi.second_node)
    assert not kube.request("GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
    wait_nics_home(real_node, before)
    wait_for(lambda: not real_node.checkpoint().get("claims"), 30, 0.2, "every claim unprepared")
    assert not real_node.pod_states().get("pods")
    print(f"  MPIJob deleted: claims released and NICs home after {seconds:.1f}s")


def test_the_seed_image_is_mapped_not_edited(real_node: RealNode, mpi: mpijobs.MPISetup) -> None:
    """The manifests keep the seed's image; the node's containerd has the stand-in under that name."""
    assert mpi.seed_images == ["registry.example.com/dranet/pytorch-mpi:25.09"]
    ctr = ensure_node_binaries().ctr
    for image in mpi.seed_images:
        assert image_present(ctr, str(real_node.layout.containerd_socket), image)
    for path in mpijobs.MPIJOB_FILES.values():
        assert "image: registry.example.com/dranet/pytorch-mpi:25.09" in path.read_text()
