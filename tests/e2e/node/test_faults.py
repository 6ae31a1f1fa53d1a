"""Faults on the real node while a pod holds 4 NICs, and a pod started while the driver is down.

Restart the kubelet, restart the container runtime, kill -9 the driver (its container is restarted by the
kubelet, as the DaemonSet asks): the pod keeps its NICs, and when it is deleted afterwards every
NIC comes back to the host intact and the claim is unprepared. A pod created while the driver
pod is away never starts without its NICs: it waits, and starts with them once the driver is
back.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import KubectlError, PodView, pod_view
from devcluster.demo.allocation import ALIGNED
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    delete_pod,
    events_for,
    get_pod,
    nic_snapshot,
    pod_claim,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS
NUMA0 = slice(0, 4)


@pytest.fixture
def ns(seed_ns: str) -> str:
    return seed_ns


def _node_ready(real_node: RealNode) -> bool:
    node = real_node.kube.read_node(real_node.node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _kill_driver(real_node: RealNode) -> None:
    real_node.kill_driver()


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def _restart_runtime(real_node: RealNode) -> None:
    """Restart the node's runtime and wait until its socket answers and the node is Ready (the
    kubelet may still reach the runtime a moment later: see :func:`_pod_view`)."""
    path = real_node.spec().host_path(real_node.spec().cri_socket)
    cluster.restart(real_node.layout, real_node.layout.runtime)
    wait_for(lambda: path.is_socket() and _answers(path), 60, 0.1, "the runtime's socket")
    wait_for(lambda: _node_ready(real_node), 60, 0.5, "node Ready")


def _pod_view(real_node: RealNode, ns: str, pod: str) -> PodView:
    """What the pod sees, once ``kubectl exec`` reaches it: after a runtime restart the kubelet's
    connection to the runtime comes back a moment after the runtime does (CRI-O re-creates its
    socket once it is up)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return pod_view(real_node.kubectl, ns, pod)
        except KubectlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


FAULTS = {
    "kubelet-restart": lambda n: (
        cluster.restart(n.layout, "kubelet"),
        time.sleep(2),
        wait_for(lambda: _node_ready(n), 60, 0.5, "node Ready"),
    ),
    # The node's container runtime: containerd, or CRI-O on a CRI-O node.
    "runtime-restart": lambda n: _restart_runtime(n),
    "driver-kill-9": _kill_driver,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_with_a_pod_holding_nics(real_node: RealNode, ns: str, fault: str) -> None:
    nics = list(real_node.layout.nics[NUMA0])
    before = nic_snapshot(real_node, nics)
    pod = f"fault-{fault}"
    start_pod(real_node, ns, pod, ALIGNED)
    wait_running(real_node, ns, pod)
    uid = pod_claim(real_node, ns, pod)["metadata"]["uid"]
    FAULTS[fault](real_node)
    # The driver is (back) serving, and the pod still has its 4 NICs.
    real_node.wait_driver_ready()
    wait_running(real_node, ns, pod)
    view = _pod_view(real_node, ns, pod)
    assert set(nics) <= set(view.interfaces), sorted(view.interfaces)
    assert not set(nics) & set(real_node.host_nics())
    delete_pod(real_node, ns, pod)
    wait_nics_home(real_node, before)
    wait_for(lambda: uid not in real_node.checkpoint().get("claims", {}), 30, 0.2, "claim unprepared")
    assert not real_node.pod_states().get("pods")


def test_pod_started_while_the_driver_is_down_waits_for_it(real_node: RealNode, ns: str) -> None:
    nics = list(real_node.layout.nics[NUMA0])
    before = nic_snapshot(real_node, nics)
    ds_path = f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}"
    away = {"spec": {"template": {"spec": {"nodeSelector": {"dranet.dev/nowhere": "true"}}}}}
    real_node.kube.request("PATCH", ds_path, away, content_type="application/strategic-merge-patch+json")
    pod = "while-driver-down"
    try:
        wait_for(lambda: not real_node.driver_pids(), 60, 0.2, "the driver pod gone")
        start_pod(real_node, ns, pod, ALIGNED)
        # Allocated (the driver's slices outlive it for 30 s), but never running without NICs.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            p = get_pod(real_node, ns, pod)
            assert p["status"].get("phase") != "Running", "the pod started without its driver"
            time.sleep(0.5)
        assert set(nics) <= set(real_node.host_nics()), "no NIC may move while the driver is down"
        events = events_for(real_node, ns, pod)
        assert any("dra.net" in e for e in events), events  # the kubelet says what it waits for
    finally:
        back = {"spec": {"template": {"spec": {"nodeSelector": {"dranet.dev/nowhere": None}}}}}  # only that key
        real_node.kube.request("PATCH", ds_path, back, content_type="application/strategic-merge-patch+json")
    real_node.wait_driver_ready()
    try:
        wait_running(real_node, ns, pod, timeout=120)
        view = pod_view(real_node.kubectl, ns, pod)
        assert set(nics) <= set(view.interfaces)
    finally:
        delete_pod(real_node, ns, pod)
    wait_nics_home(real_node, before)
