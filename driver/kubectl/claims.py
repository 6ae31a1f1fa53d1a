"""``kubectl dranet claim NAME`` and ``pod NAME``: what a pod got, from its claims' status.

The scheduler's allocation says which devices; this driver's entries in ``status.devices`` say
what the pod has (interface name, addresses, MAC, ``Ready``, ``NUMAAligned``); the devices'
ResourceSlices add the RDMA device, PCI address and NUMA node. Before the driver has reported
(the pod not started yet), the NUMA verdict is computed here the way the driver computes it,
and said to be.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from driver.claims.numa_report import CONDITION_TYPE, DeviceNuma, numa_condition
from driver.config import DRIVER_NAME
from driver.kube.client import KubeClient
from driver.kube.errors import NotFound
from driver.kubectl.cluster import SliceDevice

READY = "Ready"


class NotAllocated(Exception):
    """The claim exists but has no allocation yet (the message says why, if the pod tells)."""


@dataclass
class ClaimDevice:
    """One allocated device and what the pod has of it."""

    request: str
    driver: str
    pool: str
    device: str
    numaNode: int | None = None  # noqa: N815 - JSON output names follow the API's camelCase
    pciBusID: str | None = None  # noqa: N815
    rdmaDevice: str | None = None  # noqa: N815
    interfaceName: str | None = None  # noqa: N815
    ips: list[str] = field(default_factory=list)
    hardwareAddress: str | None = None  # noqa: N815
    ready: str | None = None  # the driver's Ready condition: True, False, or None (not reported)
    readyMessage: str | None = None  # noqa: N815


@dataclass
class ClaimView:
    """A claim, where it was allocated, its devices and whether they share a NUMA node."""

    namespace: str
    name: str
    node: str | None
    reservedFor: list[str]  # noqa: N815
    devices: list[ClaimDevice]
    numaAligned: dict[str, str]  # noqa: N815 - status, reason, message, source (driver | computed)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _allocated_node(allocation: dict[str, Any]) -> str | None:
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for match in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            if match.get("key") in ("metadata.name", "kubernetes.io/hostname") and match.get("values"):
                return str(match["values"][0])
    return None


def claim_view(claim: dict[str, Any], slices: list[SliceDevice], driver_name: str = DRIVER_NAME) -> ClaimView:
    """The view of one claim object (``NotAllocated`` when the scheduler has not allocated it)."""
    meta, status = claim.get("metadata") or {}, claim.get("status") or {}
    allocation = status.get("allocation")
    if not allocation:
        raise NotAllocated(f"resourceclaim {meta.get('namespace')}/{meta.get('name')} is not allocated yet")
    by_key = {(d.driver, d.pool, d.name): d for d in slices}
    reported = {
        (e.get("driver"), e.get("pool"), e.get("device")): e
        for e in status.get("devices") or []
        if e.get("driver") == driver_name
    }
    devices, driver_numa = [], None
    for r in (allocation.get("devices") or {}).get("results") or []:
        key = (str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
        dev = ClaimDevice(str(r.get("request")), *key)
        published = by_key.get(key)
        if published is not None:
            dev.numaNode, dev.pciBusID = published.numa_node, published.pci_bus_id
            rdma = published.attr("rdmaDevice")
            dev.rdmaDevice = rdma if isinstance(rdma, str) else None
        entry = reported.get(key) or {}
        data = entry.get("networkData") or {}
        dev.interfaceName, dev.ips, dev.hardwareAddress = (
            data.get("interfaceName"),
            data.get("ips") or [],
            data.get("hardwareAddress"),
        )
        for cond in entry.get("conditions") or []:
            if cond.get("type") == READY:
                dev.ready, dev.readyMessage = cond.get("status"), cond.get("message")
            elif cond.get("type") == CONDITION_TYPE:
                driver_numa = {k: str(cond.get(k, "")) for k in ("status", "reason", "message")} | {"source": "driver"}
        devices.append(dev)
    return ClaimView(
        namespace=str(meta.get("namespace")),
        name=str(meta.get("name")),
        node=_allocated_node(allocation) or next((d.pool for d in devices if d.driver == driver_name), None),
        reservedFor=[f"{r.get('resource')}/{r.get('name')}" for r in status.get("reservedFor") or []],
        devices=devices,
        numaAligned=driver_numa or _computed_numa(devices, driver_name),
    )


def _computed_numa(devices: list[ClaimDevice], driver_name: str) -> dict[str, str]:
    """The driver's NUMAAligned verdict, from the slices' NUMA nodes (the driver has not reported)."""

    def numa(d: ClaimDevice) -> DeviceNuma:
        source = "ResourceSlice" if d.numaNode is not None else "unknown: no NUMA node in its ResourceSlice"
        return DeviceNuma(d.driver, d.pool, d.device, d.numaNode, source)

    nics = [numa(d) for d in devices if d.driver == driver_name]
    others = [numa(d) for d in devices if d.driver != driver_name]
    condition = numa_condition(nics, others)
    return {k: condition[k] for k in ("status", "reason", "message")} | {"source": "computed"}


def read_claim(kube: KubeClient, namespace: str, name: str, slices: list[SliceDevice], driver_name: str) -> ClaimView:
    """GET the claim and build its view."""
    return claim_view(kube.read_namespaced_resource_claim(namespace, name), slices, driver_name)


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """The names of the ResourceClaims a pod uses (direct, or generated from a template)."""
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if name:
            names.append(str(name))
    return names


def read_pod(
    kube: KubeClient, namespace: str, name: str, slices: list[SliceDevice], driver_name: str
) -> tuple[dict[str, Any], list[ClaimView], list[str]]:
    """The pod, the views of its allocated claims, and why others have none (pending, not generated)."""
    pod = kube.read_namespaced_pod(namespace, name)
    views, pending = [], []
    entries = (pod.get("spec") or {}).get("resourceClaims") or []
    names = pod_claim_names(pod)
    if len(names) < len(entries):
        pending.append(f"{len(entries) - len(names)} claim(s) of the pod not created yet (the template's claim)")
    for claim in names:
        try:
            views.append(read_claim(kube, namespace, claim, slices, driver_name))
        except NotAllocated as exc:
            pending.append(str(exc))
        except NotFound:
            pending.append(f"resourceclaim {namespace}/{claim} not found")
    return pod, views, pending
