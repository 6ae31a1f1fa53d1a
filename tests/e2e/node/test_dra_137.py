"""Kubernetes 1.37's DRA on the real nodes: device metadata in the containers, extended resources.

- **Device metadata** (KEP-5304): the training example's aligned pod reads
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/devices/nic/dra.net-metadata.json``
  inside its container (bind-mounted by containerd from the driver's CDI spec): its four NICs with
  their pod-side names as the container sees them, the GPU each pairs with (a GPU of the same
  claim, each once), the RDMA devices; Kubernetes' own reader accepts it; the files go with the pod.
- **Extended resources** (KEP-5004): the chart's DeviceClass rendered with
  ``deviceClass.extendedResourceName``; a pod asking ``resources.limits`` for two of it, with no
  ResourceClaim, gets two NICs moved into it by the same hooks, and they come home after.

Both work on 1.34 as well, the second only with the DRAExtendedResource feature gate
(``make test-oldest-k8s`` runs this module there; see docs/extended-resources.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.builders import helm
from devcluster.cluster.controlplane import create_objects, wait_for
from devcluster.cluster.pods import pod_view, workload_pod
from devcluster.demo.allocation import ALIGNED
from devcluster.doubles.gpu_double import GPU_DRIVER
from driver.claims.metadata_document import decode_first
from harness.metadata_decoder_build import decoder_binary
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    delete_pod,
    get_pod,
    nic_snapshot,
    pod_claim,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS

CHART = Path(__file__).resolve().parents[3] / "charts" / "dranet"
METADATA = "/var/run/kubernetes.io/dra-device-attributes"
EXTENDED_CLASS, EXTENDED_NAME = "ext-nics.dranet.net", "example.com/rdma-nic"


def _read_in_container(real_node: RealNode, ns: str, pod: str, path: str) -> str:
    return real_node.kubectl.exec(ns, pod, "cat", path)


def test_the_seed_pod_reads_its_nics_from_the_metadata_file(real_node: RealNode, seed_ns: str, tmp_path: Path) -> None:
    start_pod(real_node, seed_ns, "meta", template=ALIGNED)
    wait_running(real_node, seed_ns, "meta")
    claim = pod_claim(real_node, seed_ns, "meta")
    path = f"{METADATA}/resourceclaimtemplates/devices/nic/dra.net-metadata.json"
    text = _read_in_container(real_node, seed_ns, "meta", path)
    doc = decode_first(text.encode())
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1beta1" and doc["podClaimName"] == "devices"
    assert doc["metadata"]["uid"] == claim["metadata"]["uid"]
    assert doc["metadata"]["generation"] >= 2  # prepare wrote 1, RunPodSandbox the pod's view
    [request] = doc["requests"]
    results = claim["status"]["allocation"]["devices"]["results"]
    ours = sorted(r["device"] for r in results if r["driver"] == "dra.net")
    gpus = {r["device"] for r in results if r["driver"] == GPU_DRIVER}
    assert sorted(d["name"] for d in request["devices"]) == ours and len(ours) == 4

    view = pod_view(real_node.kubectl, seed_ns, "meta")
    paired = []
    for device in request["devices"]:
        network, attrs = device["networkData"], device["attributes"]
        inside = view.interfaces[network["interfaceName"]]  # the name the container sees
        assert network["hardwareAddress"] == inside.mac
        assert attrs["dra.net/podInterfaceName"]["string"] == network["interfaceName"]
        assert attrs["dra.net/rdmaDevice"]["string"].startswith("mlx5_")
        assert "uverbs" in attrs["dra.net/rdmaCharDevices"]["string"]
        assert attrs["dra.net/numaNode"]["int"] == 0
        paired.append(attrs["dra.net/gpu"]["string"])
        # Azure ND: every GPU and NIC has a PCI domain of its own, the best path is NODE.
        assert attrs["dra.net/gpuPath"]["string"] == "NODE"
    assert sorted(paired) == sorted(gpus)  # each GPU of the claim pairs with one NIC

    # Kubernetes' own reader (validation on) accepts what the container read.
    copy = tmp_path / "metadata.json"
    copy.write_text(text)
    out = subprocess.run([str(decoder_binary()), str(copy)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["devices"] == 4

    plugin_dir = real_node.spec(0).driver_runtime_dir / "dra-device-metadata"
    host_dir = plugin_dir / f"{seed_ns}_{claim['metadata']['name']}"
    cdi = real_node.spec(0).cdi_dir / f"dra.net_metadata_{claim['metadata']['uid']}_nic.json"
    assert host_dir.is_dir() and cdi.is_file()
    delete_pod(real_node, seed_ns, "meta")
    wait_for(lambda: not host_dir.exists() and not cdi.exists(), 60, 0.2, "metadata files removed at unprepare")


@pytest.fixture
def extended_class(real_node: RealNode) -> Any:
    """The chart's DeviceClass, rendered with an extended resource name, created for the test."""
    version = real_node.kube.get_code()
    if (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 36):
        pytest.skip(f"DRAExtendedResource is alpha and off on {version['gitVersion']} (docs/extended-resources.md)")
    rendered = subprocess.run(
        [
            helm.ensure(),
            "template",
            "x",
            str(CHART),
            "--show-only",
            "templates/deviceclass.yaml",
            "--set",
            f"deviceClass.name={EXTENDED_CLASS}",
            "--set",
            f"deviceClass.extendedResourceName={EXTENDED_NAME}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    [doc] = [d for d in yaml.safe_load_all(rendered) if d]
    assert doc["spec"]["extendedResourceName"] == EXTENDED_NAME
    create_objects(real_node.kube, [doc])
    try:
        yield doc
    finally:
        real_node.kubectl.run("delete", "deviceclass", EXTENDED_CLASS, "--ignore-not-found")


def test_a_device_plugin_pod_gets_nics_through_the_extended_resource(
    real_node: RealNode, seed_ns: str, extended_class: Any
) -> None:
    before = nic_snapshot(real_node)
    pod = workload_pod("ext", real_node.node, namespace=seed_ns)
    # What a pod written for the RDMA shared device plugin asks: a count, no ResourceClaim.
    pod["spec"]["containers"][0]["resources"] = {"limits": {EXTENDED_NAME: "2"}, "requests": {EXTENDED_NAME: "2"}}
    real_node.kube.request("POST", f"/api/v1/namespaces/{seed_ns}/pods", pod)
    wait_running(real_node, seed_ns, "ext")
    status = get_pod(real_node, seed_ns, "ext")["status"]["extendedResourceClaimStatus"]
    [mapping] = status["requestMappings"]
    assert mapping["containerName"] == "trainer" and mapping["resourceName"] == EXTENDED_NAME
    claim = real_node.kube.read_namespaced_resource_claim(seed_ns, status["resourceClaimName"])
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["driver"] for r in results} == {"dra.net"}

    view = pod_view(real_node.kubectl, seed_ns, "ext")
    moved = [n for n in real_node.layout.nics if n in view.interfaces]
    assert len(moved) == 2, view.interfaces.keys()  # configured and moved like a claim's NICs
    assert view.env["NCCL_IB_HCA"].startswith("=mlx5_")
    # Its metadata file is under the generated claim's name and the scheduler's request name.
    path = f"{METADATA}/resourceclaims/{claim['metadata']['name']}/{mapping['requestName']}/dra.net-metadata.json"
    devices = decode_first(_read_in_container(real_node, seed_ns, "ext", path).encode())["requests"][0]["devices"]
    assert sorted(d["networkData"]["interfaceName"] for d in devices) == sorted(moved)

    delete_pod(real_node, seed_ns, "ext")
    wait_nics_home(real_node, before)
