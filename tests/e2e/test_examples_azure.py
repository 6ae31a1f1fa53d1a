"""The Azure ND H100 v5 placement-group template against the real scheduler: ``dranet run`` on the
simulated ND H100 v5 node gets its cloud attributes from recorded Azure IMDS responses served on
127.0.0.1 (``--cloud-metadata-url``), and the template allocates GPUs and NICs of that placement group;
a template naming another group allocates nothing."""

from __future__ import annotations

import copy
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster.controlplane import ControlPlane, create_objects, load_yaml_docs, wait_for
from devcluster.demo.allocation import build_fixture, pod_for_template, slice_devices
from devcluster.doubles import gpu_double
from driver.kube.client import RESOURCE_API
from driver.kube.errors import KubeError
from harness.driver_process import DriverProcess
from tests.e2e.test_examples_apiserver import (
    EXAMPLE_DIR,
    Node,
    _delete,
    _gpu_slice_with_standard_numa,
    _release,
    _schedule,
)
from tests.plugins.cluster import delete_node_and_slices, list_slices
from tests.support.metadata_server import MetadataServer

pytestmark = [pytest.mark.cluster]
TEMPLATE = "resource-claim-template-azure-placement.yaml"
GROUP = "8a2e6f1c-4b7d-4e93-9c05-3f1a7d2b6e48"  # tests/fixtures/cloud/azure/compute.json


@pytest.fixture(scope="module")
def azure_node(control_plane: ControlPlane) -> Iterator[Node]:
    kube = control_plane.kube()
    name = f"nd-az-{secrets.token_hex(3)}"
    ns = f"az-{secrets.token_hex(3)}"
    work = Path(tempfile.mkdtemp(prefix="dn-az-"))
    made: list[str] = []
    with MetadataServer("azure") as imds:
        driver = DriverProcess(
            control_plane.kubeconfig,
            name,
            work / "sysfs",
            work / "drv",
            extra_args=["--cloud-provider", "azure", "--cloud-metadata-url", imds.url],
        )
        try:
            control_plane.create_node(name)
            kube.request(
                "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
            build_fixture("nd-h100-v5", work / "sysfs")
            driver.start()
            (dranet_class,) = load_yaml_docs(EXAMPLE_DIR / "device-class.yaml")
            for cls in (dranet_class, gpu_double.device_class()):
                try:
                    kube.request("POST", f"{RESOURCE_API}/deviceclasses", cls)
                    made.append(cls["metadata"]["name"])
                except KubeError as exc:
                    if exc.status != 409:
                        raise
            uid = kube.read_node(name)["metadata"]["uid"]
            kube.request("POST", f"{RESOURCE_API}/resourceslices", _gpu_slice_with_standard_numa(name, uid))
            wait_for(lambda: list_slices(kube, name, "dra.net"), 30, what="dra.net slices")
            yield Node(kube, name, ns, work / "sysfs")
        finally:
            driver.stop()
            _delete(kube, f"/api/v1/namespaces/{ns}")
            for cls_name in made:
                _delete(kube, f"{RESOURCE_API}/deviceclasses/{cls_name}")
            delete_node_and_slices(kube, name)
            shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
def test_placement_group_template_allocates_on_the_azure_node(azure_node: Node) -> None:
    nics = [a for (drv, _pool, _dev), a in slice_devices(azure_node.kube, azure_node.name).items() if drv == "dra.net"]
    assert nics and all(a.get("azure.dra.net/placementGroupId") == GROUP for a in nics)
    assert all(a.get("azure.dra.net/vmSize") == "Standard_ND96isr_H100_v5" for a in nics)
    (tmpl,) = load_yaml_docs(EXAMPLE_DIR / TEMPLATE)
    create_objects(azure_node.kube, [tmpl], azure_node.namespace)
    try:
        devices = _schedule(azure_node, "az-aligned", tmpl["metadata"]["name"])
    finally:
        _release(azure_node, "az-aligned")
    gpus = [d for d in devices if d["request"] == "gpu"]
    nics = [d for d in devices if d["request"] == "nic"]
    assert len(gpus) == 4 and len(nics) == 4
    assert all(n["azure.dra.net/placementGroupId"] == GROUP and n["dra.net/numaNode"] == 0 for n in nics)


@pytest.mark.slow
def test_another_placement_group_allocates_nothing(azure_node: Node) -> None:
    (tmpl,) = load_yaml_docs(EXAMPLE_DIR / TEMPLATE)
    other = copy.deepcopy(tmpl)
    other["metadata"]["name"] = "other-placement-group"
    nic = other["spec"]["spec"]["devices"]["requests"][1]["exactly"]["selectors"][0]["cel"]
    nic["expression"] = nic["expression"].replace(GROUP, "00000000-0000-0000-0000-000000000000")
    create_objects(azure_node.kube, [other], azure_node.namespace)
    create_objects(
        azure_node.kube, [pod_for_template("az-other", "other-placement-group", azure_node.name)], azure_node.namespace
    )
    try:
        time.sleep(8)  # the scheduler has tried by now
        claims = azure_node.kube.request("GET", f"{RESOURCE_API}/namespaces/{azure_node.namespace}/resourceclaims")
        assert claims["items"] and not any((c.get("status") or {}).get("allocation") for c in claims["items"])
    finally:
        _release(azure_node, "az-other")
