"""Node settings take effect when set, on the real node (Kubernetes 1.36+: shared NICs).

A share of ib0 whose claim gives no address, on a node with no address pool, is refused saying to
annotate the node; done as it says on the running node, the next share gets an address of the new
range within seconds, the refused pod starts at the kubelet's next retry, and the driver process is
the same one (no restart). A bad annotation is a Warning event on the Node naming it, the pools in
effect staying; a range moved under running shares leaves their addresses with them and says so on
the Node.

The driver is upgraded (helm) to share ib0 with no pool for the module, and back after.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from driver.config import LEASE_OUTSIDE_POOL_EVENT, NODE_SETTING_REFUSED_EVENT, SHARING_POOLS_ANNOTATION
from driver.dra.field_support import consumable_capacity_accepted
from driver.kube.client import RESOURCE_API
from driver.model.device import BANDWIDTH_CAPACITY
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import create_template, delete_pod, events_for, start_pod, wait_running
from tests.e2e.node.test_sharing import NIC, SHARE_EXPR, _share_template, _shared_published, _upgrade

pytestmark = E2E_MARKS
# Two ranges of this node, of the cluster's primary IP version.
RANGES = {4: ("10.251.0.0/28", "10.251.1.0/28"), 6: ("fd25:251::/124", "fd25:251:1::/124")}
# Host bits set: the annotation's own mistake, which the driver must name.
BAD = {4: "10.251.0.1/28", 6: "fd25:251::1/124"}
NEXT_SHARE_WITHIN = 30.0
"""Seconds from the annotation to the next share's pod Ready (the pod's own start included)."""


def _annotate(node: RealNode, pools: str | None) -> None:
    """Set (None: remove) this node's ``dra.net/sharing-pools``, as ``kubectl annotate`` does."""
    body = {"metadata": {"annotations": {SHARING_POOLS_ANNOTATION: pools}}}
    node.kube.request("PATCH", f"/api/v1/nodes/{node.node}", body, content_type="application/merge-patch+json")


def _node_events(node: RealNode, reason: str) -> list[str]:
    """Messages of the Warning events the driver posted on this Node with ``reason``."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node.node},reason={reason}"
    items = node.kube.request("GET", "/api/v1/namespaces/default/events", query={"fieldSelector": selector})
    return [str(e.get("message")) for e in items["items"]]


def _driver_process(node: RealNode) -> tuple[str, int, list[int]]:
    """(pod name, container restarts, PIDs) of the node's driver: the same after a live change."""
    pod = node.driver_pod()
    restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])
    return pod["metadata"]["name"], restarts, node.driver_pids()


def _address(node: RealNode, ns: str, pod: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(pod_view(node.kubectl, ns, pod).interfaces["net1"].addresses[0].split("/")[0])


def _created_to_ready(pod: dict[str, Any]) -> float:
    """Seconds (whole: API timestamps) from the pod's creation to its Ready condition."""
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    return (datetime.fromisoformat(ready["lastTransitionTime"]) - created).total_seconds()


@pytest.fixture(scope="module")
def no_pool(real_node: RealNode) -> Iterator[RealNode]:
    """ib0 shared, with no address pool on this node (neither the chart's nor an annotation)."""
    accepted, why = consumable_capacity_accepted(real_node.kube, "dra.net", real_node.node)
    if not accepted:
        pytest.skip(f"the cluster cannot share NICs: {why}")
    _annotate(real_node, None)
    _upgrade(real_node, f"sharing.filter={SHARE_EXPR}")
    try:
        wait_for(lambda: _shared_published(real_node), 60, 0.5, f"{NIC} published shared")
        yield real_node
    finally:
        _annotate(real_node, None)
        _upgrade(real_node)


@pytest.fixture
def ns(no_pool: RealNode) -> Iterator[str]:
    name = no_pool.namespace()
    bandwidth = next(
        d["capacity"][BANDWIDTH_CAPACITY]["value"]
        for s in no_pool.kube.request("GET", f"{RESOURCE_API}/resourceslices")["items"]
        if s["spec"].get("nodeName") == no_pool.node and s["spec"]["driver"] == "dra.net"
        for d in s["spec"]["devices"]
        if d["attributes"].get("dra.net/ifName", {}).get("string") == NIC
    )
    create_template(no_pool, _share_template(name, "share", f"{int(bandwidth.rstrip('G')) // 10}G"))
    try:
        yield name
    finally:
        no_pool.delete_namespace(name)
        _annotate(no_pool, None)


def test_a_pool_annotated_on_the_running_node_is_used_by_the_next_share_within_seconds(
    no_pool: RealNode, ns: str
) -> None:
    node = no_pool
    version = node.layout.versions[0]
    pool = ipaddress.ip_network(RANGES[version][0])
    driver = _driver_process(node)
    refused = f"refused-{secrets.token_hex(2)}"
    start_pod(node, ns, refused, "share")
    said = wait_for(
        lambda: [e for e in events_for(node, ns, refused) if f"no address pool for {NIC} on this node" in e],
        90,
        0.5,
        "the refusal, naming what to set",
    )
    # The refusal says what the admin will see happen once they did what it says.
    assert f"annotate the node {SHARING_POOLS_ANNOTATION}={NIC}=<CIDR>" in said[0], said
    assert "within seconds, without a restart" in said[0] and "kubelet's next retry" in said[0], said

    annotated = time.monotonic()
    _annotate(node, f"{NIC}={pool}")
    following = f"next-{secrets.token_hex(2)}"
    start_pod(node, ns, following, "share")
    ready = wait_running(node, ns, following, timeout=NEXT_SHARE_WITHIN)
    next_s = time.monotonic() - annotated
    assert _address(node, ns, following) in pool
    # The running driver took it from its watch of the Node (its log says so, with the range).
    applied = [line for line in node.driver_logs().splitlines() if "address pools of this node" in line]
    assert applied and f"{NIC}={pool}" in applied[-1], applied
    # The pod refused before starts too, at the kubelet's next retry of its sandbox (every ~10 s).
    wait_running(node, ns, refused, timeout=90)
    retried_s = time.monotonic() - annotated
    assert _address(node, ns, refused) in pool
    assert _address(node, ns, refused) != _address(node, ns, following)
    assert _driver_process(node) == driver, "the same driver process: no restart"
    print(
        f"\n[node settings] annotation -> next share Ready {next_s:.1f}s (its pod created -> Ready "
        f"{_created_to_ready(ready):.0f}s, API timestamps), refused pod Ready {retried_s:.1f}s"
    )
    for pod in (following, refused):
        delete_pod(node, ns, pod)


def test_a_bad_annotation_is_named_on_the_node_and_a_moved_range_keeps_running_shares_addresses(
    no_pool: RealNode, ns: str
) -> None:
    node = no_pool
    version = node.layout.versions[0]
    first, second = (ipaddress.ip_network(r) for r in RANGES[version])
    _annotate(node, f"{NIC}={first}")
    early = f"early-{secrets.token_hex(2)}"
    start_pod(node, ns, early, "share")
    wait_running(node, ns, early, timeout=60)
    held = _address(node, ns, early)
    assert held in first

    # A typo: an event on the Node naming the annotation, the entry and why; the range stays.
    _annotate(node, f"{NIC}={BAD[version]}")
    refused = wait_for(lambda: _node_events(node, NODE_SETTING_REFUSED_EVENT), 30, 0.5, "the refused annotation")
    assert f"node annotation {SHARING_POOLS_ANNOTATION}: {NIC}:" in refused[-1] and "host bits" in refused[-1]
    assert f"the address pools in effect stay ({NIC}={first})" in refused[-1], refused
    during = f"during-{secrets.token_hex(2)}"
    start_pod(node, ns, during, "share")
    wait_running(node, ns, during, timeout=60)
    assert _address(node, ns, during) in first

    # The range moves under two running shares: they keep their addresses, the Node says so.
    _annotate(node, f"{NIC}={second}")
    outside = wait_for(lambda: _node_events(node, LEASE_OUTSIDE_POOL_EVENT), 30, 0.5, "the leases outside")
    assert f"of pod {ns}/{early} (a share of {NIC})" in outside[-1], outside
    assert f"of pod {ns}/{during} (a share of {NIC})" in outside[-1], outside
    late = f"late-{secrets.token_hex(2)}"
    start_pod(node, ns, late, "share")
    wait_running(node, ns, late, timeout=60)
    assert _address(node, ns, late) in second
    assert _address(node, ns, early) == held, "a running share keeps its address"
    for pod in (early, during, late):
        delete_pod(node, ns, pod)
