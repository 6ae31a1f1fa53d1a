"""Rebuilding the prepared claims from the API server after the checkpoint was found corrupt.

The kubelet prepares a claim once and remembers it; it does not ask again after a driver
restart. A driver that lost ``checkpoint.json`` would therefore not know the claims of running
pods: their NICs would not move at the next RunPodSandbox, nor come back. So when the store had
to move a damaged checkpoint aside, the daemon lists the ResourceClaims, keeps those allocated
with our driver's devices in this node's pool and reserved for a pod, and records them exactly
as NodePrepareResources would (:meth:`~driver.claims.claim_build.ClaimBuilder.build`).

Device snapshots come from the current scan; a device whose netdev sits in a pod's namespace
(so the scan does not see its netdev) is completed from what this node last published for it
(interface name, MAC, PCI address, RDMA device), since discovery publishes the snapshot
attributes of allocated devices.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from driver.checkpoint.state import DriverState, PreparedClaim
from driver.claims.claim_build import ClaimError
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError
from driver.model.device import ATTRIBUTE_DOMAIN, STANDARD_DOMAIN, Device, HostFacts, attribute_from_api

log = logging.getLogger(__name__)

LIST_PAGE = 500
"""ResourceClaims per LIST page."""


@dataclass
class RecoveryReport:
    """What a rebuild found: claims recorded, claims that could not be, and why."""

    rebuilt: list[str] = field(default_factory=list)  # "namespace/name"
    failed: dict[str, str] = field(default_factory=dict)  # "namespace/name" -> reason
    api_error: str | None = None  # the API server could not be asked: nothing was rebuilt


def allocated_here(claim: dict[str, Any], driver: str, node: str) -> bool:
    """Whether ``claim`` has a device of ``driver`` in ``node``'s pool and is reserved for a pod."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    ours = any(isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == node for r in results)
    pods = [r for r in status.get("reservedFor") or [] if isinstance(r, dict) and r.get("resource") == "pods"]
    return ours and bool(pods)


def host_facts_from_attributes(attributes: dict[str, Any]) -> HostFacts:
    """The host facts a published device's attributes still tell (no char devices, no permanent MAC)."""

    def text(name: str) -> str | None:
        value = attributes.get(f"{ATTRIBUTE_DOMAIN}/{name}")
        return value if isinstance(value, str) and value else None

    numa = attributes.get(f"{ATTRIBUTE_DOMAIN}/numaNode", attributes.get(f"{STANDARD_DOMAIN}/numaNode"))
    return HostFacts(
        pci_address=text("pciAddress"),
        ifname=text("ifName"),
        permanent_mac=text("mac"),
        rdma_device=text("rdmaDevice"),
        numa_node=numa if isinstance(numa, int) and not isinstance(numa, bool) else None,
        virtual=attributes.get(f"{ATTRIBUTE_DOMAIN}/virtual") is True,
    )


def complete_inventory(live: dict[str, Device], published: dict[str, Device]) -> dict[str, Device]:
    """The live inventory, with host facts the scan lacks (a netdev in a pod) taken from ``published``."""
    out = dict(live)
    for name, last in published.items():
        current = out.get(name)
        if current is None:
            out[name] = last
            continue
        host = replace(current.host)
        for fname in ("pci_address", "ifname", "permanent_mac", "rdma_device", "numa_node"):
            if getattr(host, fname) is None:
                setattr(host, fname, getattr(last.host, fname))
        out[name] = Device(name, {**last.attributes, **current.attributes}, host)
    return out


def _published_devices(kube: KubeClient, driver: str, node: str) -> dict[str, Device]:
    listing = kube.list_resource_slice(f"spec.nodeName={node},spec.driver={driver}")
    out: dict[str, Device] = {}
    for item in listing.get("items") or []:
        for entry in (item.get("spec") or {}).get("devices") or []:
            try:
                attributes = {k: attribute_from_api(v) for k, v in (entry.get("attributes") or {}).items()}
            except (ValueError, AttributeError, TypeError):
                continue  # not ours to judge: the scan's own device (if any) stays as it is
            out[entry["name"]] = Device(entry["name"], attributes, host_facts_from_attributes(attributes))
    return out


def _claims_here(kube: KubeClient, driver: str, node: str) -> list[dict[str, Any]]:
    claims: list[dict[str, Any]] = []
    cont: str | None = None
    while True:
        page = kube.list_resource_claim_for_all_namespaces(limit=LIST_PAGE, cont=cont)
        claims.extend(c for c in page.get("items") or [] if allocated_here(c, driver, node))
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return claims


async def rebuild_prepared_claims(preparer: Preparer, kube: KubeClient) -> RecoveryReport:
    """Record every claim allocated to this node that the checkpoint does not hold (see module doc).

    API errors are logged and leave the rebuild partial (never fatal): the driver still serves,
    and the kubelet's next prepare of a claim records it as usual.
    """
    builder = preparer.builder
    driver, node = builder.driver_name, builder.node_name
    report = RecoveryReport()
    try:
        claims = await asyncio.to_thread(_claims_here, kube, driver, node)
        published = await asyncio.to_thread(_published_devices, kube, driver, node)
    except (KubeError, OSError, ValueError) as exc:
        log.error(
            "cannot rebuild prepared claims from the API server (needs list on resourceclaims, see docs/rbac.md)",
            extra={"kv": {"error": str(exc)}},
        )
        report.api_error = str(exc)
        return report
    inventory = complete_inventory(builder.devices(), published)
    records: list[PreparedClaim] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        ref = ClaimRef(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""))
        where = f"{ref.namespace}/{ref.name}"
        try:
            records.append(builder.build(ref, claim, inventory))
        except ClaimError as exc:
            report.failed[where] = str(exc)
    if records:

        def record(state: DriverState) -> None:
            for r in records:
                state.claims.setdefault(r.uid, r)

        await asyncio.to_thread(preparer.store.update, record)
        report.rebuilt = [f"{r.namespace}/{r.name}" for r in records]
    log.log(
        logging.WARNING if report.rebuilt or report.failed else logging.INFO,
        "rebuilt prepared claims from the API server",
        extra={"kv": {"rebuilt": report.rebuilt, "failed": report.failed}},
    )
    return report
