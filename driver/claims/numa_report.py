"""The ``NUMAAligned`` condition: are a claim's NICs on the same NUMA node as its other devices?

Our own devices' NUMA nodes come from the prepared device snapshots (``dra.net/numaNode``, or
the host facts). The claim's other devices (typically GPUs of another driver) are looked up in
their driver's ResourceSlices: their ``resource.kubernetes.io/pciBusID`` is resolved through this
node's sysfs (``bus/pci/devices/<BDF>/numa_node``), else their ``resource.kubernetes.io/numaNode``
attribute (KEP-6072), else a ``<domain>/numaNode`` attribute of their own driver's domain.

Status rules (see docs/configuration.md, "Claim status"):

* ``True``  (reason ``NUMAAligned``): every device's node is known and they all share one node;
* ``False`` (reason ``NUMAMisaligned``): the known nodes already span more than one node;
* ``Unknown`` (reason ``NUMAUnknown``): some node is unknown and the known ones agree.

On a host with a single NUMA node, a ``numa_node`` of -1 (no affinity reported) counts as node 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.checkpoint.state import PreparedClaim
from driver.config import DRIVER_NAME
from driver.model.device import STANDARD_DOMAIN, attribute_from_api, first_int

CONDITION_TYPE = "NUMAAligned"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
STD_NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
MAX_MESSAGE = 32768  # metav1.Condition.message limit


@dataclass(frozen=True)
class DeviceNuma:
    """One allocated device and the NUMA node it sits on (None when unknown)."""

    driver: str
    pool: str
    device: str
    numa: int | None
    source: str  # where the node came from: an attribute name, "sysfs", or why it is unknown

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.device}"


def numa_node_count(sysfs_root: str) -> int:
    """How many NUMA nodes the host has (0 when sysfs does not say)."""
    try:
        return sum(1 for p in Path(sysfs_root, "devices/system/node").glob("node[0-9]*"))
    except OSError:
        return 0


def pci_numa_node(sysfs_root: str, bdf: str) -> int | None:
    """``bus/pci/devices/<bdf>/numa_node`` (None when absent, unreadable or -1)."""
    try:
        value = int(Path(sysfs_root, "bus/pci/devices", bdf.lower(), "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def own_devices(claim: PreparedClaim, single_node: bool = False) -> list[DeviceNuma]:
    """Our devices of ``claim`` with their NUMA nodes from the prepare-time snapshots."""
    out = []
    for dev in claim.devices:
        attr = dev.snapshot.attributes.get(f"{DRIVER_NAME}/numaNode")
        numa, source = None, "unknown: no dra.net/numaNode attribute"
        if isinstance(attr, int) and not isinstance(attr, bool) and attr >= 0:
            numa, source = attr, f"{DRIVER_NAME}/numaNode"
        elif dev.snapshot.host.numa_node is not None and dev.snapshot.host.numa_node >= 0:
            numa, source = dev.snapshot.host.numa_node, "sysfs"
        elif single_node:
            numa, source = 0, "single NUMA node host"
        out.append(DeviceNuma(DRIVER_NAME, dev.pool, dev.device, numa, source))
    return out


def _slice_attributes(slices: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(driver, pool, device) -> decoded attributes, from ResourceSlice objects."""
    index: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rs in slices:
        spec = rs.get("spec") or {}
        driver, pool = str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")
        for dev in spec.get("devices") or []:
            attrs = {}
            for name, encoded in (dev.get("attributes") or {}).items():
                try:
                    attrs[name] = attribute_from_api(encoded)
                except (ValueError, TypeError):
                    continue
            index[(driver, pool, str(dev.get("name") or ""))] = attrs
    return index


def _qualified(driver: str, attrs: dict[str, Any]) -> dict[str, Any]:
    # Unqualified attribute names belong to the driver's own domain.
    return {(k if "/" in k else f"{driver}/{k}"): v for k, v in attrs.items()}


def other_devices(
    results: Iterable[dict[str, Any]],
    slices: Iterable[dict[str, Any]],
    sysfs_root: str,
    single_node: bool = False,
    own_driver: str = DRIVER_NAME,
) -> list[DeviceNuma]:
    """The claim's devices of other drivers (``status.allocation.devices.results``) with NUMA nodes."""
    index = _slice_attributes(slices)
    out = []
    for res in results:
        driver, pool, device = (str(res.get(k) or "") for k in ("driver", "pool", "device"))
        if driver == own_driver or not driver:
            continue
        attrs = index.get((driver, pool, device))
        if attrs is None:
            out.append(DeviceNuma(driver, pool, device, None, "unknown: not found in its driver's ResourceSlices"))
            continue
        attrs = _qualified(driver, attrs)
        numa, source = None, "unknown: no pciBusID in sysfs and no numaNode attribute"
        bdf = attrs.get(PCI_BUS_ID)
        if isinstance(bdf, str):
            numa = pci_numa_node(sysfs_root, bdf)
            source = f"sysfs ({bdf})"
        if numa is None:
            for name in (STD_NUMA_NODE, f"{driver}/numaNode"):
                # The list form (DRAListTypeAttributes) starts with the physical node.
                value = first_int(attrs.get(name))
                if value is not None and value >= 0:
                    numa, source = value, name
                    break
        if numa is None and single_node:
            numa, source = 0, "single NUMA node host"
        out.append(DeviceNuma(driver, pool, device, numa, source))
    return out


def _describe(devices: list[DeviceNuma]) -> str:
    by_node: dict[str, list[str]] = {}
    for d in devices:
        by_node.setdefault("unknown" if d.numa is None else f"node {d.numa}", []).append(d.device)
    return "; ".join(f"{node}: {', '.join(sorted(names))}" for node, names in sorted(by_node.items()))


def numa_condition(nics: list[DeviceNuma], others: list[DeviceNuma]) -> dict[str, str]:
    """The ``NUMAAligned`` condition (without ``lastTransitionTime``) for the whole claim."""
    known = {d.numa for d in nics + others if d.numa is not None}
    unknown = [d for d in nics + others if d.numa is None]
    parts = [f"NICs: {_describe(nics) or 'none'}"]
    if others:
        for driver in sorted({d.driver for d in others}):
            parts.append(f"{driver}: {_describe([d for d in others if d.driver == driver])}")
    else:
        parts.append("no other devices in the claim")
    if unknown:
        parts.append("unknown because: " + "; ".join(f"{d.label}: {d.source}" for d in unknown))
    if len(known) > 1:
        status, reason = "False", "NUMAMisaligned"
        head = f"devices span NUMA nodes {', '.join(str(n) for n in sorted(known))}"
    elif unknown:
        status, reason, head = "Unknown", "NUMAUnknown", "NUMA node of some devices is unknown"
    else:
        status, reason = "True", "NUMAAligned"
        head = f"all devices on NUMA node {next(iter(known))}" if known else "no devices"
    message = f"{head}. " + ". ".join(parts)
    return {"type": CONDITION_TYPE, "status": status, "reason": reason, "message": message[:MAX_MESSAGE]}
