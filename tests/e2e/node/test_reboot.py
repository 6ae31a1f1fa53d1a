"""A node reboot with a pod holding 4 NICs: the pod comes back with them.

The reboot is the dev cluster's power cut and power-on (`devcluster.cluster.node_daemons`): every
process of the node killed at once, its namespaces gone (the NICs in the pod with them, made again
at power-on as the boot's NICs) and its ``/run`` wiped, so the driver's claims
(``/run/dranet/claims``), pod state and metadata files and the CDI specs are gone; its disks stay,
with the kubelet's own checkpoint. The driver records the claim from the API server at start, and
the kubelet (1.37 prepares again after its restart) is answered from that record. The pod is
the training example's aligned template, unchanged; the same pod (same UID) restarts with the
claim's 4 NICs, its RDMA devices and its device metadata file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from devcluster.builders.binaries import K8S_RELEASE
from devcluster.builders.components import ensure_node_binaries
from devcluster.cluster import node_daemons
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from devcluster.demo.allocation import ALIGNED
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    delete_pod,
    get_pod,
    pod_claim,
    seed_namespace,
    start_pod,
    wait_running,
)

pytestmark = E2E_MARKS

METADATA = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/{claim}/nic/dra.net-metadata.json"


@pytest.fixture(scope="module")
def seed_ns(real_node: RealNode) -> Iterator[str]:
    with seed_namespace(real_node) as ns:
        yield ns


def _node_ready(real_node: RealNode) -> bool:
    node = real_node.kube.read_node(real_node.node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


@pytest.mark.timeout(900)
def test_after_a_reboot_the_pod_restarts_with_its_nics(real_node: RealNode, seed_ns: str) -> None:
    nics = [real_node.layout.nics[i] for i in range(4)]  # NUMA 0's: the aligned template's
    pod = "trainer-reboot"
    start_pod(real_node, seed_ns, pod, ALIGNED)
    try:
        first = wait_running(real_node, seed_ns, pod)
        claim = pod_claim(real_node, seed_ns, pod)
        assert set(nics) <= set(pod_view(real_node.kubectl, seed_ns, pod).interfaces)

        t0 = time.monotonic()
        problems = node_daemons.power_off(real_node.layout, 0)
        try:
            assert not problems, problems
            assert not (real_node.spec(0).driver_claims_dir / "checkpoint.json").exists()  # /run is gone
        finally:
            node_daemons.power_on(real_node.layout, 0, ensure_node_binaries(lambda _m: None), K8S_RELEASE)
        wait_for(lambda: _node_ready(real_node), 180, 1, "the node Ready again")
        real_node.wait_driver_ready(timeout=180)

        def restarted() -> bool:
            p = get_pod(real_node, seed_ns, pod)
            statuses = p["status"].get("containerStatuses") or []
            ready = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
            return ready == "True" and any(s.get("restartCount", 0) >= 1 for s in statuses)

        wait_for(restarted, 240, 1, f"pod {pod} running again after the reboot")
        back = time.monotonic() - t0
        again = get_pod(real_node, seed_ns, pod)
        assert again["metadata"]["uid"] == first["metadata"]["uid"]  # the same pod, a new sandbox
        # Recorded from the API server at the driver's start, before the kubelet asked.
        rebuilt = [ln for ln in real_node.driver_logs().splitlines() if "rebuilt prepared claims" in ln]
        assert any(f"{seed_ns}/{claim['metadata']['name']}" in ln for ln in rebuilt), rebuilt
        assert pod_claim(real_node, seed_ns, pod)["metadata"]["uid"] == claim["metadata"]["uid"]
        assert claim["metadata"]["uid"] in real_node.checkpoint().get("claims", {})
        view = pod_view(real_node.kubectl, seed_ns, pod)
        for nic in nics:
            assert nic in view.interfaces and view.interfaces[nic].state == "UP", sorted(view.interfaces)
        assert not set(nics) & set(real_node.host_nics()), "moved NICs must leave the host namespace"
        assert view.env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(4))
        # The device metadata file is in the container again (its CDI spec was on the wiped /run).
        path = METADATA.format(claim=(again["spec"]["resourceClaims"][0]["name"]))
        text = real_node.kubectl.run("exec", "-n", seed_ns, pod, "--", "cat", path)
        assert claim["metadata"]["uid"] in text and all(f'"{n}"' in text for n in nics), text[:400]
        print(f"\n[reboot] pod {pod} back with its 4 NICs {back:.1f}s after the power cut")
    finally:
        delete_pod(real_node, seed_ns, pod, timeout=120)
    # The NICs are the boot's (made again at power-on): back on the host, the claim forgotten.
    wait_for(lambda: set(nics) <= set(real_node.host_nics()), 60, 0.5, "the 4 NICs back on the host")
    wait_for(lambda: claim["metadata"]["uid"] not in real_node.checkpoint().get("claims", {}), 60, 0.5, "unprepared")
