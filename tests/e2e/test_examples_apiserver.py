"""examples/distributed_training and ``dranet templates`` against the real test control plane.

- every example DeviceClass/template passes server validation (strict fields) and the templates
  are created for real; the MPIJob pod templates are valid Pods (server dry run);
- on a simulated ND H100 v5 node (fixture sysfs, ``dranet run`` as a process, a GPU double),
  the templates ``dranet templates --gpus 4`` prints for that node allocate GPUs and NICs of one
  NUMA node, and so does the ``matchAttribute: resource.kubernetes.io/numaNode`` template.

Skipped only when the control plane binaries are absent (tests/plugins/cluster.py).
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster.controlplane import (
    ControlPlane,
    create_objects,
    load_yaml_docs,
    object_path,
    wait_for,
)
from devcluster.demo.allocation import (
    allocated_claim,
    build_fixture,
    delete_pod,
    pod_for_template,
    slice_devices,
)
from devcluster.doubles import gpu_double
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound
from harness.driver_process import DriverProcess
from tests.plugins.cluster import delete_node_and_slices, list_slices

pytestmark = [pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "examples" / "distributed_training"
MPIJOBS = ["mpi-job-4gpu-4nic-numa-aligned.yaml", "mpi-job-4gpu-4nic-numa-unaligned.yaml"]
NUMA = "resource.kubernetes.io/numaNode"
BUS_ID = "resource.kubernetes.io/pciBusID"


def _delete(kube: KubeClient, path: str) -> None:
    try:
        kube.request("DELETE", path, query={"gracePeriodSeconds": "0"})
    except KubeError as exc:
        if not isinstance(exc, NotFound):
            raise


def _dry_run(kube: KubeClient, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return kube.request("POST", object_path(obj, namespace), obj, query={"dryRun": "All", "fieldValidation": "Strict"})


@pytest.fixture
def namespace(kube: KubeClient) -> Iterator[str]:
    """A fresh namespace, deleted (with everything in it) after the test."""
    name = f"dt-{secrets.token_hex(3)}"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        _delete(kube, f"/api/v1/namespaces/{name}")


# -- the manifests -----------------------------------------------------------------------------


def test_device_class_and_templates_pass_server_validation(kube: KubeClient, namespace: str) -> None:
    (device_class,) = load_yaml_docs(EXAMPLE_DIR / "device-class.yaml")
    out = _dry_run(kube, device_class, namespace)  # cluster-scoped and shared: never persisted here
    assert out["metadata"]["name"] == "dranet.net"
    templates = (
        load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml")
        + load_yaml_docs(EXAMPLE_DIR / "resource-claim-template-match-numa.yaml")
        + load_yaml_docs(EXAMPLE_DIR / "resource-claim-template-azure-placement.yaml")
    )
    for tmpl in templates:
        _dry_run(kube, tmpl, namespace)
    created = create_objects(kube, templates, namespace)
    for want, got in zip(templates, created, strict=True):
        stored = kube.request("GET", f"{object_path(want, namespace)}/{want['metadata']['name']}")
        assert stored["spec"] == got["spec"]
        # Stored as written, plus the server's defaults (allocationMode: ExactCount).
        for stored_req, want_req in zip(
            stored["spec"]["spec"]["devices"]["requests"], want["spec"]["spec"]["devices"]["requests"], strict=True
        ):
            assert stored_req["exactly"].pop("allocationMode") == "ExactCount"
            assert stored_req == want_req
    match = next(t for t in created if t["metadata"]["name"] == "4gpu-4nic-same-numa")
    assert match["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"] == NUMA


def test_server_validation_has_teeth(kube: KubeClient, namespace: str) -> None:
    (tmpl,) = load_yaml_docs(EXAMPLE_DIR / "resource-claim-template-match-numa.yaml")
    bad = copy.deepcopy(tmpl)
    bad["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"] = "numa node"  # not a qualified name
    with pytest.raises(KubeError) as err:
        _dry_run(kube, bad, namespace)
    assert err.value.status == 422


def _pod_from(job: dict[str, Any], role: str) -> dict[str, Any]:
    template = job["spec"]["mpiReplicaSpecs"][role]["template"]
    # The labels mpi-operator puts on its pods (the worker anti-affinity selects on them).
    labels = {"training.kubeflow.org/job-name": job["metadata"]["name"], "training.kubeflow.org/job-role": role.lower()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}-0", "labels": labels},
        "spec": copy.deepcopy(template["spec"]),
    }


@pytest.mark.parametrize("manifest", MPIJOBS)
def test_mpijob_pod_templates_are_valid_pods(kube: KubeClient, namespace: str, manifest: str) -> None:
    (job,) = load_yaml_docs(EXAMPLE_DIR / manifest)
    worker = _dry_run(kube, _pod_from(job, "Worker"), namespace)
    spec = worker["spec"]
    assert spec["resourceClaims"][0]["resourceClaimTemplateName"].startswith("h100-4gpu-4nic-numa-")
    container = spec["containers"][0]
    assert container["resources"]["claims"] == [{"name": spec["resourceClaims"][0]["name"]}]
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    launcher = _dry_run(kube, _pod_from(job, "Launcher"), namespace)
    assert launcher["spec"]["containers"][0]["command"][-1] == "/scripts/launcher.sh"
    # Dry run: nothing persisted.
    with pytest.raises(KubeError) as err:
        kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{worker['metadata']['name']}")
    assert isinstance(err.value, NotFound)


# -- dranet templates on a simulated ND H100 v5 node -----------------------------------------


@dataclass
class Node:
    """The simulated node: driver on the fixture, GPUs published, namespace for the pods."""

    kube: KubeClient
    name: str
    namespace: str
    sysfs: Path


def _gpu_slice_with_standard_numa(node: str, uid: str) -> dict[str, Any]:
    # The GPU double publishes gpu.nvidia.com/numaNode only; a GPU driver that also publishes the
    # standard attribute is what the matchAttribute template needs, so add it here.
    body = gpu_double.gpu_slice(node, uid)
    for dev in body["spec"]["devices"]:
        dev["attributes"][NUMA] = {"int": dev["attributes"][f"{gpu_double.GPU_DRIVER}/numaNode"]["int"]}
    return body


@contextlib.contextmanager
def simulated_nd_node(control_plane: ControlPlane, tag: str, extra_args: Sequence[str] = ()) -> Iterator[Node]:
    """A simulated ND H100 v5 node: ``dranet run`` (with ``extra_args``) on the fixture sysfs, the
    example's DeviceClass and the GPU double's, the GPUs published, a namespace for the pods; all
    removed after. ``tag`` names the node, the namespace and the work folder."""
    kube = control_plane.kube()
    name = f"nd-{tag}-{secrets.token_hex(3)}"
    ns = f"{tag}-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix=f"dn-{tag}-"))  # short: unix socket paths <= 108 bytes
    driver = DriverProcess(control_plane.kubeconfig, name, work / "sysfs", work / "drv", extra_args=list(extra_args))
    (dranet_class,) = load_yaml_docs(EXAMPLE_DIR / "device-class.yaml")
    made_classes: list[str] = []
    try:
        control_plane.create_node(name)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        build_fixture("nd-h100-v5", work / "sysfs")
        driver.start()
        for cls in (dranet_class, gpu_double.device_class()):
            try:
                kube.request("POST", f"{RESOURCE_API}/deviceclasses", cls)
                made_classes.append(cls["metadata"]["name"])
            except KubeError as exc:
                if exc.status != 409:  # left by another module of this session: same content
                    raise
        uid = kube.read_node(name)["metadata"]["uid"]
        kube.request("POST", f"{RESOURCE_API}/resourceslices", _gpu_slice_with_standard_numa(name, uid))
        wait_for(lambda: list_slices(kube, name, "dra.net"), 30, what="dra.net slices")
        yield Node(kube, name, ns, work / "sysfs")
    finally:
        driver.stop()
        _delete(kube, f"/api/v1/namespaces/{ns}")
        for cls_name in made_classes:
            _delete(kube, f"{RESOURCE_API}/deviceclasses/{cls_name}")
        delete_node_and_slices(kube, name)
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def nd_node(control_plane: ControlPlane) -> Iterator[Node]:
    with simulated_nd_node(control_plane, "topo") as node:
        yield node


def _schedule(node: Node, pod: str, template: str) -> list[dict[str, Any]]:
    """Schedule a pod using ``template``; the allocated devices' attributes (with the request name)."""
    create_objects(node.kube, [pod_for_template(pod, template, node.name)], node.namespace)
    claim = wait_for(lambda: allocated_claim(node.kube, node.namespace, pod), 60, what=f"{pod} allocated")
    attrs = slice_devices(node.kube, node.name)
    return [
        {"request": r["request"], **attrs[(r["driver"], r["pool"], r["device"])]}
        for r in claim["status"]["allocation"]["devices"]["results"]
    ]


def _release(node: Node, *pods: str) -> None:
    for pod in pods:
        delete_pod(node.kube, node.namespace, pod)
    # Generated claims go with their pods; wait so the next pod can have the same devices.
    wait_for(
        lambda: not node.kube.request("GET", f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims")["items"],
        60,
        what="generated claims deleted",
    )


def _allocate(node: Node, pod: str, template: str) -> list[dict[str, Any]]:
    """Schedule, read the allocation, release."""
    try:
        return _schedule(node, pod, template)
    finally:
        _release(node, pod)


@pytest.mark.slow
def test_dranet_templates_allocate_nics_on_the_gpus_numa_node(nd_node: Node) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "driver",
            "--log-format",
            "text",
            "templates",
            "--gpus",
            "4",
            "--sysfs-root",
            str(nd_node.sysfs),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=60,
    ).stdout
    templates = [d for d in yaml.safe_load_all(out) if d]
    assert [t["metadata"]["name"] for t in templates] == ["4gpu-4nic-numa0", "4gpu-4nic-numa1"]
    create_objects(nd_node.kube, templates, nd_node.namespace)
    expected_gpus = {
        0: {"0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0"},
        1: {"0009:00:00.0", "000a:00:00.0", "000b:00:00.0", "000c:00:00.0"},
    }
    for numa, tmpl in enumerate(templates):
        devices = _allocate(nd_node, f"numa{numa}", tmpl["metadata"]["name"])
        gpus = [d for d in devices if d["request"] == "gpu"]
        nics = [d for d in devices if d["request"] == "nic"]
        assert {g[BUS_ID] for g in gpus} == expected_gpus[numa]
        assert len(nics) == 4
        assert [n["dra.net/numaNode"] for n in nics] == [numa] * 4
        assert all(n["dra.net/rdma"] is True for n in nics)


@pytest.mark.slow
def test_match_numa_template_allocates_one_numa_node(nd_node: Node) -> None:
    (tmpl,) = load_yaml_docs(EXAMPLE_DIR / "resource-claim-template-match-numa.yaml")
    # One NUMA-0 NIC taken by another pod leaves NUMA 0 with 4 GPUs but only 3 RDMA NICs: the
    # constraint must move GPUs and NICs to NUMA 1 (first-fit alone would take GPUs 0-3).
    blocker = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-numa0-nic"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "nic",
                            "exactly": {
                                "deviceClassName": "dranet.net",
                                "count": 1,
                                "selectors": [
                                    {
                                        "cel": {
                                            "expression": 'device.attributes["dra.net"]["rdma"] == true && '
                                            'device.attributes["dra.net"]["numaNode"] == 0'
                                        }
                                    }
                                ],
                            },
                        }
                    ]
                }
            }
        },
    }
    create_objects(nd_node.kube, [tmpl, blocker], nd_node.namespace)
    try:
        (taken,) = _schedule(nd_node, "blocker", "one-numa0-nic")
        assert taken[NUMA] == 0
        devices = _schedule(nd_node, "same-numa", tmpl["metadata"]["name"])
        assert sorted(d["request"] for d in devices) == ["gpu"] * 4 + ["nic"] * 4
        assert {d[NUMA] for d in devices} == {1}, devices
        assert all(d["dra.net/rdma"] is True for d in devices if d["request"] == "nic")
    finally:
        _release(nd_node, "blocker", "same-numa")
