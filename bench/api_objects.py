"""The API objects the benches create as the scheduler and a user would: ResourceClaims allocated
on a node (one request and one opaque config per NIC), Pods bound to that node, and what a node's
driver published."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from driver.kube.client import RESOURCE_API, KubeClient
from harness.kubelet_client import ClaimTuple


def create_allocated_claim(
    kube: KubeClient,
    ns: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    results: Sequence[dict[str, Any]],
    configs: Sequence[dict[str, Any]] = (),
    pod: tuple[str, str] | None = None,
) -> ClaimTuple:
    """A ResourceClaim with ``requests``, allocated to ``results`` with ``configs`` as the scheduler
    writes it, reserved for ``pod`` (name, uid) when given."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": list(requests)}},
    }
    claim = kube.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", body)
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(results)}}}
    if configs:
        status["allocation"]["devices"]["config"] = list(configs)
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod[0], "uid": pod[1]}]
    claim["status"] = status
    kube.request("PUT", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/{name}/status", claim)
    return (ns, name, claim["metadata"]["uid"])


def nic_claim(
    kube: KubeClient,
    name: str,
    node: str,
    devices: Sequence[str],
    params: Sequence[dict[str, Any]],
    pod: tuple[str, str] | None = None,
) -> ClaimTuple:
    """A claim in ``default`` of our ``devices`` on ``node``: request ``nic<i>`` for each, with
    ``params[i]`` as its opaque config."""
    return create_allocated_claim(
        kube,
        "default",
        name,
        [{"name": f"nic{i}", "exactly": {"deviceClassName": "dranet.net"}} for i in range(len(devices))],
        [{"request": f"nic{i}", "driver": "dra.net", "pool": node, "device": d} for i, d in enumerate(devices)],
        [
            {"source": "FromClaim", "requests": [f"nic{i}"], "opaque": {"driver": "dra.net", "parameters": p}}
            for i, p in enumerate(params)
        ],
        pod,
    )


def bound_pod(kube: KubeClient, node: str, name: str, claims: Sequence[str]) -> str:
    """A Pod in ``default`` bound to ``node`` using ``claims`` (so their reservations stay); its UID."""
    refs = [{"name": f"nics{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    pod = kube.request(
        "POST",
        "/api/v1/namespaces/default/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "resourceClaims": refs,
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": r["name"]} for r in refs]}}
                ],
            },
        },
    )
    return str(pod["metadata"]["uid"])


def published_devices(kube: KubeClient, node: str) -> list[dict[str, Any]]:
    """The devices the node's dra.net slices publish."""
    q = {"fieldSelector": f"spec.driver=dra.net,spec.nodeName={node}"}
    items = kube.request("GET", f"{RESOURCE_API}/resourceslices", query=q)["items"]
    return [d for s in items for d in s["spec"].get("devices") or []]


def published_ifnames(kube: KubeClient, node: str) -> set[str]:
    """The host interface names of what the node's driver published."""
    return {d.get("attributes", {}).get("dra.net/ifName", {}).get("string") for d in published_devices(kube, node)}
