"""NIC health the pod and the scheduler see (kubelet feature gate ResourceHealthStatus, apiserver,
scheduler and controller-manager gate DRADeviceTaints; both on in devcluster).

The node's NICs are veths whose far ends sit in the cluster's fabric namespace: setting the far
end down takes the carrier away, as a pulled cable or a switch port going down would.

1. A running pod holds 4 NICs; one loses its link: the pod's
   ``status.containerStatuses[].allocatedResourcesStatus`` says Unhealthy within 5 s, the device
   gets the ``dra.net/unhealthy=LinkDown:NoSchedule`` taint in the ResourceSlice; link back:
   Healthy, taint gone. The claim is a ResourceClaim named like the pod's claim entry, made from
   the training example's aligned template's spec: the 1.34 kubelet fills ``allocatedResourcesStatus`` only
   when the two names match, so never for a claim made from a template (kubernetes#134482, fixed
   in 1.35 by kubernetes#134875); the driver's health stream is the same either way.
2. A free NIC loses its link: a new claim for "one RDMA NIC on NUMA 1", which the allocator gives
   that NIC when it is healthy (checked first), gets another one; a claim for exactly that NIC
   stays unallocated (the real scheduler says why) until the link is back, then gets it.
3. With ``deviceTaints.effect=NoExecute`` the pod holding a NIC that lost its link is evicted.
4. A free NIC removed from the node (its veth deleted) is tainted ``NetdevMissing``, untainted when
   it is back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.cluster import fabric
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import load_yaml_docs, wait_for
from devcluster.cluster.pods import pod_view
from devcluster.demo.allocation import ALIGNED, EXAMPLE_DIR
from driver.config import UNHEALTHY_TAINT_KEY
from driver.kube.client import RESOURCE_API
from driver.kube.errors import NotFound
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    NUMA1_RDMA,
    create_template,
    delete_pod,
    events_for,
    get_pod,
    nic_snapshot,
    nic_template,
    pod_claim,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS
HEALTH_DEADLINE = 5.0  # s: link down -> Unhealthy in the pod's status (the goal)
SLICE_DEADLINE = 10.0  # s: taint on/off in the slice, Healthy again (coalesced slice writes)


def _peer(node: RealNode, nic: str, up: bool) -> float:
    """Set the far end of node 0's ``nic`` up or down (its rail's switch port); returns when it was done."""
    fabric.set_link(node.spec(), nic, up)
    return time.monotonic()


@pytest.fixture
def links(real_node: RealNode) -> Iterator[set[str]]:
    """NICs whose far end a test set down; all set up again afterwards, whatever happened."""
    down: set[str] = set()
    try:
        yield down
    finally:
        for nic in real_node.layout.nics:
            _peer(real_node, nic, True)


def _devices(node: RealNode) -> dict[str, dict[str, Any]]:
    """ifName -> the device entry of this node's dra.net slice (with its taints)."""
    selector = f"spec.driver=dra.net,spec.nodeName={node.node}"
    items = node.kube.request("GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": selector})["items"]
    out = {}
    for s in items:
        for d in s["spec"].get("devices") or []:
            ifname = (d.get("attributes") or {}).get("dra.net/ifName", {}).get("string")
            if ifname:
                out[ifname] = d
    return out


def _taint(node: RealNode, nic: str) -> dict[str, Any] | None:
    taints = _devices(node).get(nic, {}).get("taints") or []
    return next((t for t in taints if t["key"] == UNHEALTHY_TAINT_KEY), None)


def _health(node: RealNode, ns: str, pod: str) -> dict[str, str]:
    """resourceID -> health from the pod's containerStatuses[].allocatedResourcesStatus."""
    p = get_pod(node, ns, pod)
    out = {}
    for cs in p["status"].get("containerStatuses") or []:
        for rs in cs.get("allocatedResourcesStatus") or []:
            for r in rs.get("resources") or []:
                out[r["resourceID"]] = r.get("health", "")
    return out


def _until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> float:
    """Poll fast; returns the time.monotonic() when ``predicate`` first held."""
    wait_for(predicate, timeout, interval, what)
    return time.monotonic()


def _both(pod_side: Any, slice_side: Any, timeout: float, what: str) -> tuple[float, float]:
    """Poll both conditions in one loop; the time.monotonic() at which each first held."""
    seen: dict[str, float] = {}

    def check() -> bool:
        for key, predicate in (("pod", pod_side), ("slice", slice_side)):
            if key not in seen and predicate():
                seen[key] = time.monotonic()
        return len(seen) == 2

    wait_for(check, timeout, 0.05, what)
    return seen["pod"], seen["slice"]


def test_link_down_on_a_held_nic_reaches_the_pod_status_and_the_slice(
    real_node: RealNode, seed_ns: str, links: set[str]
) -> None:
    node, ns = real_node, seed_ns
    seed = next(
        d for d in load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml") if d["metadata"]["name"] == ALIGNED
    )
    named = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "devices"}}
    node.kube.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", {**named, "spec": seed["spec"]["spec"]})
    start_pod(node, ns, "trainer", claim="devices")  # the pod's claim entry is named "devices" too
    wait_running(node, ns, "trainer")
    claim = pod_claim(node, ns, "trainer")
    devs = {r["device"]: r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == "dra.net"}
    nic = node.layout.nics[0]
    device = _devices(node)[nic]["name"]
    assert device in devs
    # The kubelet names a device by its first CDI device: the NIC's device metadata mount
    # (dra.net/metadata=<claim uid>_<request>_<device>), dra.net/<pool>/<device> without one.
    resource = f"dra.net/metadata={claim['metadata']['uid']}_nic_{device}"
    wait_for(lambda: _health(node, ns, "trainer").get(resource) == "Healthy", 60, 0.2, f"{resource} Healthy")

    links.add(nic)
    down = _peer(node, nic, False)
    t_pod, t_taint = _both(
        lambda: _health(node, ns, "trainer").get(resource) == "Unhealthy",
        lambda: _taint(node, nic) is not None,
        30,
        "Unhealthy in the pod status and the taint in the slice",
    )
    taint = _taint(node, nic)
    assert taint is not None and (taint["value"], taint["effect"]) == ("LinkDown", "NoSchedule")
    others = {r: h for r, h in _health(node, ns, "trainer").items() if r.startswith("dra.net/") and r != resource}
    assert others and set(others.values()) == {"Healthy"}, others
    assert nic in pod_view(node.kubectl, ns, "trainer").interfaces  # the pod keeps its NIC (NoSchedule)

    up = _peer(node, nic, True)
    t_back, t_untaint = _both(
        lambda: _health(node, ns, "trainer").get(resource) == "Healthy",
        lambda: _taint(node, nic) is None,
        30,
        "Healthy again and the taint removed",
    )
    print(
        f"\n[health] {nic} ({device}) held by a running pod: link down -> Unhealthy in the pod status "
        f"{t_pod - down:.2f}s, -> taint {taint} in the slice {t_taint - down:.2f}s; link up -> Healthy "
        f"{t_back - up:.2f}s, taint removed {t_untaint - up:.2f}s"
    )
    assert t_pod - down <= HEALTH_DEADLINE, f"Unhealthy after {t_pod - down:.2f}s"
    # The taint rides on the rate-limited slice writes (2 s interval): bounded, not instant.
    for what, took in (("taint", t_taint - down), ("Healthy", t_back - up), ("untaint", t_untaint - up)):
        assert took <= SLICE_DEADLINE, f"{what} after {took:.2f}s"
    delete_pod(node, ns, "trainer")


def test_a_nic_that_disappears_is_tainted_until_it_is_back(real_node: RealNode) -> None:
    """A free NIC removed from the node (its veth deleted, as a failed card goes) is tainted
    ``NetdevMissing`` within the health interval and the slice's write interval, though the node's
    sysfs is a fixture tree that never changes: the host's links are asked over netlink. Put back,
    the taint goes."""
    node = real_node
    nic = node.layout.nics[-1]
    assert _taint(node, nic) is None
    gone = time.monotonic()
    fabric.unplug_nic(node.spec(), nic)
    try:
        t_taint = _until(lambda: (_taint(node, nic) or {}).get("value") == "NetdevMissing", 30, f"{nic} tainted")
    finally:
        fabric.plug_nic(node.spec(), nic)
    back = time.monotonic()
    t_untaint = _until(lambda: _taint(node, nic) is None, 30, f"{nic} untainted")
    took = f"NetdevMissing taint {t_taint - gone:.2f}s; back -> untainted {t_untaint - back:.2f}s"
    print(f"\n[health] {nic} removed -> {took}")
    assert t_taint - gone <= SLICE_DEADLINE and t_untaint - back <= SLICE_DEADLINE


def _allocated_nic(node: RealNode, ns: str, pod: str) -> str:
    claim = pod_claim(node, ns, pod)
    (result,) = [r for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == "dra.net"]
    by_name = {d["name"]: ifname for ifname, d in _devices(node).items()}
    return by_name[result["device"]]


def test_the_scheduler_never_allocates_a_tainted_nic(real_node: RealNode, seed_ns: str, links: set[str]) -> None:
    node, ns = real_node, seed_ns
    home = nic_snapshot(node)
    numa1 = node.layout.nics[4:]
    create_template(node, nic_template(ns, "any-numa1", NUMA1_RDMA))
    create_template(node, nic_template(ns, "exactly-first", f'device.attributes["dra.net"]["ifName"] == "{numa1[0]}"'))

    # Healthy: "one NIC on NUMA 1" is the first one, numa1[0].
    start_pod(node, ns, "baseline", "any-numa1")
    wait_running(node, ns, "baseline")
    assert _allocated_nic(node, ns, "baseline") == numa1[0]
    delete_pod(node, ns, "baseline")
    wait_nics_home(node, home)

    links.add(numa1[0])
    down = _peer(node, numa1[0], False)
    t_taint = _until(lambda: _taint(node, numa1[0]) is not None, 30, f"{numa1[0]} tainted")
    start_pod(node, ns, "avoids", "any-numa1")
    start_pod(node, ns, "wants-it", "exactly-first")
    wait_running(node, ns, "avoids")
    got = _allocated_nic(node, ns, "avoids")
    assert got != numa1[0] and got in numa1, got
    time.sleep(5)
    pending = get_pod(node, ns, "wants-it")
    assert not pending["spec"].get("nodeName"), "a claim was allocated a tainted NIC"
    why = [e for e in events_for(node, ns, "wants-it") if e.startswith("FailedScheduling")]
    assert why, events_for(node, ns, "wants-it")

    up = _peer(node, numa1[0], True)
    t_untaint = _until(lambda: _taint(node, numa1[0]) is None, 30, f"{numa1[0]} untainted")
    wait_running(node, ns, "wants-it", timeout=120)
    t_sched = time.monotonic()
    assert _allocated_nic(node, ns, "wants-it") == numa1[0]
    assert numa1[0] in pod_view(node.kubectl, ns, "wants-it").interfaces
    print(
        f"\n[health] free NIC {numa1[0]}: link down -> taint {t_taint - down:.2f}s; a claim for any NUMA-1 NIC "
        f"got {got} (without the taint: {numa1[0]}); a claim for exactly {numa1[0]} waited "
        f"({why[-1][:160]}); link up -> taint removed {t_untaint - up:.2f}s, that pod Running with "
        f"{numa1[0]} {t_sched - up:.1f}s after the link came back"
    )
    for pod in ("avoids", "wants-it"):
        delete_pod(node, ns, pod)
    wait_nics_home(node, home)


def test_no_execute_evicts_the_pod_holding_a_nic_that_went_down(
    real_node: RealNode, seed_ns: str, links: set[str]
) -> None:
    """``deviceTaints.effect=NoExecute`` (helm upgrade): the controller-manager's
    device-taint-eviction-controller deletes the pod whose claim holds the NIC that lost its link;
    its NICs come home. Back to the default (NoSchedule) afterwards."""
    node, ns = real_node, seed_ns
    image = node.state.driver_image
    home = nic_snapshot(node)
    cluster.helm_upgrade(node.layout, image, "deviceTaints.effect=NoExecute")
    try:
        wait_for(lambda: "--unhealthy-taint-effect=NoExecute" in _driver_args(node), 120, 0.5, "NoExecute rolled out")
        wait_for(lambda: cluster.driver_rollout_done(node.kube, image), 240, 0.5, "the driver rollout")
        start_pod(node, ns, "evictee", ALIGNED)
        wait_running(node, ns, "evictee")
        nic = node.layout.nics[1]
        links.add(nic)
        down = _peer(node, nic, False)
        t_taint = _until(lambda: (_taint(node, nic) or {}).get("effect") == "NoExecute", 30, "the NoExecute taint")

        def evicted() -> bool:
            try:
                pod = get_pod(node, ns, "evictee")
            except NotFound:
                return True
            return bool(pod["metadata"].get("deletionTimestamp"))

        t_evicted = _until(evicted, 120, "the pod evicted", interval=0.2)
        why = [e for e in events_for(node, ns, "evictee") if "Taint" in e or "taint" in e]
        _peer(node, nic, True)
        links.discard(nic)
        wait_for(lambda: _taint(node, nic) is None, 30, 0.2, "the taint removed")
        wait_nics_home(node, home, timeout=120)
        print(
            f"\n[health] NoExecute: link down -> taint {t_taint - down:.2f}s, pod evicted {t_evicted - down:.2f}s "
            f"({why[-1][:160] if why else 'no event'}); its NICs came home"
        )
    finally:
        cluster.helm_upgrade(node.layout, image)
        wait_for(lambda: "--unhealthy-taint-effect=NoSchedule" in _driver_args(node), 120, 0.5, "NoSchedule back")
        wait_for(lambda: cluster.driver_rollout_done(node.kube, image), 240, 0.5, "the driver rollout back")


def _driver_args(node: RealNode) -> list[str]:
    ds = node.kube.request("GET", f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}")
    args: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    return args
