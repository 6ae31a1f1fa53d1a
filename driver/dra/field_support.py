"""Does the apiserver keep a field of a device? Asked with a server-side dry run, before the first publish.

A field the apiserver does not know (its feature gate is off) is dropped silently: the stored
object differs from what the driver wrote, so every later comparison sees a change and the
slices would be rewritten forever, or a value-less attribute makes the whole slice invalid. A
throw-away one-device slice of this node's pool, created as a dry run (validated and admitted,
never stored), shows what the apiserver keeps: device taints (:func:`driver.dra.taints.device_taints_accepted`),
list-valued attributes (:func:`list_attributes_accepted`), devices allocated many times with
consumable capacity (:func:`consumable_capacity_accepted`), shared counters of partitionable devices
(:func:`counter_sets_accepted`).
"""

from __future__ import annotations

from typing import Any

from driver.dra.slices import API_VERSION
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError


def probe_slice(
    driver_name: str, node_name: str, purpose: str, device: dict[str, Any], content: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A one-device slice of this node's pool holding ``device`` (or ``content`` instead of the
    device list), named for ``purpose``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-{driver_name}-{purpose}-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            **(content if content is not None else {"devices": [device]}),
        },
    }


def stored_device(
    kube: KubeClient, driver_name: str, node_name: str, purpose: str, device: dict[str, Any]
) -> tuple[dict[str, Any] | None, str]:
    """(what the apiserver would store of ``device``, "") or (None, why it could not be asked)."""
    try:
        stored = kube.create_resource_slice(probe_slice(driver_name, node_name, purpose, device), dry_run=True)
    except KubeError as exc:
        return None, f"the apiserver refused it: {exc}"
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS...: cannot tell, so do not risk the slices
        return None, f"cannot ask the apiserver: {exc}"
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    return devices[0], ""


def list_attributes_accepted(kube: KubeClient, driver_name: str, node_name: str, attribute: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver stores ``attribute`` as an int list (``{"ints": [...]}``).

    KEP-5491 (the apiserver's ``DRAListTypeAttributes`` gate, alpha in Kubernetes 1.36). An
    apiserver without the gate (every 1.34 and 1.35 one) drops the unknown ``ints`` field, then
    rejects the value-less attribute and with it the whole ResourceSlice: a driver that wants to
    publish list attributes asks first and falls back to scalars.
    """
    device = {"name": "list-probe", "attributes": {attribute: {"ints": [0, 1]}}}
    stored, why = stored_device(kube, driver_name, node_name, "list", device)
    if stored is None:
        return False, why
    value = (stored.get("attributes") or {}).get(attribute) or {}
    if value.get("ints") == [0, 1]:
        return True, "accepted"
    return False, "the apiserver dropped the list (its DRAListTypeAttributes gate is off)"


def consumable_capacity_accepted(kube: KubeClient, driver_name: str, node_name: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver keeps ``allowMultipleAllocations`` and a capacity's
    ``requestPolicy`` (KEP-5075, its ``DRAConsumableCapacity`` gate: beta and on by default since
    Kubernetes 1.36). Without the gate it drops both silently: a device published for sharing
    would be allocatable once only, and every publish would rewrite the slice."""
    capacity = {"value": "10", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "10"}}}
    device = {"name": "share-probe", "allowMultipleAllocations": True, "capacity": {f"{driver_name}/probe": capacity}}
    stored, why = stored_device(kube, driver_name, node_name, "share", device)
    if stored is None:
        return False, why
    kept = (stored.get("capacity") or {}).get(f"{driver_name}/probe") or {}
    if stored.get("allowMultipleAllocations") is True and kept.get("requestPolicy"):
        return True, "accepted"
    return False, "the apiserver dropped allowMultipleAllocations (its DRAConsumableCapacity gate is off)"


def counter_sets_accepted(kube: KubeClient, driver_name: str, node_name: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver keeps a slice's ``sharedCounters`` (KEP-4815,
    partitionable devices: its ``DRAPartitionableDevices`` gate, beta since Kubernetes 1.36).
    Without the gate it drops them silently: every publish would rewrite the counter slice, and
    devices consuming from a set no slice holds would never be allocated."""
    content = {"sharedCounters": [{"name": "counter-probe", "counters": {"probe": {"value": "2"}}}]}
    try:
        stored = kube.create_resource_slice(probe_slice(driver_name, node_name, "counters", {}, content), dry_run=True)
    except KubeError as exc:
        return False, f"the apiserver refused it: {exc}"
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS...: cannot tell, so publish none
        return False, f"cannot ask the apiserver: {exc}"
    kept = (stored.get("spec") or {}).get("sharedCounters") or []
    if kept and kept[0].get("counters", {}).get("probe", {}).get("value") == "2":
        return True, "accepted"
    return False, "the apiserver dropped sharedCounters (its DRAPartitionableDevices gate is off)"
