"""Unit tests of ClaimStatusWriter against an in-process fake of the KubeClient surface it uses."""

from __future__ import annotations

import threading
import time
from copy import deepcopy
from typing import Any

from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.status import ClaimStatusWriter
from driver.claims.status_entries import DeviceResult, StatusUpdate, reason_for
from driver.kube.errors import NotFound, Unavailable
from driver.model.device import Device, HostFacts


class FakeKube:
    """Records applies and events; merges applies into the claim by (driver, pool, device)."""

    def __init__(self, claim: dict[str, Any], fail_applies: int = 0) -> None:
        self.claim = claim
        self.applies: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.fail_applies = fail_applies
        self.slices: list[dict[str, Any]] = []
        self.selectors: list[str] = []

    def read_namespaced_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if self.claim is None:
            raise NotFound(404, "NotFound", "gone")
        return deepcopy(self.claim)

    def patch_namespaced_resource_claim_status(self, namespace, name, body, field_manager):
        assert field_manager == "dra.net"
        if self.fail_applies:
            self.fail_applies -= 1
            raise Unavailable(500, "InternalError", "etcd hiccup")
        self.applies.append(deepcopy(body))
        ours = {(d["driver"], d["pool"], d["device"]) for d in body["status"]["devices"]}
        kept = [d for d in self.claim["status"].get("devices", []) if d["driver"] != "dra.net"]
        self.claim["status"]["devices"] = kept + body["status"]["devices"]
        assert all(k[0] == "dra.net" for k in ours)
        return self.claim

    def create_namespaced_event(self, namespace, body):
        self.events.append(body)
        return body

    def list_resource_slice(self, field_selector, limit=None):
        """The slices matching ``spec.driver`` and, when given, ``spec.nodeName`` (as the apiserver)."""
        self.selectors.append(field_selector)
        wanted = dict(term.split("=", 1) for term in field_selector.split(","))
        return {
            "items": [
                rs
                for rs in self.slices
                if rs["spec"]["driver"] == wanted["spec.driver"]
                and wanted.get("spec.nodeName", rs["spec"].get("nodeName")) == rs["spec"].get("nodeName")
            ]
        }


GPU_ENTRY = {
    "driver": "gpu.nvidia.com",
    "pool": "node-a",
    "device": "gpu-0",
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "GPUReady",
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
}


def api_claim() -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "default", "uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                        {"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "nic-0"},
                        {"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "nic-1"},
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "pod-1"}],
            "devices": [deepcopy(GPU_ENTRY)],
        },
    }


def prepared() -> PreparedClaim:
    devs = [
        PreparedDevice("nic", "node-a", f"nic-{i}", Device(f"nic-{i}", {"dra.net/numaNode": 0}, HostFacts()))
        for i in range(2)
    ]
    return PreparedClaim(uid="u1", namespace="default", name="c", pod_uids=["pod-1"], devices=devs)


def writer(kube: FakeKube, tmp_path) -> ClaimStatusWriter:
    kube.slices = [
        {
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a"},
                "devices": [{"name": "gpu-0", "attributes": {"resource.kubernetes.io/numaNode": {"int": 0}}}],
            }
        }
    ]
    return ClaimStatusWriter(kube, "node-a", sysfs_root=str(tmp_path), sleep=lambda s: None)


def by_device(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["device"]: d for d in claim["status"]["devices"]}


def test_ready_writes_network_data_and_conditions_without_touching_gpu(tmp_path):
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    w.pod_network_ready(
        "pod-1",
        prepared(),
        [
            DeviceResult("nic-0", "net1", ["192.0.2.5/24", "2001:db8::5"], "02:00:00:00:00:01"),
            DeviceResult("nic-1", "net2", [], None),
        ],
    )
    w.start()
    w.stop()
    devs = by_device(kube.claim)
    assert devs["gpu-0"] == GPU_ENTRY
    assert devs["nic-0"]["networkData"] == {
        "interfaceName": "net1",
        "ips": ["192.0.2.5/24", "2001:db8::5/128"],
        "hardwareAddress": "02:00:00:00:00:01",
    }
    conds = {c["type"]: c for c in devs["nic-0"]["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds["NUMAAligned"]["status"] == "True", conds["NUMAAligned"]
    assert kube.events == []


def test_failure_keeps_other_entries_and_posts_one_event_despite_retries(tmp_path):
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    w.pod_network_ready("pod-1", prepared(), [DeviceResult("nic-0", "net1", ["192.0.2.5/24"], None)])
    w.start()
    w.stop()
    kube.fail_applies = 2
    w.pod_network_failed("pod-1", prepared(), "nic-1", "set mtu", "Numerical result out of range")
    w.start()
    w.stop()
    devs = by_device(kube.claim)
    # nic-0's Ready=True and networkData survive an apply about nic-1 (all our entries are re-applied).
    assert {c["type"]: c["status"] for c in devs["nic-0"]["conditions"]}["Ready"] == "True"
    assert devs["nic-0"]["networkData"]["interfaceName"] == "net1"
    ready1 = {c["type"]: c for c in devs["nic-1"]["conditions"]}["Ready"]
    assert (ready1["status"], ready1["reason"]) == ("False", "SetMtuFailed")
    assert ready1["message"] == "set mtu: Numerical result out of range"
    assert len(kube.events) == 2  # once on the pod, once on the claim, despite the retries
    event, on_claim = kube.events
    assert on_claim["involvedObject"]["kind"] == "ResourceClaim" and on_claim["reason"] == event["reason"]
    assert on_claim["involvedObject"]["apiVersion"] == "resource.k8s.io/v1"
    assert "trainer-0" in on_claim["message"] and "set mtu" in on_claim["message"]
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "default",
        "name": "trainer-0",
        "uid": "pod-1",
    }
    assert devs["gpu-0"] == GPU_ENTRY
    assert "networkData" not in devs["nic-1"]


def test_unprepared_applies_an_empty_list(tmp_path):
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    w.pod_network_ready("pod-1", prepared(), [DeviceResult("nic-0", "net1", ["192.0.2.5/24"], None)])
    w.claim_unprepared(prepared())
    w.start()
    w.stop()
    assert kube.applies[-1]["status"] == {"devices": []}
    assert list(by_device(kube.claim)) == ["gpu-0"]


def test_unprepared_without_entries_of_ours_writes_nothing(tmp_path):
    """A claim no pod started with (no entry of ours in its status): its unprepare costs a read, no write."""
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    w.claim_unprepared(prepared())
    w.start()
    w.stop()
    assert kube.applies == []
    assert list(by_device(kube.claim)) == ["gpu-0"]


def test_transition_time_kept_when_status_unchanged(tmp_path):
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    w.process(StatusUpdate("pod-1", prepared(), ready={"nic-0": DeviceResult("nic-0", "a", [], None)}))
    first = by_device(kube.claim)["nic-0"]["conditions"][0]["lastTransitionTime"]
    time.sleep(1.1)
    w.process(StatusUpdate("pod-1", prepared(), ready={"nic-0": DeviceResult("nic-0", "b", [], None)}))
    assert by_device(kube.claim)["nic-0"]["conditions"][0]["lastTransitionTime"] == first


def test_retries_are_bounded_and_gone_claims_are_dropped(tmp_path):
    kube = FakeKube(api_claim(), fail_applies=100)
    sleeps: list[float] = []
    w = ClaimStatusWriter(
        kube, "node-a", sysfs_root=str(tmp_path), max_attempts=4, backoff=0.5, max_backoff=1.0, sleep=sleeps.append
    )
    assert w.process(StatusUpdate("pod-1", prepared(), ready={})) is False
    assert sleeps == [0.5, 1.0, 1.0]
    assert w.dropped == 1
    kube.claim = None
    assert w.process(StatusUpdate("pod-1", prepared(), ready={})) is False


def test_hooks_never_block(tmp_path):
    kube = FakeKube(api_claim())
    gate = threading.Event()
    kube.read_namespaced_resource_claim = lambda ns, n: (gate.wait(), api_claim())[1]  # a hung API server
    w = ClaimStatusWriter(kube, "node-a", sysfs_root=str(tmp_path), queue_size=2)
    w.start()
    start = time.monotonic()
    for _ in range(10):
        w.pod_network_failed("pod-1", prepared(), "nic-0", "move", "boom")
    assert time.monotonic() - start < 0.5
    assert w.dropped >= 7
    gate.set()
    w.stop()


def test_reason_is_a_valid_conditionreason_for():
    assert reason_for("move netdev") == "MoveNetdevFailed"
    assert reason_for("") == "NetworkSetupFailed"
    assert reason_for("9x") == "NetworkSetupFailed"


def test_prepare_failure_posts_a_claim_event(tmp_path):
    kube = FakeKube(api_claim())
    writer = ClaimStatusWriter(kube, "node-a", sysfs_root=str(tmp_path), sleep=lambda s: None)
    writer.prepare_failed("default", "c", "claim-uid", "config for request 'nic': interface.mtu: must be >= 68")
    writer.start()
    writer.stop(timeout=10)
    (event,) = kube.events
    assert event["reason"] == "ClaimPrepareFailed" and event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "namespace": "default",
        "name": "c",
        "uid": "claim-uid",
    }
    assert "interface.mtu" in event["message"]


def test_the_raw_parameters_refusal_is_recognized_in_every_supported_release():
    from driver.claims.status import _raw_parameters_refused
    from driver.kube.errors import KubeError

    old = 'ResourceClaim "c" is invalid: status.allocation: Invalid value: ...: field is immutable'
    new = (
        'ResourceClaim "c" is invalid: [status.allocation: Forbidden: changing status.allocation or '
        'status.reservedFor requires resource="resourceclaims/binding", verb="patch" permission, '
        "status.allocation: Invalid value: null: field cannot be modified once set]"
    )
    assert _raw_parameters_refused(KubeError(422, "Unprocessable Entity", old))  # 1.34, 1.35
    assert _raw_parameters_refused(KubeError(422, "Unprocessable Entity", new))  # 1.36, 1.37
    assert not _raw_parameters_refused(KubeError(422, "Unprocessable Entity", "status.devices[0]: Invalid value"))
    assert not _raw_parameters_refused(KubeError(403, "Forbidden", new))


class TwoClaimsKube(FakeKube):
    """Two claims of the same shape (names c and c2), each read and written by its name."""

    def __init__(self) -> None:
        super().__init__(api_claim())
        second = api_claim()
        second["metadata"].update(name="c2", uid="u2")
        self.by_name = {"c": self.claim, "c2": second}

    def read_namespaced_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return deepcopy(self.by_name[name])

    def patch_namespaced_resource_claim_status(self, namespace, name, body, field_manager):
        self.claim = self.by_name[name]
        return super().patch_namespaced_resource_claim_status(namespace, name, body, field_manager)


def test_numa_report_lists_this_nodes_slices_once_for_a_burst_of_claims(tmp_path):
    """Another node's GPU slice is never listed; two claims written together cost one LIST; a device
    in no slice of this node (a pool for several nodes) is looked up in the driver's other slices."""
    kube = TwoClaimsKube()
    w = writer(kube, tmp_path)
    elsewhere = deepcopy(kube.slices[0])
    elsewhere["spec"].update(nodeName="node-b", pool={"name": "node-b"})
    elsewhere["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/numaNode"] = {"int": 1}
    kube.slices.append(elsewhere)
    first = prepared()
    second = PreparedClaim(uid="u2", namespace="default", name="c2", pod_uids=["pod-1"], devices=first.devices)
    for claim in (first, second):
        w.pod_network_ready("pod-1", claim, [DeviceResult(d.device, "net0", [], "") for d in claim.devices])
    w.start()
    w.stop(timeout=10)
    assert (w.delivered, w.dropped) == (2, 0)
    assert kube.selectors == ["spec.driver=gpu.nvidia.com,spec.nodeName=node-a"]
    for claim in kube.by_name.values():
        numa = next(c for c in by_device(claim)["nic-0"]["conditions"] if c["type"] == "NUMAAligned")
        assert numa["status"] == "True", numa

    # A claim whose GPU is published in another node's pool: this node's slices do not name it.
    kube.by_name["c3"] = api_claim()
    kube.by_name["c3"]["metadata"].update(name="c3", uid="u3")
    kube.by_name["c3"]["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    third = PreparedClaim(uid="u3", namespace="default", name="c3", pod_uids=["pod-1"], devices=first.devices)
    w.pod_network_ready("pod-1", third, [DeviceResult(d.device, "net0", [], "") for d in third.devices])
    w.start()
    w.stop(timeout=10)
    assert kube.selectors[1:] == ["spec.driver=gpu.nvidia.com,spec.nodeName=node-a", "spec.driver=gpu.nvidia.com"]
    numa = next(c for c in by_device(kube.by_name["c3"])["nic-0"]["conditions"] if c["type"] == "NUMAAligned")
    assert numa["status"] == "False" and "node 1: gpu-0" in numa["message"], numa


def test_a_nic_without_its_rdma_device_in_the_pod_says_why_and_only_that_nic(tmp_path):
    """A soft RDMA device stays out of the pod: ``RDMA`` False with the reason on that NIC's entry,
    Ready still True; a NIC whose RDMA device went along (or that has none) carries no RDMA condition."""
    kube = FakeKube(api_claim())
    w = writer(kube, tmp_path)
    why = "rxe0 is a Soft-RoCE (rxe) device: the kernel destroys it when its netdev leaves the host's network namespace"
    w.pod_network_ready(
        "pod-1",
        prepared(),
        [DeviceResult("nic-0", "net1", [], None, no_rdma=why), DeviceResult("nic-1", "net2", [], None)],
    )
    w.start()
    w.stop()
    devs = by_device(kube.claim)
    soft = {c["type"]: c for c in devs["nic-0"]["conditions"]}
    assert soft["Ready"]["status"] == "True"
    assert (soft["RDMA"]["status"], soft["RDMA"]["reason"]) == ("False", "RDMADeviceStaysOnHost")
    assert soft["RDMA"]["message"] == f"the pod has no RDMA device for this NIC: {why}"
    assert "RDMA" not in {c["type"] for c in devs["nic-1"]["conditions"]}
