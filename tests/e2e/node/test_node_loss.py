"""An MPIJob of the training example losing a node, and deleted mid-run: nothing stranded on either node.

Node loss is a power cut (`devcluster.cluster.node_daemons.power_off`): every process of the node
(kubelet, containerd, shims, the driver, the job's worker) killed at once, its namespaces gone
(the NICs in its pods with them) and its ``/run`` wiped; its disks (``/var/lib/kubelet``,
``/var/lib/dranet``, containerd's root) stay. mpirun loses the dead worker, the launcher fails
and, with the training example's ``backoffLimit: 0``, so does the MPIJob; the operator deletes the surviving
worker, whose NICs come home. When the node comes back (`power_on`, a reboot: its NICs are on
the node again), its kubelet and driver finish the lost pod: the claim is unprepared, the
driver's records are empty, every NIC is published and free.
"""

from __future__ import annotations

import time

import pytest

from devcluster.builders.binaries import K8S_RELEASE
from devcluster.builders.components import ensure_node_binaries
from devcluster.cluster import mpi_run, mpijobs, node_daemons
from devcluster.cluster.controlplane import wait_for
from driver.kube.client import RESOURCE_API
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import nic_snapshot, wait_nics_home

pytestmark = E2E_MARKS


def _node_ready(real_node: RealNode, name: str) -> bool:
    node = real_node.kube.read_node(name)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _published_nics(real_node: RealNode, name: str) -> list[str]:
    slices = real_node.kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={name}"}
    )["items"]
    return sorted(
        d["attributes"]["dra.net/ifName"]["string"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if "dra.net/ifName" in d.get("attributes", {})
    )


def _assert_nothing_stranded(real_node: RealNode, before: dict[int, dict[str, object]]) -> None:
    for s in real_node.layout.all_nodes:
        wait_nics_home(real_node, before[s.index], timeout=120, index=s.index)  # type: ignore[arg-type]
        wait_for(lambda i=s.index: not real_node.checkpoint(i).get("claims"), 60, 0.5, f"{s.name}: claims unprepared")
        wait_for(lambda i=s.index: not real_node.pod_states(i).get("pods"), 60, 0.5, f"{s.name}: no pod holds a NIC")
        assert _published_nics(real_node, s.name) == sorted(real_node.layout.nics), s.name


@pytest.mark.timeout(1200)
def test_losing_a_node_mid_run_fails_the_job_and_strands_nothing(real_node: RealNode, seed_mpi_ns: str) -> None:
    layout, kube, ns = real_node.layout, real_node.kube, seed_mpi_ns
    before = {s.index: nic_snapshot(real_node, index=s.index) for s in layout.all_nodes}
    res = mpi_run.run(kube, real_node.kubectl, layout, ns, "aligned", until="first-rank")
    pod = mpi_run.launcher_pod(kube, ns, res.job)
    launcher_node = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")["spec"]["nodeName"]
    assert res.report is not None
    workers = {p.node: p.name for p in res.report.pods if p.role == "worker"}
    # Lose the node without the launcher (on a lost launcher node nothing would report failure).
    victim = next(s for s in layout.all_nodes if s.name != launcher_node and s.name in workers)
    survivor = next(s for s in layout.all_nodes if s.name != victim.name and s.name in workers)
    t0 = time.monotonic()
    problems = node_daemons.power_off(layout, victim.index)
    try:
        assert not problems, problems

        def failed() -> bool:
            obj = kube.request("GET", f"{mpijobs.MPIJOBS_API}/namespaces/{ns}/mpijobs/{res.job}")
            conds = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}
            assert conds.get("Succeeded") != "True", "the job cannot succeed without a worker"
            return conds.get("Failed") == "True"

        wait_for(failed, 300, 1, f"MPIJob {res.job} Failed after losing {victim.name}")
        failed_after = time.monotonic() - t0
        # cleanPodPolicy Running: the surviving worker is deleted, and its NICs come home.
        wait_nics_home(real_node, before[survivor.index], timeout=120, index=survivor.index)
        wait_for(lambda: not real_node.checkpoint(survivor.index).get("claims"), 60, 0.5, "survivor's claim unprepared")
    finally:
        # The lost node returns (also when an assertion above failed: the next tests need it).
        t1 = time.monotonic()
        node_daemons.power_on(layout, victim.index, ensure_node_binaries(lambda _m: None), K8S_RELEASE)
    wait_for(lambda: _node_ready(real_node, victim.name), 120, 1, f"{victim.name} Ready again")
    real_node.wait_driver_ready(timeout=180, node=victim.index)
    mpijobs.delete_job(kube, ns, res.job, timeout=300)
    _assert_nothing_stranded(real_node, before)
    print(
        f"\n[node loss] {victim.name} lost mid-run: MPIJob Failed after {failed_after:.1f}s; "
        f"back and clean {time.monotonic() - t1:.1f}s after power-on"
    )


@pytest.mark.timeout(600)
def test_deleting_an_mpijob_mid_run_returns_all_eight_nics(real_node: RealNode, seed_mpi_ns: str) -> None:
    layout, kube, ns = real_node.layout, real_node.kube, seed_mpi_ns
    before = {s.index: nic_snapshot(real_node, index=s.index) for s in layout.all_nodes}
    res = mpi_run.run(kube, real_node.kubectl, layout, ns, "unaligned", until="first-rank")
    assert res.report is not None
    held = {p.node: sorted(i for _, _, i in p.claim.nics) for p in res.report.pods if p.claim}
    assert sum(len(v) for v in held.values()) == 8, held
    seconds = mpijobs.delete_job(kube, ns, res.job)
    _assert_nothing_stranded(real_node, before)
    print(f"\n[delete mid-run] {held}: MPIJob, pods and claims gone in {seconds:.1f}s; every NIC home")
