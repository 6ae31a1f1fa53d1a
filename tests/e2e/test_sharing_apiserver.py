"""Shared NICs through the real scheduler: `dranet run --sharing-filter` on a control plane with
consumable capacity (Kubernetes 1.36+), then one with its gate off.

A simulated ND H100 v5 node (fixture sysfs, 400 Gb/s NICs ib0..ib7, ib0..ib3 on NUMA node 0); its
NUMA-0 NICs are shared. Pods are scheduled by the real scheduler (no kubelet: this test plays it
over the driver's sockets). Tests in this module run in file order and share one driver process.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.controlplane import ControlPlane, ControlPlaneOptions, create_objects, wait_for
from devcluster.demo.allocation import allocated_claim, build_fixture, delete_pod, pod_for_template, seed_docs
from driver.checkpoint.state import share_usage
from driver.checkpoint.store import CheckpointStore
from driver.claims.status import ClaimStatusWriter
from driver.claims.status_entries import DeviceResult
from driver.dra.field_support import consumable_capacity_accepted
from driver.kube.client import RESOURCE_API, KubeClient
from driver.model.device import BANDWIDTH_CAPACITY, INTERFACES_CAPACITY
from harness.driver_process import DriverProcess
from harness.kubelet_client import KubeletClient
from tests.plugins.cluster import delete_if_present, delete_node_and_slices, list_slices

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SHARING = '--sharing-filter=device.attributes["dra.net"].numaNode == 0'
TENTH = "40G"  # 10% of a 400 Gb/s NIC

REQUEUE_WAIT = 90.0
"""Seconds a pod waiting for capacity may take to be scheduled once shares are freed. The
controller-manager clears a template claim's allocation when its pod is gone, and the scheduler
requeues pods waiting on DRA at that update (or at the deletion of a claim still allocated), so
this is event-driven: seconds here, the rest is slack for a loaded machine."""


def share_template(name: str, ifname: str, bandwidth: str | None) -> dict[str, Any]:
    """One NIC by interface name, asking for ``bandwidth`` of it (None: asks nothing, a whole-NIC claim)."""
    request: dict[str, Any] = {
        "deviceClassName": "dranet.net",
        "selectors": [{"cel": {"expression": f'device.attributes["dra.net"].ifName == "{ifname}"'}}],
    }
    if bandwidth is not None:
        request["capacity"] = {"requests": {BANDWIDTH_CAPACITY: bandwidth}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}}},
    }


def numa0_template(name: str, count: int) -> dict[str, Any]:
    """``count`` RDMA NICs on NUMA node 0, asking nothing of their capacity: the training example's aligned NICs."""
    selector = 'device.attributes["dra.net"].rdma == true && device.attributes["dra.net"].numaNode == 0'
    request = {"deviceClassName": "dranet.net", "count": count, "selectors": [{"cel": {"expression": selector}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}}},
    }


@dataclass
class Shared:
    kube: KubeClient
    node: str
    namespace: str
    driver: DriverProcess

    def kubelet(self) -> KubeletClient:
        return KubeletClient(self.driver.registration_socket, self.driver.dra_socket, timeout=15)

    def schedule(self, pod: str, template: str) -> dict[str, Any]:
        create_objects(self.kube, [pod_for_template(pod, template, self.node)], self.namespace)
        return wait_for(lambda: allocated_claim(self.kube, self.namespace, pod), 60, what=f"{pod} allocated")

    def unschedulable(self, pod: str) -> dict[str, Any]:
        def condition() -> dict[str, Any] | None:
            p = self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{pod}")
            cond = [c for c in p.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"]
            return cond[0] if cond and cond[0]["status"] == "False" and cond[0].get("message") else None

        return wait_for(condition, 60, what=f"{pod} PodScheduled=False")


def _environment(cp: ControlPlane, extra_args: list[str]) -> tuple[KubeClient, str, str, DriverProcess, Path]:
    kube = cp.kube()
    node, ns = f"nd-share-{secrets.token_hex(3)}", f"share-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix="dn-share-"))
    driver = DriverProcess(cp.kubeconfig, node, work / "sysfs", work / "drv", extra_args=extra_args)
    cp.create_node(node)
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    build_fixture("nd-h100-v5", work / "sysfs")
    driver.start()
    return kube, node, ns, driver, work


def _teardown(kube: KubeClient, node: str, ns: str, driver: DriverProcess, work: Path) -> None:
    driver.stop()
    delete_if_present(kube, f"/api/v1/namespaces/{ns}")
    delete_node_and_slices(kube, node)
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def own_control_plane(control_plane_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the scheduler's queue holds only these pods (on the
    session's, shared with the rest of the suite, a pod waiting for freed capacity was seen
    waiting past the test's budget)."""
    cp = ControlPlane(control_plane_binaries, base_dir=str(tmp_path_factory.mktemp("share-cp")))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="module")
def shared(own_control_plane: ControlPlane) -> Iterator[Shared]:
    control_plane = own_control_plane
    kube = control_plane.kube()
    accepted, why = consumable_capacity_accepted(kube, "dra.net", "probe-node")
    if not accepted:
        pytest.skip(f"the session's control plane has no consumable capacity: {why}")
    classes, _ = seed_docs()
    kube_, node, ns, driver, work = _environment(control_plane, [SHARING, "--sharing-max-interfaces=16"])
    try:
        create_objects(kube, classes)
        create_objects(
            kube,
            [
                share_template("tenth-ib0", "ib0", TENTH),
                share_template("whole-ib0", "ib0", None),
                numa0_template("numa0-4", 4),
            ],
            ns,
        )
        yield Shared(kube_, node, ns, driver)
    finally:
        _teardown(kube, node, ns, driver, work)
        for c in classes:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{c['metadata']['name']}")


def _devices(kube: KubeClient, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in list_slices(kube, node, "dra.net") for d in s["spec"]["devices"]}


def test_numa0_nics_are_published_shared_and_the_slice_is_stable(shared: Shared) -> None:
    devices = wait_for(lambda: _devices(shared.kube, shared.node), 30, what="dra.net slices")
    by_if = {d["attributes"]["dra.net/ifName"]["string"]: d for d in devices.values()}
    for ifname in ("ib0", "ib1", "ib2", "ib3"):
        d = by_if[ifname]
        assert d.get("allowMultipleAllocations") is True, d
        assert d["capacity"][BANDWIDTH_CAPACITY]["value"] == "400G"
        assert d["capacity"][BANDWIDTH_CAPACITY]["requestPolicy"]["validRange"]["step"] == "4G"
        assert d["capacity"][INTERFACES_CAPACITY]["value"] == "16"
    for ifname in ("ib4", "ib5", "ib6", "ib7"):
        assert "allowMultipleAllocations" not in by_if[ifname] and "capacity" not in by_if[ifname]
    # What the apiserver stored is what the driver wrote: no rewrite on the next rounds.
    generation = list_slices(shared.kube, shared.node, "dra.net")[0]["spec"]["pool"]["generation"]
    time.sleep(3)  # the publisher's interval is 2 s: a slice the apiserver altered would be written again
    assert list_slices(shared.kube, shared.node, "dra.net")[0]["spec"]["pool"]["generation"] == generation


async def test_eight_tenths_share_ib0_a_whole_claim_waits_and_prepare_returns_share_ids(shared: Shared) -> None:
    claims = [shared.schedule(f"tenth-{i}", "tenth-ib0") for i in range(8)]
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims]
    assert len({r["device"] for r in results}) == 1  # all on ib0
    assert len({r["shareID"] for r in results}) == 8
    assert all(r["consumedCapacity"][BANDWIDTH_CAPACITY] == TENTH for r in results)
    # ib0 is 80% used: a claim that asks nothing of its capacity (a whole NIC) does not fit there...
    create_objects(shared.kube, [pod_for_template("whole", "whole-ib0", shared.node)], shared.namespace)
    cond = shared.unschedulable("whole")
    assert cond["reason"] == "Unschedulable" and "cannot allocate all claims" in cond["message"], cond
    # ...and four whole NUMA-0 NICs cannot be found while one of the four is partly used.
    create_objects(shared.kube, [pod_for_template("numa0", "numa0-4", shared.node)], shared.namespace)
    shared.unschedulable("numa0")
    # It leaves the queue: once the shares go, it and "whole" both fit ib0, and whichever the
    # scheduler tries first holds it, so "whole" could wait for a pod this test never deletes.
    delete_pod(shared.kube, shared.namespace, "numa0")
    async with shared.kubelet() as kubelet:
        await kubelet.register()
        refs = [(c["metadata"]["namespace"], c["metadata"]["name"], c["metadata"]["uid"]) for c in claims]
        resp = await kubelet.prepare(refs)
        for claim, result in zip(claims, results, strict=True):
            got = resp.claims[claim["metadata"]["uid"]]
            assert got.error == "" and [d.share_id for d in got.devices] == [result["shareID"]]
        # The claim status of a share: its own entry (shareID), the sub-interface and its NIC named.
        stored = CheckpointStore(str(shared.driver.state_dir), str(shared.driver.state_dir / "run"))
        prepared = stored.read(lambda s: s.claims[claims[0]["metadata"]["uid"]])
        assert prepared.devices[0].share_id == results[0]["shareID"]
        assert prepared.devices[0].consumed == {BANDWIDTH_CAPACITY: TENTH, INTERFACES_CAPACITY: "1"}
        assert stored.read(share_usage)[results[0]["device"]] == (
            8,
            {BANDWIDTH_CAPACITY: 8 * 40 * 10**9, INTERFACES_CAPACITY: 8},
        )
        writer = ClaimStatusWriter(shared.kube, shared.node, sysfs_root=str(shared.driver.sysfs_root))
        pod_uid = shared.kube.request("GET", f"/api/v1/namespaces/{shared.namespace}/pods/tenth-0")["metadata"]["uid"]
        result = DeviceResult(
            prepared.devices[0].device, "net1", ["10.77.0.1/24"], "02:00:00:00:00:01", "ib0", "macvlan"
        )
        writer.pod_network_ready(pod_uid, prepared, [result])
        writer.start()
        writer.stop(timeout=30)
        assert writer.delivered == 1 and writer.dropped == 0
        status = shared.kube.read_namespaced_resource_claim(shared.namespace, claims[0]["metadata"]["name"])["status"]
        [entry] = [d for d in status.get("devices") or [] if d["driver"] == "dra.net"]
        assert entry["shareID"] == results[0]["shareID"]
        assert entry["networkData"] == {
            "interfaceName": "net1",
            "ips": ["10.77.0.1/24"],
            "hardwareAddress": "02:00:00:00:00:01",
        }
        [ready] = [c for c in entry["conditions"] if c["type"] == "Ready"]
        assert "sub-interface net1 (macvlan of ib0)" in ready["message"], ready
        # Every share gone: the NIC is whole again, and the whole-NIC claims get it.
        for i in range(8):
            delete_pod(shared.kube, shared.namespace, f"tenth-{i}")
        un = await kubelet.unprepare(refs)
        assert all(not un.claims[r[2]].error for r in refs)
    wait_for(lambda: allocated_claim(shared.kube, shared.namespace, "whole"), REQUEUE_WAIT, what="whole allocated")
    delete_pod(shared.kube, shared.namespace, "whole")
    # ib0 whole again: the four NUMA-0 NICs are found (once the whole claim's allocation is cleared).
    create_objects(shared.kube, [pod_for_template("numa0-after", "numa0-4", shared.node)], shared.namespace)
    numa0 = wait_for(
        lambda: allocated_claim(shared.kube, shared.namespace, "numa0-after"), REQUEUE_WAIT, what="numa0 allocated"
    )
    assert len(numa0["status"]["allocation"]["devices"]["results"]) == 4
    delete_pod(shared.kube, shared.namespace, "numa0-after")


def test_ninth_share_waits_until_one_is_deleted(shared: Shared) -> None:
    """Ten 10% shares fill ib0; the eleventh waits with the scheduler's reason until one goes."""
    for i in range(10):
        shared.schedule(f"fill-{i}", "tenth-ib0")
    create_objects(shared.kube, [pod_for_template("late", "tenth-ib0", shared.node)], shared.namespace)
    cond = shared.unschedulable("late")
    assert "cannot allocate all claims" in cond["message"], cond
    delete_pod(shared.kube, shared.namespace, "fill-0")
    late = wait_for(lambda: allocated_claim(shared.kube, shared.namespace, "late"), REQUEUE_WAIT, what="late allocated")
    assert late["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"][BANDWIDTH_CAPACITY] == TENTH
    for i in range(1, 10):
        delete_pod(shared.kube, shared.namespace, f"fill-{i}")
    delete_pod(shared.kube, shared.namespace, "late")


def test_without_the_feature_shared_nics_are_published_whole_and_the_log_says_why_once(
    control_plane_binaries: Any, tmp_path: Path
) -> None:
    cp = ControlPlane(
        control_plane_binaries,
        base_dir=str(tmp_path),
        options=ControlPlaneOptions(feature_gates={"DRAConsumableCapacity": False}),
    )
    cp.start()
    try:
        kube, node, ns, driver, work = _environment(cp, [SHARING])
        try:
            devices = wait_for(lambda: _devices(kube, node), 30, what="dra.net slices")
            assert devices and not any("allowMultipleAllocations" in d or "capacity" in d for d in devices.values())
            log = driver.log()
            assert log.count("apiserver cannot count consumable capacity") == 1, log
            assert "DRAConsumableCapacity gate is off" in log
        finally:
            _teardown(kube, node, ns, driver, work)
    finally:
        cp.stop()
