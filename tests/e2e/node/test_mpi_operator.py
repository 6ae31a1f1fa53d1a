"""The seed's two MPIJobs, unchanged, run to the end under the real MPI Operator on two real nodes.

Per job (``kubectl apply -f`` the seed's file): the operator makes its ConfigMap, ssh Secret,
headless Service and two worker pods; the scheduler puts them on two nodes (required
anti-affinity) and allocates each worker's claim there (the seed's template: GPUs 0-3 and 4 RDMA
NICs on NUMA 0 for the aligned job, NUMA 1 for the unaligned one); each worker runs the seed's
worker.sh with its 4 NICs, their RDMA device nodes, NCCL_IB_HCA and DRANET_INTERFACES inside;
the launcher's mpirun reaches both workers over ssh by the names in its hostfile (cluster DNS),
8 ranks train over gloo on the CPU across the claimed NICs, the launcher prints MFU_RESULT, the
MPIJob Succeeds. The rails' byte counters show the traffic on exactly the claimed NICs of both
nodes. Deleting the MPIJob returns every NIC intact. See devcluster/cluster/mpijobs.py for what stands in.
"""

from __future__ import annotations

import pytest

from devcluster.cluster import mpi_run, mpijobs, node_daemons
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import nic_snapshot, wait_nics_home

pytestmark = E2E_MARKS
EXPECTED_NIC_NUMA = {"aligned": 0, "unaligned": 1}  # the templates' NIC numaNode selectors
GPUS = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the templates' pciBusID list: the NUMA 0 GPUs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("which", ["aligned", "unaligned"])
def test_seed_mpijob_runs_to_the_end_over_its_claimed_nics(real_node: RealNode, seed_mpi_ns: str, which: str) -> None:
    layout, kube, ns = real_node.layout, real_node.kube, seed_mpi_ns
    before = {s.index: nic_snapshot(real_node, index=s.index) for s in layout.all_nodes}
    nic_numa = EXPECTED_NIC_NUMA[which]
    expected = list(layout.nics[4 * nic_numa : 4 * nic_numa + 4])
    hcas = [f"mlx5_{4 * nic_numa + i}" for i in range(4)]
    seen: dict[str, object] = {}

    def while_running(res: mpi_run.RunResult) -> None:
        r = res.report
        assert r is not None
        assert {f"ConfigMap {res.job}-config", f"Secret {res.job}-ssh", f"Service {res.job}"} <= set(r.objects)
        workers = [p for p in r.pods if p.role == "worker"]
        assert {p.name for p in workers} == {f"{res.job}-worker-0", f"{res.job}-worker-1"}
        assert len({p.node for p in workers}) == 2, "required anti-affinity: one worker per node"
        for p in workers:
            assert p.ready and p.claim is not None and p.claim.node == p.node, p
            assert [d for d, _ in p.claim.gpus] == GPUS and {n for _, n in p.claim.gpus} == {0}
            assert sorted(i for _, _, i in p.claim.nics) == expected, p.claim.nics
            assert {n for _, n, _ in p.claim.nics} == {nic_numa}
            index = next(s.index for s in layout.all_nodes if s.name == p.node)
            assert not set(expected) & set(real_node.host_nics(index)), "claimed NICs left their node"
            view = pod_view(real_node.kubectl, ns, p.name)
            assert set(expected) <= set(view.interfaces), sorted(view.interfaces)
            assert view.env.get("NCCL_IB_HCA") == "=" + ",".join(hcas)
            assert view.env.get("DRANET_INTERFACES") == ",".join(expected)
            assert len([n for n in view.rdma_nodes if "uverbs" in n]) == 4
        seen["nodes"] = sorted(p.node for p in workers)

    res = mpi_run.run(kube, real_node.kubectl, layout, ns, which, timeout=420, on_workers_ready=while_running)
    tail = "\n".join(res.launcher_log.splitlines()[-40:])
    assert res.outcome == "Succeeded", f"MPIJob {res.outcome or 'still running'}:\n{tail}"
    assert res.mfu_line, f"no MFU_RESULT:\n{tail}"
    mfu = mpi_run.parse_mfu(res.mfu_line)
    assert (mfu["world_size"], mfu["backend"], mfu["device"]) == (8, "gloo", "cpu"), res.mfu_line
    assert mfu["nccl_ib_hca"] == "=" + ",".join(hcas)
    assert any("no GPU visible" in n for n in res.notes), res.notes
    # The nodes' RDMA devices are the fixture sysfs's (this kernel has no RDMA core): the pods get
    # their char devices and NCCL_IB_HCA, but no verbs device to open, and the launcher says so.
    assert res.rdma_check.startswith("RDMA check: no usable RDMA device"), res.rdma_check
    assert res.gloo_interfaces == ",".join(expected), tail
    # The collectives crossed exactly the claimed NICs, on both nodes.
    busy = res.busy_nics()
    assert busy == {s.index: expected for s in layout.all_nodes}, (busy, res.rail_bytes)
    assert res.workers_ready_s is not None and res.first_rank_s is not None and res.mfu_s is not None
    assert res.workers_ready_s < res.first_rank_s < res.mfu_s
    print(
        f"\n[mpi] {which}: workers Ready {res.workers_ready_s:.1f}s, first rank {res.first_rank_s:.1f}s, "
        f"MFU_RESULT {res.mfu_s:.1f}s after kubectl apply (workers on {seen['nodes']})\n  {res.mfu_line}"
    )
    print("\n".join(mpi_run.format_rails(layout, res)))

    # Delete: every claim released, every NIC home as it was, nothing prepared any more.
    mpijobs.delete_job(kube, ns, res.job)
    for s in layout.all_nodes:
        wait_nics_home(real_node, before[s.index], index=s.index)
        wait_for(lambda i=s.index: not real_node.checkpoint(i).get("claims"), 30, 0.2, f"{s.name}: claims unprepared")
        assert not real_node.pod_states(s.index).get("pods")


def test_the_seed_image_is_mapped_not_edited(real_node: RealNode) -> None:
    """The manifests keep the example's image; every node's runtime has the Debian-built one under that name."""
    assert mpijobs.seed_images() == ["registry.example.com/dranet/pytorch-mpi:25.09"]
    for spec in real_node.layout.all_nodes:
        for image in mpijobs.seed_images():
            assert node_daemons.has_image(spec, image), spec.name
    for path in mpijobs.MPIJOB_FILES.values():
        assert "image: registry.example.com/dranet/pytorch-mpi:25.09" in path.read_text()
