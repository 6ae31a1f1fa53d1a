"""The Azure ND H100 v5 placement-group template against the real scheduler: ``dranet run`` on the
simulated ND H100 v5 node gets its cloud attributes from recorded Azure IMDS responses served on
127.0.0.1 (``--cloud-metadata-url``), and the template allocates GPUs and NICs of that placement group;
a template naming another group allocates nothing."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest

from devcluster.cluster.controlplane import ControlPlane, create_objects, load_yaml_docs
from devcluster.demo.allocation import pod_for_template, slice_devices
from driver.kube.client import RESOURCE_API
from tests.e2e.test_examples_apiserver import EXAMPLE_DIR, Node, _release, _schedule, simulated_nd_node
from tests.support.metadata_server import MetadataServer

pytestmark = [pytest.mark.cluster]
TEMPLATE = "resource-claim-template-azure-placement.yaml"
GROUP = "8a2e6f1c-4b7d-4e93-9c05-3f1a7d2b6e48"  # tests/fixtures/cloud/azure/compute.json


@pytest.fixture(scope="module")
def azure_node(control_plane: ControlPlane) -> Iterator[Node]:
    with MetadataServer("azure") as imds:
        extra = ["--cloud-provider", "azure", "--cloud-metadata-url", imds.url]
        with simulated_nd_node(control_plane, "az", extra) as node:
            yield node


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
