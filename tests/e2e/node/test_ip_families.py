"""The real-node suites on an IPv6-only and on a dual-stack cluster (``devcluster up --ip-family``):
node, pod and service networks, the rails and the cluster DNS of those families, the chart as it is.

Collected here a second time, against each cluster of this module: every node Ready with the driver
and its own NICs; two pods on two nodes talking over the NICs their claims got (the claim's addresses,
and the rail's own, one per family); the training example's pods with their NICs, RDMA devices and
GPUs; the seed's MPIJobs to ``MFU_RESULT`` over exactly the claimed NICs; eight pods sharing ib0, each
with an address from the node's pool (of the cluster's primary family). Then what only these
clusters show: an address of every family on every node and pod, the cluster DNS answering AAAA for
pods and Services, the driver's health port on the node's IPv6 address, and the webhook, reached
by the apiserver at its pod's IPv6 address, refusing a bad claim.

``DRANET_E2E_IPV6_CLUSTER=<name>`` / ``DRANET_E2E_DUAL_CLUSTER=<name>`` test a running cluster of
that name instead (``python -m devcluster up --ip-family ipv6|dual --name <name>``), left running.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.request
from collections.abc import Iterator

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import workload_pod
from driver.kube.client import RESOURCE_API
from driver.kube.errors import KubeError
from tests.e2e.node.realnode import E2E_MARKS, RealNode, cluster_for_tests, random_layout
from tests.e2e.node.support import delete_pod, nic_claim, wait_running

# Collected here too, so they run against this module's clusters (fixtures resolve per module).
from tests.e2e.node.test_cluster_nodes import (  # noqa: F401
    test_every_node_ready_with_the_driver_and_its_own_nics,
    test_pods_on_two_nodes_ping_each_other_over_their_claimed_nics,
)
from tests.e2e.node.test_mpi_operator import test_seed_mpijob_runs_to_the_end_over_its_claimed_nics  # noqa: F401
from tests.e2e.node.test_seed_pods import test_seed_pod_runs_with_its_nics  # noqa: F401
from tests.e2e.node.test_sharing import (  # noqa: F401
    sharing,
    test_eight_pods_share_ib0_by_bandwidth_each_with_its_own_sub_interface,
)

pytestmark = E2E_MARKS
REUSE_ENV = {"ipv6": "DRANET_E2E_IPV6_CLUSTER", "dual": "DRANET_E2E_DUAL_CLUSTER"}


@pytest.fixture(scope="module", params=["ipv6", "dual"])
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """Two real nodes whose networks are IPv6 only, or IPv4 and IPv6 (one cluster after the other)."""
    family = request.param
    reuse = os.environ.get(REUSE_ENV[family])
    with cluster_for_tests(request, lambda: random_layout(ip_family=family), reuse) as node:
        assert node.layout.ip_family == family, f"{REUSE_ENV[family]}: {node.layout.name} is {node.layout.ip_family}"
        yield node


def _versions(addresses: list[str]) -> list[int]:
    return [ipaddress.ip_address(a).version for a in addresses]


def test_every_node_and_pod_has_an_address_of_every_family(real_node: RealNode, ns: str) -> None:
    layout = real_node.layout
    for spec in layout.all_nodes:
        node = real_node.kube.read_node(spec.name)
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal == spec.ips, (spec.name, internal)
    pod = workload_pod("families", layout.node_name, namespace=ns)
    real_node.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    running = wait_running(real_node, ns, "families")
    ips = [p["ip"] for p in running["status"]["podIPs"]]
    assert _versions(ips) == list(layout.versions), ips
    for ip, subnet in zip(ips, layout.node(0).pod_subnets, strict=True):
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(subnet), (ip, subnet)
    eth0 = real_node.kubectl.exec(ns, "families", "ip", "-o", "addr", "show", "dev", "eth0")
    assert all(f" {ip}/" in eth0 for ip in ips), eth0
    delete_pod(real_node, ns, "families")


def test_the_cluster_dns_answers_for_pods_and_services_in_every_family(real_node: RealNode, ns: str) -> None:
    """A headless Service's name gives its pod's address of each family (AAAA on IPv6), and the
    ``kubernetes`` Service's its ClusterIP from the primary family's range."""
    layout = real_node.layout
    pod = workload_pod("named", layout.node_name, namespace=ns, labels={"app": "named"})
    real_node.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "named", "namespace": ns},
        "spec": {
            "clusterIP": "None",
            "selector": {"app": "named"},
            "ports": [{"port": 22}],
            "ipFamilyPolicy": "RequireDualStack" if layout.ip_family == "dual" else "SingleStack",
        },
    }
    real_node.kube.request("POST", f"/api/v1/namespaces/{ns}/services", svc)
    running = wait_running(real_node, ns, "named")
    ips = {ipaddress.ip_address(p["ip"]).version: p["ip"] for p in running["status"]["podIPs"]}
    name = f"named.{ns}.svc.cluster.local"
    for version, ip in ips.items():
        kind = "AAAA" if version == 6 else "A"

        def answered(kind: str = kind, ip: str = ip) -> bool:
            out = real_node.kubectl.exec(ns, "named", "nslookup", f"-type={kind}", name)
            return f"Address: {ip}" in out

        wait_for(answered, 60, 1, f"{kind} {name} -> {ip}")
    api = real_node.kube.request("GET", "/api/v1/namespaces/default/services/kubernetes")
    cluster_ip = api["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip).version == layout.versions[0], cluster_ip
    kind = "AAAA" if layout.versions[0] == 6 else "A"
    out = real_node.kubectl.exec(ns, "named", "nslookup", f"-type={kind}", "kubernetes.default.svc.cluster.local")
    assert f"Address: {cluster_ip}" in out, out
    delete_pod(real_node, ns, "named")


def test_the_drivers_health_port_answers_on_every_node_address(real_node: RealNode) -> None:
    """The probe/metrics server (hostNetwork) listens on IPv4 and IPv6: the node's addresses of
    every family reach it (from the control plane, over the cluster network)."""
    args = real_node.driver_pod()["spec"]["containers"][0]["args"]
    port = int(next(a for a in args if a.startswith("--bind-address=")).rsplit(":", 1)[1])  # the chart's metricsPort
    for spec in real_node.layout.all_nodes:
        for ip in spec.ips:
            host = f"[{ip}]" if ":" in ip else ip
            with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=5) as r:
                assert r.status == 200, (spec.name, ip)


def test_the_webhook_refuses_a_bad_claim_over_the_pod_network(real_node: RealNode, ns: str) -> None:
    """The apiserver calls the webhook at its pod's address (the primary family's): a claim whose
    config cannot work is refused, naming the field."""
    bad = nic_claim(ns, "bad", real_node.layout.nics[0], ["fd00::1/129"])
    with pytest.raises(KubeError) as info:
        real_node.kube.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", bad)
    assert "interface.addresses" in str(info.value) and "fd00::1/129" in str(info.value), info.value
    webhook = real_node.kube.request(
        "GET",
        f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
        query={"labelSelector": "app.kubernetes.io/component=webhook"},
    )["items"]
    assert webhook and ipaddress.ip_address(webhook[0]["status"]["podIP"]).version == real_node.layout.versions[0]
