"""An SR-IOV PF and its VFs through the real scheduler: published as partitions of one device
(shared counters, KEP-4815), so a PF handed out whole and any of its VFs never go to claims at the
same time, in either order or in one claim, while its VFs go to as many claims as it has. Then the
way off the SR-IOV device plugin (docs/sriov.md): the DeviceClasses the chart makes from
``examples/sriov/values.yaml``, and a pod written for the device plugin (``resources.limits`` of
the pools' names, no claim) getting VFs of the right PFs from the scheduler.

The node is the driver as a process on the fixture SR-IOV host (2 PFs of 64 VFs, 60 of each
published); the real apiserver, scheduler and controller-manager allocate; no kubelet (pods stay
bound and pending). Tests in this module run in file order and share one driver process.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.builders import helm
from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import allocated_claim, build_fixture, delete_pod, pod_for_template, seed_docs
from driver.dra.field_support import counter_sets_accepted
from driver.kube.client import RESOURCE_API
from harness.driver_process import DriverProcess
from tests.plugins.cluster import delete_if_present, delete_node_and_slices, list_slices
from tests.plugins.sriov_scheduling import SchedulingNode as Node
from tests.plugins.sriov_scheduling import allocated_devices as _devices
from tests.plugins.sriov_scheduling import pf_templates, request, template

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
PF0, PF1 = "0000:3b:00.0", "0000:86:00.0"
REPO = Path(__file__).resolve().parents[2]
VFIO_VFS = [f"pci-0000-{bus}-07-{f}" for bus in ("3b", "86") for f in (6, 7)] + [
    f"pci-0000-{bus}-08-{f}" for bus in ("3b", "86") for f in (0, 1)
]
"""VFs 60-63 of each PF, on vfio-pci in the fixture."""
REQUEUE_WAIT = 90.0  # a pod waiting on a freed VF: the scheduler requeues it when the claim is deallocated


@pytest.fixture(scope="module")
def node(control_plane: ControlPlane) -> Iterator[Node]:
    kube = control_plane.kube()
    accepted, why = counter_sets_accepted(kube, "dra.net", "probe-node")
    if not accepted:
        pytest.fail(f"the control plane (Kubernetes 1.36+) keeps no shared counters: {why}")
    name, ns = f"sriov-{secrets.token_hex(3)}", f"sriov-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix="dn-sriov-"))
    driver = DriverProcess(control_plane.kubeconfig, name, work / "sysfs", work / "drv")
    classes, _ = seed_docs()
    try:
        control_plane.create_node(name)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        build_fixture("sriov-roce", work / "sysfs")
        driver.start()
        create_objects(kube, classes)
        create_objects(kube, pf_templates(PF0, PF1), ns)
        yield Node(kube, name, ns)
    finally:
        driver.stop()
        delete_if_present(kube, f"/api/v1/namespaces/{ns}")
        delete_node_and_slices(kube, name)
        for c in classes:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{c['metadata']['name']}")
        shutil.rmtree(work, ignore_errors=True)


def test_each_pf_has_a_counter_set_its_vfs_and_it_draw_from(node: Node) -> None:
    def published() -> list[dict[str, Any]] | None:
        slices = list_slices(node.kube, node.node, "dra.net")
        counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
        whole = bool(slices) and counts == {len(slices)}
        return slices if whole and any("sharedCounters" in s["spec"] for s in slices) else None

    slices = wait_for(published, 30, what="the pool with its counter slice")
    sets = {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters") or []}
    assert sets == {
        "sriov-0000-3b-00-0": {"vfs": {"value": "64"}},
        "sriov-0000-86-00-0": {"vfs": {"value": "64"}},
    }
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    assert all(len(s["spec"].get("devices") or []) <= 64 for s in slices)
    draws = {d["name"]: d.get("consumesCounters") for d in devices}
    assert draws["pci-0000-3b-00-0"] == [{"counterSet": "sriov-0000-3b-00-0", "counters": {"vfs": {"value": "64"}}}]
    assert sum(1 for c in draws.values() if c and c[0]["counters"]["vfs"]["value"] == "1") == 128
    # The 4 VFs of each PF on vfio-pci: published, tainted for vfio claims only.
    tainted = {d["name"]: d["taints"] for d in devices if d.get("taints")}
    assert sorted(tainted) == sorted(VFIO_VFS), tainted
    assert all(t[0]["key"] == "dra.net/vfio-pci" and t[0]["effect"] == "NoSchedule" for t in tainted.values())
    generation = slices[0]["spec"]["pool"]["generation"]
    time.sleep(3)  # the publisher's interval is 2 s: a pool the apiserver altered would be written again
    assert {s["spec"]["pool"]["generation"] for s in list_slices(node.kube, node.node, "dra.net")} == {generation}


def test_a_pf_taken_whole_keeps_its_vfs_from_other_claims_until_it_is_freed(node: Node) -> None:
    whole = node.schedule("whole-0", "pf0-whole")
    assert _devices(whole) == ["pci-0000-3b-00-0"]
    node.unschedulable("vf-0", "pf0-vf")
    delete_pod(node.kube, node.namespace, "whole-0")
    vf = wait_for(lambda: allocated_claim(node.kube, node.namespace, "vf-0"), REQUEUE_WAIT, what="vf-0 allocated")
    assert _devices(vf)[0].startswith("pci-0000-3b-") and _devices(vf) != ["pci-0000-3b-00-0"]


def test_a_pf_with_a_vf_taken_cannot_be_taken_whole(node: Node) -> None:
    # vf-0 (the test above) holds a VF of PF0.
    node.unschedulable("whole-1", "pf0-whole")
    delete_pod(node.kube, node.namespace, "whole-1")


def test_one_claim_cannot_have_a_pf_and_one_of_its_vfs(node: Node) -> None:
    cond = node.unschedulable("both", "pf1-and-its-vf")
    assert "cannot allocate all claims" in cond["message"], cond
    delete_pod(node.kube, node.namespace, "both")


def test_the_vfs_of_one_pf_go_to_as_many_claims(node: Node) -> None:
    claims = [node.schedule(f"vf1-{i}", "pf1-vf") for i in range(3)]
    taken = [d for c in claims for d in _devices(c)]
    assert len(set(taken)) == 3 and all(d.startswith("pci-0000-86-") and d != "pci-0000-86-00-0" for d in taken)
    for i in range(3):
        delete_pod(node.kube, node.namespace, f"vf1-{i}")
    delete_pod(node.kube, node.namespace, "vf-0")


def test_a_vf_on_vfio_pci_goes_only_to_a_claim_that_tolerates_its_taint(node: Node) -> None:
    vf60 = 'device.attributes["dra.net"].pciAddress == "0000:3b:07.6"'
    plain = request("vf", vf60)
    tolerating = request("vf", vf60)
    tolerating["exactly"]["tolerations"] = [{"key": "dra.net/vfio-pci", "operator": "Exists", "effect": "NoSchedule"}]
    create_objects(node.kube, [template("vf60", plain), template("vf60-vfio", tolerating)], node.namespace)
    node.unschedulable("vf60-netdev", "vf60")
    delete_pod(node.kube, node.namespace, "vf60-netdev")
    claim = node.schedule("vf60-vfio", "vf60-vfio")
    assert _devices(claim) == ["pci-0000-3b-07-6"]
    delete_pod(node.kube, node.namespace, "vf60-vfio")


def _example_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the chart renders from examples/sriov/values.yaml."""
    rendered = subprocess.run(
        [
            helm.ensure(),
            "template",
            "dranet",
            str(REPO / "charts/dranet"),
            "-f",
            str(REPO / "examples/sriov/values.yaml"),
        ]
        + ["--show-only", "templates/deviceclass.yaml", "--set", "deviceClass.create=false"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def test_a_device_plugin_pod_gets_vfs_of_its_pools_pfs(node: Node) -> None:
    classes = _example_classes()
    names = {c["spec"]["extendedResourceName"]: c["metadata"]["name"] for c in classes}
    assert set(names) == {"intel.com/sriov_pool_a", "nvidia.com/sriov_rdma"}, names
    create_objects(node.kube, classes)
    try:
        pod = pod_for_template("plugin-pod", "unused", node.node)
        del pod["spec"]["resourceClaims"]
        limits = {"intel.com/sriov_pool_a": "2", "nvidia.com/sriov_rdma": "1"}
        pod["spec"]["containers"][0]["resources"] = {"limits": limits, "requests": limits}
        create_objects(node.kube, [pod], node.namespace)

        def allocated() -> dict[str, Any] | None:
            p = node.kube.request("GET", f"/api/v1/namespaces/{node.namespace}/pods/plugin-pod")
            status = p.get("status", {}).get("extendedResourceClaimStatus")
            if not p["spec"].get("nodeName") or not status:
                return None
            claim = node.kube.read_namespaced_resource_claim(node.namespace, status["resourceClaimName"])
            return claim if claim.get("status", {}).get("allocation") else None

        try:
            claim = wait_for(allocated, 60, what="the device plugin pod's claim allocated")
        except TimeoutError:
            status = node.kube.request("GET", f"/api/v1/namespaces/{node.namespace}/pods/plugin-pod")["status"]
            raise AssertionError(f"not allocated: {status}") from None
        results = claim["status"]["allocation"]["devices"]["results"]
        by_request = {r["request"]: [] for r in results}
        for r in results:
            by_request[r["request"]].append(r["device"])
        pools = sorted(by_request.values(), key=len)
        # One request per container and resource: PF0's pool (ens1f0np0) 2 VFs, PF1's RDMA pool 1.
        assert [len(p) for p in pools] == [1, 2], by_request
        assert all(d.startswith("pci-0000-86-") and d != "pci-0000-86-00-0" for d in pools[0]), by_request
        assert all(d.startswith("pci-0000-3b-") and d != "pci-0000-3b-00-0" for d in pools[1]), by_request
    finally:
        delete_pod(node.kube, node.namespace, "plugin-pod")
        for c in classes:
            delete_if_present(node.kube, f"{RESOURCE_API}/deviceclasses/{c['metadata']['name']}")
