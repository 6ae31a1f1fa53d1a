"""What our entries in a ResourceClaim's ``status.devices`` say: the apply body, built from one update.

Pure: :func:`status_body` turns a :class:`StatusUpdate` (the NRI hooks' :class:`DeviceResult`
per NIC, or a failure, or "unprepared") and the claim as the API server has it into the
server-side apply body :class:`~driver.claims.status.ClaimStatusWriter` sends. Entries:
``networkData`` (interface name in the pod, CIDRs, MAC) and the conditions ``Ready``,
``NUMAAligned`` and, for a NIC that went into its pod without its RDMA device, ``RDMA``
False; ``lastTransitionTime`` changes only when a condition's status does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from driver.checkpoint.state import PreparedClaim
from driver.claims.numa_report import MAX_MESSAGE

READY = "Ready"
RDMA = "RDMA"
MAX_IPS = 16  # NetworkDeviceData.ips limit
MAX_IFNAME = 256
MAX_HWADDR = 128


@dataclass
class DeviceResult:
    """How one NIC ended up in the pod (reported by the NRI hooks), for ``networkData``."""

    device: str
    interface_name: str
    ips: list[str] = field(default_factory=list)  # CIDRs
    hardware_address: str | None = None
    parent: str | None = None  # a sub-interface's NIC (its host name); None: the NIC itself
    kind: str | None = None  # a sub-interface's link kind (macvlan, ipvlan)
    no_rdma: str | None = None  # why the NIC's RDMA device is not in the pod (None: it is, or it has none)
    mtu: int | None = None  # the link's MTU in the pod, read back once set (None: not known)
    rdma_in_pod: str | None = None  # the soft RDMA device made for the NIC in the pod (None: none made)
    vfio: str | None = None  # a VF handed over on vfio-pci (no netdev): its PCI address and VFIO group


@dataclass
class StatusUpdate:
    """One status change for one claim (queued by the writer, turned into an apply body here)."""

    pod_uid: str
    claim: PreparedClaim
    ready: dict[str, DeviceResult] = field(default_factory=dict)  # device -> result
    failed_device: str | None = None
    failed_step: str = ""
    failed_message: str = ""
    failed_reason: str = ""  # the condition's and the event's reason; "" derives it from the step
    clear: bool = False  # drop all our entries (claim unprepared)
    attempts: int = 0
    event_posted: bool = False  # retries of the status write must not repeat the event


def now_utc() -> str:
    """The current time as a metav1.Time string."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reason_for(step: str) -> str:
    """A metav1.Condition reason (CamelCase, ``[A-Za-z][A-Za-z0-9_,:]*``) for a failed step."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", step) if w]
    camel = "".join(w[:1].upper() + w[1:] for w in words)
    if not camel or not camel[0].isalpha():
        camel = "NetworkSetup"
    return f"{camel}Failed"


def _cidr(ip: str) -> str:
    if "/" in ip:
        return ip
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def status_body(
    update: StatusUpdate, current: dict[str, Any], driver_name: str, numa: dict[str, str] | None
) -> dict[str, Any]:
    """The SSA body: every one of our entries in the claim ``current``, updated by ``update``,
    each with the claim's ``NUMAAligned`` condition ``numa``."""
    claim = update.claim
    if update.clear:
        return claim_status_body(claim, [])
    existing = {
        (d.get("pool"), d.get("device"), d.get("shareID")): d
        for d in ((current.get("status") or {}).get("devices") or [])
        if d.get("driver") == driver_name
    }
    now = now_utc()
    entries = []
    for dev in claim.devices:
        old = existing.get((dev.pool, dev.device, dev.share_id), {})
        old_conditions = {c.get("type"): c for c in old.get("conditions") or []}
        entry: dict[str, Any] = {"driver": driver_name, "pool": dev.pool, "device": dev.device}
        if dev.share_id is not None:  # one entry per share of a device allocated many times
            entry["shareID"] = dev.share_id
        ready = old_conditions.get(READY)
        rdma = old_conditions.get(RDMA)
        network_data = old.get("networkData")
        if dev.device in update.ready:
            result = update.ready[dev.device]
            ready = {
                "type": READY,
                "status": "True",
                "reason": "VfioReady" if result.vfio else "NetworkReady",
                "message": _ready_message(result, update.pod_uid),
            }
            network_data = _network_data(result)
            rdma = _rdma_condition(result)
        elif dev.device == update.failed_device:
            ready = {
                "type": READY,
                "status": "False",
                "reason": update.failed_reason or reason_for(update.failed_step),
                "message": f"{update.failed_step}: {update.failed_message}"[:MAX_MESSAGE],
            }
            network_data = None  # rolled back: the NIC is not in the pod
            rdma = None
        conditions = [c for c in (ready, rdma, numa) if c]
        entry["conditions"] = [_stamp(c, old_conditions.get(c["type"]), now) for c in conditions]
        if network_data:
            entry["networkData"] = network_data
        entries.append(entry)
    return claim_status_body(claim, entries)


def claim_status_body(claim: PreparedClaim, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A ResourceClaim apply body holding ``entries`` as our ``status.devices``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace},
        "status": {"devices": entries},
    }


def _stamp(cond: dict[str, Any], old: dict[str, Any] | None, now: str) -> dict[str, Any]:
    # lastTransitionTime changes only when the status does (metav1.Condition semantics).
    out = {k: cond[k] for k in ("type", "status", "reason", "message")}
    if old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime"):
        out["lastTransitionTime"] = old["lastTransitionTime"]
    else:
        out["lastTransitionTime"] = now
    return out


def _ready_message(result: DeviceResult, pod_uid: str) -> str:
    """The ``Ready`` condition's message: the interface, and for a sub-interface its kind and NIC; a
    VF on vfio-pci, its PCI function and group."""
    if result.vfio:
        return f"VF {result.vfio} on vfio-pci for pod {pod_uid}"[:MAX_MESSAGE]
    if result.parent is None:
        return f"interface {result.interface_name} configured in pod {pod_uid}"
    what = f"sub-interface {result.interface_name} ({result.kind or 'macvlan'} of {result.parent})"
    return f"{what} configured in pod {pod_uid}"[:MAX_MESSAGE]


def _rdma_condition(result: DeviceResult) -> dict[str, Any] | None:
    """``RDMA`` False when the NIC went into the pod without its RDMA device; True when a soft one
    was made for it in the pod (said only then)."""
    if result.no_rdma is None and result.rdma_in_pod is not None:
        message = f"Soft-RoCE device {result.rdma_in_pod} made in the pod's network namespace"
        return {"type": RDMA, "status": "True", "reason": "RDMADeviceMadeInPod", "message": message[:MAX_MESSAGE]}
    if result.no_rdma is None:
        return None
    message = f"the pod has no RDMA device for this NIC: {result.no_rdma}"
    return {"type": RDMA, "status": "False", "reason": "RDMADeviceStaysOnHost", "message": message[:MAX_MESSAGE]}


def _network_data(result: DeviceResult) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if result.interface_name:
        data["interfaceName"] = result.interface_name[:MAX_IFNAME]
    ips = [_cidr(ip) for ip in (result.ips or [])]
    if ips:
        data["ips"] = ips[:MAX_IPS]
    if result.hardware_address:
        data["hardwareAddress"] = result.hardware_address[:MAX_HWADDR]
    return data
