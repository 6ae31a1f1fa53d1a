"""A running pod's device metadata file and CDI spec, deleted or damaged on the real node: each
container that restarts afterwards starts again and reads the same document, generation and pod
view (``networkData``) included, with the driver running and after a driver restart.

The pod is the training example's aligned template (4 NICs, 4 GPUs) with several containers that
mount the claim, so each restart is a container's first (the kubelet's back-off starts at the
second). A container restarts when its shell gets SIGTERM (the workload traps it and exits); the
runtime then resolves the claim's CDI devices (the spec's bind mount of the metadata file) and
calls the driver's NRI CreateContainer. The driver restart keeps the driver away (its DaemonSet
sent to no node) while the files are damaged, so the restarted driver is the one that mends them.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import KubectlError, workload_pod
from devcluster.demo.allocation import ALIGNED
from driver.claims.metadata_document import decode_first
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import delete_pod, events_for, get_pod, pod_claim, seed_namespace, wait_running
from tests.support.damage import empty, half, zero

pytestmark = E2E_MARKS

POD = "owned-files"
CONTAINERS = 7  # one that reads the file as it was, one per restart
IN_CONTAINER = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/devices/nic/dra.net-metadata.json"
RESTART_TIMEOUT = 60.0
"""Seconds a restarted container may take to run again: a failed first try (a CDI spec still broken)
is tried again after the kubelet's 10 s back-off."""
DS_PATH = f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}"


@pytest.fixture(scope="module")
def seed_ns(real_node: RealNode) -> Iterator[str]:
    with seed_namespace(real_node) as ns:
        yield ns


def _pod(real_node: RealNode, ns: str) -> dict[str, Any]:
    pod = workload_pod(POD, real_node.node, ALIGNED, namespace=ns)
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**copy.deepcopy(first), "name": f"c{i}"} for i in range(CONTAINERS)]
    return pod


def _status(real_node: RealNode, ns: str, container: str) -> dict[str, Any]:
    statuses = get_pod(real_node, ns, POD)["status"].get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == container)


def _read(real_node: RealNode, ns: str, container: str) -> str:
    return real_node.kubectl.run("exec", "-n", ns, POD, "-c", container, "--", "cat", IN_CONTAINER, timeout=30)


def _restart(real_node: RealNode, ns: str, container: str) -> str:
    """Restart ``container`` (its shell exits on SIGTERM), wait until it runs again; what it reads."""
    before = _status(real_node, ns, container)["restartCount"]
    try:
        real_node.kubectl.run("exec", "-n", ns, POD, "-c", container, "--", "kill", "1", timeout=30)
    except KubectlError:  # the session may end with the container it runs in
        pass

    def running() -> bool:
        s = _status(real_node, ns, container)
        return s["restartCount"] > before and s.get("ready") is True and "running" in (s.get("state") or {})

    try:
        wait_for(running, RESTART_TIMEOUT, 0.5, f"container {container} running again")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {_status(real_node, ns, container)}; {events_for(real_node, ns, POD)}") from None
    return _read(real_node, ns, container)


def _driver_away(real_node: RealNode, away: bool) -> None:
    """The DaemonSet sent to no node (its pod stops), or back."""
    selector = {"dranet.dev/nowhere": "true" if away else None}  # None: only that key goes
    patch = {"spec": {"template": {"spec": {"nodeSelector": selector}}}}
    real_node.kube.request("PATCH", DS_PATH, patch, content_type="application/strategic-merge-patch+json")


@pytest.mark.timeout(600)
def test_a_restarted_container_reads_the_same_document(real_node: RealNode, seed_ns: str) -> None:
    t0 = time.monotonic()
    real_node.kube.request("POST", f"/api/v1/namespaces/{seed_ns}/pods", _pod(real_node, seed_ns))
    try:
        wait_running(real_node, seed_ns, POD, timeout=120)
        claim = pod_claim(real_node, seed_ns, POD)
        name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
        meta = real_node.spec(0).driver_runtime_dir / "dra-device-metadata" / f"{seed_ns}_{name}" / "nic/metadata.json"
        spec = real_node.spec(0).cdi_dir / f"dra.net_metadata_{uid}_nic.json"
        host_meta, host_spec = meta.read_bytes(), spec.read_bytes()
        read = _read(real_node, seed_ns, "c0")
        doc = decode_first(read.encode())
        assert doc["metadata"]["uid"] == uid and doc["metadata"]["generation"] >= 2, doc["metadata"]
        devices = doc["requests"][0]["devices"]
        assert len(devices) == 4 and all(d["networkData"]["interfaceName"] for d in devices), devices
        containers = iter(f"c{i}" for i in range(1, CONTAINERS))

        # The driver running: the metadata file is mended at CreateContainer, a CDI spec (which
        # the runtime resolves before that hook) by the driver's background check.
        for what, spoil, path in [
            ("metadata deleted", Path.unlink, meta),
            ("metadata emptied", empty, meta),
            ("metadata zeroed", zero, meta),
            ("CDI spec half-written", half, spec),
        ]:
            spoil(path)
            assert _restart(real_node, seed_ns, next(containers)) == read, f"{what}: another document"
        assert meta.read_bytes() == host_meta and spec.read_bytes() == host_spec
        running = time.monotonic() - t0

        # A driver restart, the files damaged while no driver runs: the restarted one writes them
        # again from its state (the pod's view included) before it serves.
        _driver_away(real_node, True)
        try:
            wait_for(lambda: not real_node.driver_pids(), 60, 0.2, "the driver gone")
            meta.unlink()
            half(spec)
        finally:
            _driver_away(real_node, False)
        real_node.wait_driver_ready()
        assert meta.read_bytes() == host_meta and spec.read_bytes() == host_spec
        assert _restart(real_node, seed_ns, next(containers)) == read, "after a driver restart: another document"

        real_node.kill_driver(lambda: (zero(meta), empty(spec)))
        assert _restart(real_node, seed_ns, next(containers)) == read, "after kill -9: another document"
        assert meta.read_bytes() == host_meta and spec.read_bytes() == host_spec

        logs = real_node.driver_logs()
        assert "owned file written again" in logs
        events = real_node.kube.request(
            "GET",
            "/api/v1/namespaces/default/events",
            query={"fieldSelector": "involvedObject.kind=Node,reason=DranetFilesMended"},
        )["items"]
        assert events, "no DranetFilesMended event on the Node"
        print(
            f"\n[owned files] 7 damages mended, each container read the same document: {running:.1f}s with "
            f"the driver running, {time.monotonic() - t0:.1f}s in all"
        )
    finally:
        delete_pod(real_node, seed_ns, POD, timeout=120)
