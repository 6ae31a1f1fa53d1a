"""Claim status and NUMAAligned on a real control plane, with the scheduler doing the allocation.

A simulated ND H100 v5 node: our ResourceSlice comes from real discovery over the fixture sysfs,
the GPU slice from the GPU double (devcluster/doubles/gpu_double.py). A pod uses the training example's aligned or
unaligned ResourceClaimTemplate (examples/distributed_training); the scheduler allocates 4 GPUs
and 4 NICs. Then a "GPU driver" writes its own status entry with its own field manager and
ClaimStatusWriter applies ours: both must coexist, and NUMAAligned must be True for the aligned
template and False for the unaligned one. A failure writes Ready=False and a Warning event.
Skipped only when the control plane binaries are absent (tests/plugins/cluster.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.controlplane import (
    ControlPlane,
    create_objects,
    load_yaml_docs,
    wait_for,
)
from devcluster.demo.allocation import allocated_claim, delete_pod, pod_for_template
from devcluster.doubles import gpu_double
from devcluster.doubles.sysfs_fixture import build
from driver.api.v1alpha1.merge import configs_for_request
from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.status import FIELD_MANAGER, ClaimStatusWriter
from driver.claims.status_entries import DeviceResult
from driver.dra.slices import build_slices
from driver.inventory.discovery import Scanner
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError
from driver.model.device import Device
from tests.plugins.cluster import delete_if_present, delete_node_and_slices

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TEMPLATES = {
    t["metadata"]["name"]: t
    for t in load_yaml_docs(REPO / "examples/distributed_training/resource-claim-template.yaml")
}
DRANET_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "dranet.net"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "dra.net"'}}]},
}


class Node:
    """The simulated node: its name, namespace for test objects, sysfs and our devices by name."""

    def __init__(self, kube: KubeClient, name: str, namespace: str, sysfs: Path, devices: dict[str, Device]):
        self.kube, self.name, self.namespace, self.sysfs, self.devices = kube, name, namespace, sysfs, devices


@pytest.fixture(scope="module")
def nd_node(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    kube = control_plane.kube()
    name, ns = f"nd-status-{secrets.token_hex(3)}", f"status-{secrets.token_hex(3)}"
    sysfs = build("nd-h100-v5", tmp_path_factory.mktemp("sysfs"))
    # The 8 ConnectX-7 NICs (not the uplink's accelerated-networking VF).
    devices = {d.name: d for d in Scanner(str(sysfs), netlink=False).scan() if d.name.startswith("pci-01")}
    made_class = False
    try:
        control_plane.create_node(name)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        try:
            kube.request("POST", f"{RESOURCE_API}/deviceclasses", DRANET_CLASS)
            made_class = True
        except KubeError as exc:
            if exc.status != 409:  # left by another module of this session: same selector
                raise
        gpu_double.install(kube, name)
        uid = kube.read_node(name)["metadata"]["uid"]
        for body in build_slices(list(devices.values()), "dra.net", name, uid):
            kube.request("POST", f"{RESOURCE_API}/resourceslices", body)
        create_objects(kube, list(TEMPLATES.values()), ns)
        yield Node(kube, name, ns, sysfs, devices)
    finally:
        for tmpl in TEMPLATES:
            delete_if_present(kube, f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates/{tmpl}")
        delete_if_present(kube, f"/api/v1/namespaces/{ns}/events")
        if made_class:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/dranet.net")
        delete_node_and_slices(kube, name)
        delete_if_present(kube, f"/api/v1/namespaces/{ns}")


@pytest.fixture
def scheduled(nd_node: Node) -> Iterator[Any]:
    """Schedule a pod with a template; yields (pod, claim); deletes the pod and waits for its claim."""
    pods: list[str] = []

    def schedule(template: str) -> tuple[dict[str, Any], dict[str, Any]]:
        pod = f"trainer-{secrets.token_hex(3)}"
        pods.append(pod)
        (created,) = create_objects(nd_node.kube, [pod_for_template(pod, template, nd_node.name)], nd_node.namespace)
        claim = wait_for(lambda: allocated_claim(nd_node.kube, nd_node.namespace, pod), 60, what=f"{pod} allocated")
        return created, claim

    yield schedule
    for pod in pods:
        delete_pod(nd_node.kube, nd_node.namespace, pod)
    wait_for(
        lambda: (
            not nd_node.kube.request("GET", f"{RESOURCE_API}/namespaces/{nd_node.namespace}/resourceclaims")["items"]
        ),
        60,
        what="generated claims deleted",
    )


def prepared_claim(node: Node, claim: dict[str, Any]) -> PreparedClaim:
    """What NodePrepareResources would record for our devices of ``claim``."""
    alloc = claim["status"]["allocation"]["devices"]
    devices = [
        PreparedDevice(
            request=r["request"],
            pool=r["pool"],
            device=r["device"],
            snapshot=node.devices[r["device"]],
            config=configs_for_request(alloc.get("config") or [], r["request"], "dra.net"),
        )
        for r in alloc["results"]
        if r["driver"] == "dra.net"
    ]
    meta = claim["metadata"]
    return PreparedClaim(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        pod_uids=[r["uid"] for r in claim["status"].get("reservedFor") or []],
        devices=devices,
    )


def apply_gpu_entry(kube: KubeClient, claim: dict[str, Any]) -> dict[str, Any]:
    """The GPU driver's own status entry, applied with its own field manager."""
    gpu = next(r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == "gpu.nvidia.com")
    entry = {
        "driver": gpu["driver"],
        "pool": gpu["pool"],
        "device": gpu["device"],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "GPUReady",
                "message": "gpu ok",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "data": {"uuid": "GPU-0000"},
    }
    meta = claim["metadata"]
    kube.patch_namespaced_resource_claim_status(
        meta["namespace"],
        meta["name"],
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": {"devices": [entry]},
        },
        "gpu.nvidia.com",
    )
    return entry


def write(node: Node, fn: str, *args: Any) -> None:
    writer = ClaimStatusWriter(node.kube, node.name, sysfs_root=str(node.sysfs), sleep=lambda s: None)
    getattr(writer, fn)(*args)
    writer.start()
    writer.stop(timeout=30)
    assert writer.delivered == 1 and writer.dropped == 0


def entries(kube: KubeClient, claim: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    meta = claim["metadata"]
    fresh = kube.read_namespaced_resource_claim(meta["namespace"], meta["name"])
    return {(d["driver"], d["device"]): d for d in fresh["status"].get("devices") or []}


def conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in entry.get("conditions") or []}


@pytest.mark.parametrize(
    "template, aligned", [("h100-4gpu-4nic-numa-aligned", True), ("h100-4gpu-4nic-numa-unaligned", False)]
)
def test_status_coexists_with_gpu_entry_and_reports_numa(nd_node: Node, scheduled, template: str, aligned: bool):
    pod, claim = scheduled(template)
    gpu_entry = apply_gpu_entry(nd_node.kube, claim)
    prepared = prepared_claim(nd_node, claim)
    assert len(prepared.devices) == 4
    results = [
        DeviceResult(d.device, f"net{i}", [f"192.168.{i}.5/24"], f"02:00:00:00:00:0{i}")
        for i, d in enumerate(prepared.devices)
    ]
    write(nd_node, "pod_network_ready", pod["metadata"]["uid"], prepared, results)

    got = entries(nd_node.kube, claim)
    gpu = got[("gpu.nvidia.com", gpu_entry["device"])]
    assert gpu["conditions"] == gpu_entry["conditions"] and gpu["data"] == gpu_entry["data"]
    for i, dev in enumerate(prepared.devices):
        ours = got[("dra.net", dev.device)]
        assert ours["networkData"] == {
            "interfaceName": f"net{i}",
            "ips": [f"192.168.{i}.5/24"],
            "hardwareAddress": f"02:00:00:00:00:0{i}",
        }
        conds = conditions(ours)
        assert conds["Ready"]["status"] == "True"
        numa = conds["NUMAAligned"]
        assert numa["status"] == ("True" if aligned else "False"), numa
        assert "gpu.nvidia.com: node 0: gpu-0, gpu-1, gpu-2, gpu-3" in numa["message"]
        assert f"NICs: node {0 if aligned else 1}:" in numa["message"]
    # Field ownership: our manager owns only our entries; the GPU manager still owns its entry.
    meta = claim["metadata"]
    managed = nd_node.kube.read_namespaced_resource_claim(meta["namespace"], meta["name"])["metadata"]["managedFields"]
    managers = {m["manager"] for m in managed if m.get("subresource") == "status"}
    assert {FIELD_MANAGER, "gpu.nvidia.com"} <= managers


def test_failure_sets_ready_false_keeps_others_and_posts_event(nd_node: Node, scheduled):
    pod, claim = scheduled("h100-4gpu-4nic-numa-aligned")
    gpu_entry = apply_gpu_entry(nd_node.kube, claim)
    prepared = prepared_claim(nd_node, claim)
    first, failed = prepared.devices[0].device, prepared.devices[1].device
    pod_uid = pod["metadata"]["uid"]
    write(nd_node, "pod_network_ready", pod_uid, prepared, [DeviceResult(first, "net0", ["10.0.0.5/24"], "")])
    write(nd_node, "pod_network_failed", pod_uid, prepared, failed, "set mtu", "invalid argument (EINVAL)")

    got = entries(nd_node.kube, claim)
    assert conditions(got[("dra.net", first)])["Ready"]["status"] == "True"
    assert got[("dra.net", first)]["networkData"]["ips"] == ["10.0.0.5/24"]
    ready = conditions(got[("dra.net", failed)])["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "SetMtuFailed")
    assert ready["message"] == "set mtu: invalid argument (EINVAL)"
    assert got[("gpu.nvidia.com", gpu_entry["device"])]["conditions"] == gpu_entry["conditions"]

    events = nd_node.kube.request(
        "GET",
        f"/api/v1/namespaces/{nd_node.namespace}/events",
        query={"fieldSelector": f"involvedObject.uid={pod_uid}"},
    )["items"]
    ours = [e for e in events if e.get("source", {}).get("component") == "dra.net"]
    assert len(ours) == 1, events
    assert ours[0]["type"] == "Warning" and ours[0]["reason"] == "SetMtuFailed"
    assert failed in ours[0]["message"] and "invalid argument" in ours[0]["message"]
    on_claim = nd_node.kube.request(
        "GET",
        f"/api/v1/namespaces/{nd_node.namespace}/events",
        query={"fieldSelector": f"involvedObject.uid={claim['metadata']['uid']}"},
    )["items"]
    assert [(e["involvedObject"]["kind"], e["reason"]) for e in on_claim] == [("ResourceClaim", "SetMtuFailed")]

    # Unprepare: all our entries go (an empty apply drops what we own); the GPU's stays.
    writer = ClaimStatusWriter(nd_node.kube, nd_node.name, sysfs_root=str(nd_node.sysfs), sleep=lambda s: None)
    writer.claim_unprepared(prepared)
    writer.start()
    writer.stop(timeout=30)
    assert list(entries(nd_node.kube, claim)) == [("gpu.nvidia.com", gpu_entry["device"])]


@pytest.mark.parametrize("role, allowed", [("dranet-node", True), (None, False)])
def test_documented_rbac_is_enough_and_needed(
    control_plane: ControlPlane, nd_node: Node, scheduled, tmp_path: Path, role: str | None, allowed: bool
):
    """The status writer with a ServiceAccount bound to docs/rbac.md's role (or to nothing), its
    token bound to the node as a driver pod's is (1.36+ authorizes status.devices per node)."""
    from tests.e2e.test_webhook_apiserver import service_account_kubeconfig

    pod, claim = scheduled("h100-4gpu-4nic-numa-aligned")
    prepared = prepared_claim(nd_node, claim)
    pod_uid = pod["metadata"]["uid"]
    sa_kubeconfig = service_account_kubeconfig(
        control_plane, nd_node.kube, role, tmp_path / "sa.kubeconfig", node=nd_node.name
    )
    with sa_kubeconfig as kubeconfig:
        sa_kube = KubeClient.from_kubeconfig(str(kubeconfig))
        writer = ClaimStatusWriter(
            sa_kube, nd_node.name, sysfs_root=str(nd_node.sysfs), max_attempts=2, sleep=lambda s: None
        )
        writer.pod_network_ready(pod_uid, prepared, [DeviceResult(d.device, "net0", [], "") for d in prepared.devices])
        writer.pod_network_failed(pod_uid, prepared, prepared.devices[0].device, "move", "EBUSY")
        writer.start()
        writer.stop(timeout=30)
    if not allowed:
        assert (writer.delivered, writer.dropped) == (0, 2)
        assert not entries(nd_node.kube, claim)
        return
    assert (writer.delivered, writer.dropped) == (2, 0)
    got = entries(nd_node.kube, claim)
    for dev in prepared.devices:
        assert conditions(got[("dra.net", dev.device)])["NUMAAligned"]["status"] == "True"
    assert conditions(got[("dra.net", prepared.devices[0].device)])["Ready"]["status"] == "False"
    events = nd_node.kube.request(
        "GET",
        f"/api/v1/namespaces/{nd_node.namespace}/events",
        query={"fieldSelector": f"involvedObject.uid={pod_uid}"},
    )["items"]
    assert [e["reason"] for e in events if e.get("source", {}).get("component") == "dra.net"] == ["MoveFailed"]


class CountingKube(KubeClient):
    """The real client, recording each ResourceSlice LIST: its field selector and the nodes of what came back."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube.api)
        self.slice_lists: list[tuple[str, list[str]]] = []

    def list_resource_slice(self, field_selector: str, limit: int | None = None) -> dict[str, Any]:
        out = super().list_resource_slice(field_selector, limit)
        self.slice_lists.append((field_selector, sorted(s["spec"].get("nodeName", "") for s in out["items"])))
        return out


def test_numa_report_lists_only_this_nodes_gpu_slices(control_plane: ControlPlane, nd_node: Node, scheduled):
    """Another GPU node's slice is in the cluster: the NUMA report's one LIST selects this node's."""
    other = f"nd-other-{secrets.token_hex(3)}"
    control_plane.create_node(other)
    try:
        gpu_double.install(nd_node.kube, other)
        pod, claim = scheduled("h100-4gpu-4nic-numa-aligned")
        prepared = prepared_claim(nd_node, claim)
        kube = CountingKube(nd_node.kube)
        writer = ClaimStatusWriter(kube, nd_node.name, sysfs_root=str(nd_node.sysfs), sleep=lambda s: None)
        results = [DeviceResult(d.device, "net0", [], "") for d in prepared.devices]
        writer.pod_network_ready(pod["metadata"]["uid"], prepared, results)
        writer.start()
        writer.stop(timeout=30)
        assert (writer.delivered, writer.dropped) == (1, 0)
        assert kube.slice_lists == [(f"spec.driver=gpu.nvidia.com,spec.nodeName={nd_node.name}", [nd_node.name])]
        got = entries(nd_node.kube, claim)
        assert conditions(got[("dra.net", prepared.devices[0].device)])["NUMAAligned"]["status"] == "True"
    finally:
        delete_node_and_slices(nd_node.kube, other)
