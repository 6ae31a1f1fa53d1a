"""The training example end to end on a real control plane, with `dranet run` as a separate process.

A simulated ND H100 v5 node (fixture sysfs), the GPU driver test double, the training example's DeviceClass and
ResourceClaimTemplates applied from examples/distributed_training/ (the files themselves), pods
scheduled by the real scheduler, then this test plays the kubelet over the driver's sockets.
Tests in this module run in file order and share one driver process.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import (
    ALIGNED,
    UNALIGNED,
    allocated_claim,
    build_fixture,
    delete_pod,
    pod_for_template,
    seed_docs,
    slice_devices,
)
from devcluster.doubles import gpu_double
from driver.kube.client import RESOURCE_API, KubeClient
from harness.driver_process import DriverProcess
from harness.kubelet_client import KubeletClient, devices_of
from tests.plugins.cluster import delete_if_present, delete_node_and_slices, list_slices

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SEED_GPUS = {"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0"}


@dataclass
class Seed:
    """Everything the tests in this module share."""

    kube: KubeClient
    node: str
    namespace: str
    driver: DriverProcess

    def claim_tuple(self, claim: dict[str, Any]) -> tuple[str, str, str]:
        m = claim["metadata"]
        return (m["namespace"], m["name"], m["uid"])

    def kubelet(self) -> KubeletClient:
        return KubeletClient(self.driver.registration_socket, self.driver.dra_socket, timeout=15)


@pytest.fixture(scope="module")
def seed(control_plane: ControlPlane) -> Iterator[Seed]:
    kube = control_plane.kube()
    node = f"nd-h100-{secrets.token_hex(3)}"
    ns = f"seed-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix="dn-e2e-"))  # short: unix socket paths <= 108 bytes
    driver = DriverProcess(control_plane.kubeconfig, node, work / "sysfs", work / "drv")
    classes, templates = seed_docs()
    try:
        control_plane.create_node(node)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        build_fixture("nd-h100-v5", work / "sysfs")
        driver.start()
        gpu_double.install(kube, node)
        create_objects(kube, classes)
        create_objects(kube, templates, ns)
        yield Seed(kube, node, ns, driver)
    finally:
        driver.stop()
        delete_if_present(kube, f"/api/v1/namespaces/{ns}")
        for c in classes + [gpu_double.device_class()]:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{c['metadata']['name']}")
        delete_node_and_slices(kube, node)
        shutil.rmtree(work, ignore_errors=True)


def nic_slices(seed: Seed) -> list[dict]:
    return list_slices(seed.kube, seed.node, "dra.net")


def test_driver_publishes_the_nd_h100_v5_nics(seed: Seed):
    slices = wait_for(lambda: nic_slices(seed), 30, what="dra.net slices")
    devs = {d["name"]: d["attributes"] for s in slices for d in s["spec"]["devices"]}
    rdma = {n: a for n, a in devs.items() if a.get("dra.net/rdma") == {"bool": True}}
    assert len(rdma) == 8, sorted(devs)
    assert sorted(a["dra.net/numaNode"]["int"] for a in rdma.values()) == [0] * 4 + [1] * 4
    # eth0 (the uplink, excluded) and its enslaved accelerated-networking VF are not published.
    assert not any(a.get("dra.net/ifName", {}).get("string") == "eth0" for a in devs.values())


def _gpu_bus_ids(seed: Seed, claim: dict) -> set[str]:
    attrs = slice_devices(seed.kube, seed.node)
    return {
        attrs[(r["driver"], r["pool"], r["device"])]["resource.kubernetes.io/pciBusID"]
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == gpu_double.GPU_DRIVER
    }


def _nic_numas(seed: Seed, claim: dict) -> list[int]:
    attrs = slice_devices(seed.kube, seed.node)
    return [
        attrs[(r["driver"], r["pool"], r["device"])]["dra.net/numaNode"]
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == "dra.net"
    ]


def _schedule(seed: Seed, pod: str, template: str) -> dict:
    create_objects(seed.kube, [pod_for_template(pod, template, seed.node)], seed.namespace)
    return wait_for(lambda: allocated_claim(seed.kube, seed.namespace, pod), 60, what=f"{pod} allocated")


def _release(seed: Seed, pod: str) -> None:
    delete_pod(seed.kube, seed.namespace, pod)
    # The resourceclaim controller deletes the generated claim once the pod is gone, freeing the GPUs.
    wait_for(
        lambda: not seed.kube.request("GET", f"{RESOURCE_API}/namespaces/{seed.namespace}/resourceclaims")["items"],
        60,
        what="generated claim deleted",
    )


async def test_aligned_template_gets_numa0_nics_and_seed_gpus_then_prepare(seed: Seed):
    wait_for(lambda: nic_slices(seed), 30, what="dra.net slices")
    claim = _schedule(seed, "aligned", ALIGNED)
    pod = seed.kube.request("GET", f"/api/v1/namespaces/{seed.namespace}/pods/aligned")
    assert pod["spec"]["nodeName"] == seed.node  # bound by the real scheduler
    assert _nic_numas(seed, claim) == [0, 0, 0, 0]
    assert _gpu_bus_ids(seed, claim) == SEED_GPUS
    ours = sorted(
        (r["request"], r["pool"], r["device"])
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == "dra.net"
    )
    uid = claim["metadata"]["uid"]
    async with seed.kubelet() as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([seed.claim_tuple(claim)])
        assert resp.claims[uid].error == ""
        got = sorted((req[0], pool, dev) for req, pool, dev in devices_of(resp, uid))
        assert got == ours
        again = await kubelet.prepare([seed.claim_tuple(claim)])  # the kubelet retries: same answer
        assert sorted((r[0], p, d) for r, p, d in devices_of(again, uid)) == ours
        _release(seed, "aligned")
        un = await kubelet.unprepare([seed.claim_tuple(claim)])
        assert un.claims[uid].error == ""


async def test_unaligned_template_gets_numa1_nics(seed: Seed):
    claim = _schedule(seed, "unaligned", UNALIGNED)
    assert _nic_numas(seed, claim) == [1, 1, 1, 1]
    assert _gpu_bus_ids(seed, claim) == SEED_GPUS
    async with seed.kubelet() as kubelet:
        resp = await kubelet.prepare([seed.claim_tuple(claim)])
        uid = claim["metadata"]["uid"]
        assert resp.claims[uid].error == ""
        assert len(devices_of(resp, uid)) == 4
        _release(seed, "unaligned")
        assert (await kubelet.unprepare([seed.claim_tuple(claim)])).claims[uid].error == ""


def test_five_rdma_nics_on_one_numa_node_stay_pending(seed: Seed):
    _, templates = seed_docs()
    greedy = {**templates[0], "metadata": {"name": "five-nics-numa0"}}
    nic = next(r for r in greedy["spec"]["spec"]["devices"]["requests"] if r["name"] == "nic")
    nic["exactly"]["count"] = 5
    greedy["spec"]["spec"]["devices"]["requests"] = [nic]
    create_objects(seed.kube, [greedy], seed.namespace)
    create_objects(seed.kube, [pod_for_template("greedy", "five-nics-numa0", seed.node)], seed.namespace)

    def unschedulable() -> dict | None:
        p = seed.kube.request("GET", f"/api/v1/namespaces/{seed.namespace}/pods/greedy")
        cond = [c for c in p.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"]
        return cond[0] if cond and cond[0]["status"] == "False" and cond[0].get("message") else None

    cond = wait_for(unschedulable, 60, what="PodScheduled=False")
    assert cond["reason"] == "Unschedulable"
    # The DynamicResources plugin's reason for our node (other tests' nodes fail the nodeSelector).
    assert "cannot allocate all claims" in cond["message"], cond["message"]
    pod = seed.kube.request("GET", f"/api/v1/namespaces/{seed.namespace}/pods/greedy")
    assert not pod["spec"].get("nodeName")
    delete_pod(seed.kube, seed.namespace, "greedy")


async def test_unknown_claim_unprepares_cleanly_after_restart(seed: Seed):
    seed.driver.restart()
    uid = f"00000000-0000-0000-0000-{secrets.token_hex(6)}"
    async with seed.kubelet() as kubelet:
        await kubelet.register()
        resp = await kubelet.unprepare([(seed.namespace, "never-prepared", uid)])
    assert resp.claims[uid].error == ""


def test_slices_republished_after_restart_and_after_deletion(seed: Seed):
    before = wait_for(lambda: nic_slices(seed), 30, what="slices")
    names = sorted(d["name"] for s in before for d in s["spec"]["devices"])
    # Slices wiped while the driver is down (the kubelet does that 30 s after it disconnects).
    seed.driver.stop()
    seed.kube.request(
        "DELETE",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={seed.node}"},
    )
    assert nic_slices(seed) == []
    seed.driver.start()
    after = wait_for(lambda: nic_slices(seed), 30, what="slices after restart")
    assert sorted(d["name"] for s in after for d in s["spec"]["devices"]) == names
    # Wiped while it runs (the kubelet does that at its own start).
    seed.kube.request(
        "DELETE",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={seed.node}"},
    )
    again = wait_for(
        lambda: [s for s in nic_slices(seed) if s["metadata"]["uid"] not in {x["metadata"]["uid"] for x in after}],
        30,
        what="slices after deletion",
    )
    assert sorted(d["name"] for s in again for d in s["spec"]["devices"]) == names
