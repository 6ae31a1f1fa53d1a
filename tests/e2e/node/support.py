"""Helpers of the real-node tests: the training example's templates, pods, claims, host NIC snapshots."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from devcluster.cluster.controlplane import create_objects, load_yaml_docs, wait_for
from devcluster.cluster.pods import workload_pod
from devcluster.demo.allocation import EXAMPLE_DIR
from driver.kube.client import RESOURCE_API
from driver.kube.errors import KubeError, NotFound
from tests.e2e.node.realnode import RealNode


@contextlib.contextmanager
def seed_namespace(node: RealNode) -> Iterator[str]:
    """A fresh namespace with the training example's two ResourceClaimTemplates; deleted (pods, claims) after."""
    name = node.namespace()
    apply_seed_templates(node, name)
    try:
        yield name
    finally:
        node.delete_namespace(name)


def apply_seed_templates(node: RealNode, ns: str) -> None:
    """The training example's two ResourceClaimTemplates, unchanged, in namespace ``ns``."""
    docs = load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml")
    for d in docs:
        d["metadata"]["namespace"] = ns
    create_objects(node.kube, docs, ns)


def start_pod(
    node: RealNode, ns: str, name: str, template: str | None = None, claim: str | None = None
) -> dict[str, Any]:
    """Create a workload pod (unscheduled; the scheduler allocates its claim)."""
    return node.kube.request(
        "POST", f"/api/v1/namespaces/{ns}/pods", workload_pod(name, node.node, template, claim=claim, namespace=ns)
    )


def get_pod(node: RealNode, ns: str, name: str) -> dict[str, Any]:
    return node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")


def wait_running(node: RealNode, ns: str, name: str, timeout: float = 90) -> dict[str, Any]:
    """Wait until the pod is Ready; fail early with its events if it cannot start."""

    def ready() -> dict[str, Any] | None:
        pod = get_pod(node, ns, name)
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return pod if conds.get("Ready") == "True" else None

    try:
        return wait_for(ready, timeout, 0.2, f"pod {ns}/{name} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; events: {events_for(node, ns, name)}") from None


def pod_claim(node: RealNode, ns: str, pod: str) -> dict[str, Any]:
    """The pod's generated (or referenced) ResourceClaim."""
    p = get_pod(node, ns, pod)
    ref = p["spec"]["resourceClaims"][0]
    name = ref.get("resourceClaimName") or next(s["resourceClaimName"] for s in p["status"]["resourceClaimStatuses"])
    return node.kube.read_namespaced_resource_claim(ns, name)


def delete_pod(node: RealNode, ns: str, name: str, timeout: float = 60) -> None:
    """Delete the pod and wait until the kubelet has removed it."""
    try:
        node.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    except KubeError as exc:
        if isinstance(exc, NotFound):
            return
        raise

    def gone() -> bool:
        try:
            get_pod(node, ns, name)
        except KubeError as exc:
            return isinstance(exc, NotFound)
        return False

    wait_for(gone, timeout, 0.2, f"pod {ns}/{name} deleted")


def dra_conditions(claim: dict[str, Any], driver: str = "dra.net") -> dict[str, dict[str, dict[str, Any]]]:
    """device -> condition type -> condition, for ``driver``'s entries in status.devices."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for d in (claim.get("status") or {}).get("devices") or []:
        if d["driver"] == driver:
            out[d["device"]] = {c["type"]: c for c in d.get("conditions") or []}
    return out


def events_for(node: RealNode, ns: str, name: str) -> list[str]:
    """``reason: message`` of every event about object ``name`` in ``ns``."""
    items = node.kube.request(
        "GET", f"/api/v1/namespaces/{ns}/events", query={"fieldSelector": f"involvedObject.name={name}"}
    )["items"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in items]


def nic_snapshot(node: RealNode, nics: list[str] | None = None, index: int = 0) -> dict[str, dict[str, Any]]:
    """name -> (mtu, mac, state, addresses, routes) of node ``index``'s NICs in its own namespace."""
    facts = node.host_nics(index)
    netns = node.spec(index).netns
    out = {}
    for name in nics or list(node.layout.nics):
        if name not in facts:
            continue
        link = facts[name]
        routes = json.loads(
            subprocess.run(
                ["ip", "-n", netns, "-j", "route", "show", "table", "all", "dev", name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        out[name] = {
            "mtu": link["mtu"],
            "mac": link["address"],
            "up": "UP" in link["flags"],
            "addresses": sorted(
                f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") != "link"
            ),
            "routes": sorted(
                json.dumps({k: r.get(k) for k in ("dst", "gateway", "table", "metric")}, sort_keys=True)
                for r in routes
                if r.get("protocol") != "kernel" and r.get("type", "unicast") == "unicast"
            ),
        }
    return out


def wait_nics_home(node: RealNode, expected: dict[str, dict[str, Any]], timeout: float = 30, index: int = 0) -> None:
    """Wait until every NIC in ``expected`` is back in node ``index``'s namespace exactly as recorded."""
    deadline = time.monotonic() + timeout
    now: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        now = nic_snapshot(node, list(expected), index)
        if now == expected:
            return
        time.sleep(0.2)
    diff = {n: (expected[n], now.get(n, "absent")) for n in expected if now.get(n) != expected[n]}
    raise AssertionError(f"NICs not back intact after {timeout}s (expected, now): {diff}")


def host_ip(node: RealNode, *args: str, index: int = 0) -> None:
    """``ip <args>`` in node ``index``'s own network namespace (where its NICs live), checked."""
    subprocess.run(["ip", "-n", node.spec(index).netns, *args], check=True, capture_output=True, text=True)


NUMA1_RDMA = 'device.attributes["dra.net"]["rdma"] == true && device.attributes["dra.net"]["numaNode"] == 1'
"""CEL: an RDMA NIC on NUMA node 1 (the training example's aligned template holds NUMA 0's four)."""


def nic_template(ns: str, name: str, expression: str, count: int = 1) -> dict[str, Any]:
    """A ResourceClaimTemplate: ``count`` dra.net NICs selected by the CEL ``expression``, no GPU."""
    request = {"deviceClassName": "dranet.net", "count": count, "selectors": [{"cel": {"expression": expression}}]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}}},
    }


def claim_config_template(
    ns: str, name: str, nic_name: str, params: dict[str, Any], host_nic_expr: str
) -> dict[str, Any]:
    """A ResourceClaimTemplate: one dra.net NIC selected by CEL, with an opaque config."""
    tmpl = nic_template(ns, name, host_nic_expr)
    config = [{"requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": params}}]
    tmpl["spec"]["spec"]["devices"]["config"] = config
    return tmpl


def create_template(node: RealNode, tmpl: dict[str, Any]) -> None:
    ns = tmpl["metadata"]["namespace"]
    node.kube.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaimtemplates", tmpl)


def nic_claim(ns: str, name: str, nic: str, addresses: list[str] | None) -> dict[str, Any]:
    """A ResourceClaim for the NIC named ``nic`` (on whichever node), with static ``addresses``
    (``None``: no config, the NIC keeps its host addresses)."""
    selector = f'device.attributes["dra.net"]["ifName"] == "{nic}"'
    exactly = {"deviceClassName": "dranet.net", "selectors": [{"cel": {"expression": selector}}]}
    devices: dict[str, Any] = {"requests": [{"name": "nic", "exactly": exactly}]}
    if addresses is not None:
        params = {"apiVersion": "dra.net/v1alpha1", "kind": "NetworkConfig", "interface": {"addresses": addresses}}
        devices["config"] = [{"requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": params}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": devices},
    }


def spread_pod(ns: str, name: str, claim: str, group: str) -> dict[str, Any]:
    """A workload pod with ``claim``, kept off any node another pod of ``group`` runs on."""
    pod = workload_pod(name, "-", claim=claim, namespace=ns, labels={"pair": group})
    del pod["spec"]["nodeSelector"]
    # ping needs a raw socket: containerd grants NET_RAW by default, CRI-O does not.
    pod["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": ["NET_RAW"]}}
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"pair": group}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    return pod
