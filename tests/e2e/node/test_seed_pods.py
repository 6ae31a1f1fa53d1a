"""The training example's pods on the real node: kubelet, containerd (NRI, CDI), runc, the chart's driver.

The two ResourceClaimTemplates of the training example, applied unchanged; a pod per template,
started by the real kubelet. Inside the running container: the claim's 4 NICs configured in
the pod's network namespace, the RDMA device nodes with the sysfs fixture's major/minor, the
exact ``NCCL_IB_HCA``, and the GPU double's CDI environment. In the claim status: Ready and
NUMAAligned from the driver. After deletion: every NIC back on the host intact, the claim
unprepared, nothing left in the driver's state files.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster.cluster.pods import pod_view
from devcluster.demo.allocation import ALIGNED, UNALIGNED
from devcluster.doubles.sysfs_fixture import UVERBS_MAJOR
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    delete_pod,
    dra_conditions,
    nic_snapshot,
    pod_claim,
    seed_namespace,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS

# The fixture numbers uverbs/umad/issm in probe order: NIC i of ib0..ib7 is mlx5_i.
NUMA0, NUMA1 = range(0, 4), range(4, 8)


@pytest.fixture(scope="module")
def seed_ns(real_node: RealNode) -> Iterator[str]:
    """One namespace for the module's tests (they delete their pods)."""
    with seed_namespace(real_node) as ns:
        yield ns


def _expected_nodes(indices: range) -> dict[str, tuple[int, int]]:
    nodes = {"/dev/infiniband/rdma_cm": (10, 58)}
    for i in indices:
        nodes[f"/dev/infiniband/uverbs{i}"] = (UVERBS_MAJOR, 192 + i)
        nodes[f"/dev/infiniband/umad{i}"] = (UVERBS_MAJOR, i)
        nodes[f"/dev/infiniband/issm{i}"] = (UVERBS_MAJOR, 64 + i)
    return nodes


@pytest.mark.parametrize(
    "template,indices,aligned", [(ALIGNED, NUMA0, True), (UNALIGNED, NUMA1, False)], ids=["aligned", "unaligned"]
)
def test_seed_pod_runs_with_its_nics(
    real_node: RealNode, seed_ns: str, template: str, indices: range, aligned: bool
) -> None:
    nics = [real_node.layout.nics[i] for i in indices]
    before = nic_snapshot(real_node, nics)
    assert set(before) == set(nics), "the NICs must start on the host"
    pod = template.replace("h100-4gpu-4nic-", "trainer-")
    start_pod(real_node, seed_ns, pod, template)
    try:
        wait_running(real_node, seed_ns, pod)
        view = pod_view(real_node.kubectl, seed_ns, pod)
        # 4 NICs in the pod's namespace, named as on the host (no interface.name in the training example's
        # config), with the host's MTU and MAC, up; and gone from the host.
        for nic in nics:
            assert nic in view.interfaces, f"{nic} not in the pod: {sorted(view.interfaces)}"
            got = view.interfaces[nic]
            assert (got.mtu, got.mac, got.state) == (before[nic]["mtu"], before[nic]["mac"], "UP")
        assert not set(nics) & set(real_node.host_nics()), "moved NICs must leave the host namespace"
        other = set(real_node.layout.nics) - set(nics)
        assert not other & set(view.interfaces), "only the claim's NICs may enter the pod"
        # RDMA device nodes: exactly the claim's, with the sysfs fixture's numbers.
        assert view.rdma_nodes == _expected_nodes(indices)
        hcas = ",".join(f"mlx5_{i}" for i in indices)
        assert view.env["NCCL_IB_HCA"] == "=" + hcas
        assert view.env["DRANET_RDMA_DEVICES"] == hcas
        # The GPU double's CDI spec reached the container through the kubelet and containerd.
        gpus = view.env["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert len(gpus) == 4 and all(g.startswith("GPU-") for g in gpus)
        assert sorted(k for k in view.env if k.startswith("DRA_GPU_")) == [f"DRA_GPU_{i}" for i in range(4)]
        # Claim status, written by the driver.
        claim = pod_claim(real_node, seed_ns, pod)
        conds = dra_conditions(claim)
        assert len(conds) == 4
        for device, c in conds.items():
            assert c["Ready"]["status"] == "True", (device, c["Ready"])
            numa = c["NUMAAligned"]
            assert numa["status"] == ("True" if aligned else "False"), numa
            if not aligned:
                # The message names both sides' NUMA nodes.
                assert "node 0" in numa["message"] and "node 1" in numa["message"], numa["message"]
        names = {
            d["device"]: d.get("networkData", {}).get("interfaceName")
            for d in claim["status"]["devices"]
            if d["driver"] == "dra.net"
        }
        assert sorted(names.values()) == sorted(nics)
        uid = claim["metadata"]["uid"]
        assert uid in real_node.checkpoint().get("claims", {})
    finally:
        delete_pod(real_node, seed_ns, pod)
    # Back home intact (name, MTU, MAC, addresses, routes); the claim is gone (generated from
    # the template) and the driver holds no state for it.
    wait_nics_home(real_node, before)
    assert uid not in real_node.checkpoint().get("claims", {})
    assert not real_node.pod_states().get("pods")
