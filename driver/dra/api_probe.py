"""Does the apiserver keep a field of a device? Asked with a server-side dry run, before the first publish.

A field the apiserver does not know (its feature gate is off) is dropped silently: the stored
object differs from what the driver wrote, so every later comparison sees a change and the
slices would be rewritten forever, or a value-less attribute makes the whole slice invalid. A
throw-away one-device slice of this node's pool, created as a dry run (validated and admitted,
never stored), shows what the apiserver keeps.
"""

from __future__ import annotations

from typing import Any

from driver.kube.client import KubeClient
from driver.kube.errors import KubeError
from driver.publish.slices import API_VERSION


def probe_slice(driver_name: str, node_name: str, purpose: str, device: dict[str, Any]) -> dict[str, Any]:
    """A one-device slice of this node's pool holding ``device``, named for ``purpose``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-{driver_name}-{purpose}-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [device],
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
