"""Shared NICs on the real node (Kubernetes 1.36+): the scheduler shares ib0 by bandwidth, each pod
gets its own sub-interface of it, and whole-NIC claims never get a partly used NIC.

The driver is upgraded (helm) to share ib0 with an address pool for the module, and back after.
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterator

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from driver.dra.field_support import consumable_capacity_accepted
from driver.kube.client import RESOURCE_API
from driver.model.device import BANDWIDTH_CAPACITY
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    apply_seed_templates,
    claim_config_template,
    create_template,
    delete_pod,
    get_pod,
    nic_snapshot,
    pod_claim,
    start_pod,
    wait_running,
)

pytestmark = E2E_MARKS
NIC = "ib0"
# The node's pool for ib0's shares, of the cluster's primary IP version.
POOLS = {4: "10.250.0.0/24", 6: "fd25:250::/120"}
SHARE_EXPR = f'device.attributes["dra.net"].ifName == "{NIC}"'


def _image(real_node: RealNode) -> str:
    ds = real_node.kube.request("GET", f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}")
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def _upgrade(real_node: RealNode, *values: str) -> None:
    image = _image(real_node)
    cluster.helm_upgrade(real_node.layout, image, *values)
    wait_for(lambda: cluster.driver_rollout_done(real_node.kube, image), 180, 1, "driver rollout")


def _shared_published(real_node: RealNode) -> bool:
    slices = real_node.kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={real_node.node}"}
    )["items"]
    return any(
        d.get("allowMultipleAllocations") and d["attributes"].get("dra.net/ifName", {}).get("string") == NIC
        for s in slices
        if s["spec"]["driver"] == "dra.net"
        for d in s["spec"].get("devices") or []
    )


@pytest.fixture(scope="module")
def sharing(real_node: RealNode) -> Iterator[RealNode]:
    accepted, why = consumable_capacity_accepted(real_node.kube, "dra.net", real_node.node)
    if not accepted:
        pytest.skip(f"the cluster cannot share NICs: {why}")
    # The expression holds no comma: helm's --set would split it.
    pool = POOLS[real_node.layout.versions[0]]
    _upgrade(real_node, f"sharing.filter={SHARE_EXPR}", f"sharing.pools.{NIC}={pool}")
    try:
        wait_for(lambda: _shared_published(real_node), 60, 0.5, f"{NIC} published shared")
        yield real_node
    finally:
        _upgrade(real_node)


def test_without_consumable_capacity_nics_are_published_whole_and_the_log_says_why_once(
    real_node: RealNode,
) -> None:
    """An older control plane (1.34, ``make test-oldest-k8s``): ``sharing.filter`` set, ib0 still
    published whole, and the driver's log says why, once."""
    accepted, _ = consumable_capacity_accepted(real_node.kube, "dra.net", real_node.node)
    if accepted:
        pytest.skip("this control plane counts consumable capacity (1.36+): see the tests below")
    _upgrade(real_node, f"sharing.filter={SHARE_EXPR}")
    try:
        wait_for(lambda: "cannot count consumable capacity" in real_node.driver_logs(), 60, 1, "the log line")
        log = real_node.driver_logs()
        pod = real_node.driver_pod()["metadata"]["name"]
        current = real_node.kubectl.run("logs", "-n", cluster.NAMESPACE, pod, "--tail=-1")
        assert current.count("cannot count consumable capacity") == 1, log[-2000:]
        assert not _shared_published(real_node)
    finally:
        _upgrade(real_node)


@pytest.fixture
def ns(sharing: RealNode) -> Iterator[str]:
    name = sharing.namespace()
    try:
        yield name
    finally:
        sharing.delete_namespace(name)


def _share_template(ns: str, name: str, bandwidth: str) -> dict:
    tmpl = claim_config_template(ns, name, "net1", {"interface": {"name": "net1"}}, SHARE_EXPR)
    tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {BANDWIDTH_CAPACITY: bandwidth}
    }
    return tmpl


def _unschedulable(node: RealNode, ns: str, pod: str) -> dict | None:
    conds = [c for c in get_pod(node, ns, pod)["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
    return conds[0] if conds and conds[0]["status"] == "False" and conds[0].get("message") else None


def test_eight_pods_share_ib0_by_bandwidth_each_with_its_own_sub_interface(sharing: RealNode, ns: str) -> None:
    node = sharing
    before = nic_snapshot(node, [NIC])
    bandwidth = next(
        d["capacity"][BANDWIDTH_CAPACITY]["value"]
        for s in node.kube.request("GET", f"{RESOURCE_API}/resourceslices")["items"]
        if s["spec"].get("nodeName") == node.node and s["spec"]["driver"] == "dra.net"
        for d in s["spec"]["devices"]
        if d["attributes"].get("dra.net/ifName", {}).get("string") == NIC
    )
    gbps = int(bandwidth.rstrip("G"))
    create_template(node, _share_template(ns, "tenth", f"{gbps // 10}G"))
    create_template(node, _share_template(ns, "three-tenths", f"{3 * gbps // 10}G"))
    apply_seed_templates(node, ns)
    pods = [f"share-{i}-{secrets.token_hex(2)}" for i in range(8)]
    for pod in pods:
        start_pod(node, ns, pod, "tenth")
    for pod in pods:
        wait_running(node, ns, pod, timeout=180)
    views = {pod: pod_view(node.kubectl, ns, pod).interfaces["net1"] for pod in pods}
    addresses = {pod: v.addresses[0].split("/")[0] for pod, v in views.items()}
    pool = ipaddress.ip_network(POOLS[node.layout.versions[0]])
    assert len(set(addresses.values())) == 8 and all(ipaddress.ip_address(a) in pool for a in addresses.values())
    assert len({v.mac for v in views.values()}) == 8, "each pod has its own MAC"
    claims = {pod: pod_claim(node, ns, pod) for pod in pods}
    results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims.values()]
    assert len({r["device"] for r in results}) == 1 and len({r["shareID"] for r in results}) == 8
    entry = next(d for d in claims[pods[0]]["status"].get("devices") or [] if d["driver"] == "dra.net")
    assert entry["shareID"] == results[0]["shareID"] and entry["networkData"]["interfaceName"] == "net1"
    # They reach each other over their sub-interfaces.
    out = node.kubectl.exec(ns, pods[0], "ping", "-c", "1", "-W", "2", addresses[pods[1]])
    assert " 0% packet loss" in out, out
    # 80% used: a pod asking 30% waits with the scheduler's reason; the training example's aligned pod (four
    # whole NUMA-0 NICs) cannot have ib0 and waits too.
    start_pod(node, ns, "late", "three-tenths")
    start_pod(node, ns, "aligned", "h100-4gpu-4nic-numa-aligned")
    cond = wait_for(lambda: _unschedulable(node, ns, "late"), 60, 0.5, "late unschedulable")
    assert "cannot allocate all claims" in cond["message"], cond
    wait_for(lambda: _unschedulable(node, ns, "aligned"), 60, 0.5, "aligned unschedulable")
    # One share goes: 30% is free, the late pod starts.
    delete_pod(node, ns, pods[0])
    wait_running(node, ns, "late", timeout=180)
    assert nic_snapshot(node, [NIC]) == before, "the NIC never left the host"
    for pod in [*pods[1:], "late"]:
        delete_pod(node, ns, pod)
    # Every share gone: the aligned pod gets its four whole NICs (ib0 among them).
    wait_running(node, ns, "aligned", timeout=180)
    delete_pod(node, ns, "aligned")
    assert nic_snapshot(node, [NIC]) == before
