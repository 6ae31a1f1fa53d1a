"""Does the apiserver take list-valued device attributes? Asked once, before the first publish.

``--feature-gates DRAListTypeAttributes=true`` publishes ``resource.kubernetes.io/numaNode`` as an
int list (``{"ints": [...]}``, KEP-5491, alpha in Kubernetes 1.36). An apiserver without that gate
(every 1.34 and 1.35 one) drops the unknown ``ints`` field, then rejects the value-less attribute
and with it the whole ResourceSlice: no device of the node would be published. So the daemon
creates one throw-away slice with such an attribute as a server-side dry run (validated and
admitted, never stored) and keeps the list form only when the stored form still has the list.
Otherwise it logs an error and publishes the scalar form (what every scheduler understands).
"""

from __future__ import annotations

import logging
from typing import Any

from driver.kube.client import KubeClient
from driver.kube.errors import KubeError
from driver.model.device import STANDARD_DOMAIN

log = logging.getLogger(__name__)

PROBE_ATTRIBUTE = f"{STANDARD_DOMAIN}/numaNode"


def probe_slice(driver_name: str, node_name: str) -> dict[str, Any]:
    """A one-device slice of this node's pool carrying a list attribute (never stored: dry run)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node_name}-{driver_name}-list-probe-"},
        "spec": {
            "driver": driver_name,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "devices": [{"name": "list-probe", "attributes": {PROBE_ATTRIBUTE: {"ints": [0, 1]}}}],
        },
    }


def list_attributes_accepted(kube: KubeClient, driver_name: str, node_name: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver stores ``ints`` attributes, and the evidence."""
    try:
        stored = kube.create_resource_slice(probe_slice(driver_name, node_name), dry_run=True)
    except KubeError as exc:
        return False, f"the apiserver refused a list attribute: {exc}"
    except Exception as exc:  # noqa: BLE001 - unreachable, TLS...: cannot tell, so do not risk the slice
        return False, f"cannot ask the apiserver: {exc}"
    devices = (stored.get("spec") or {}).get("devices") or [{}]
    value = (devices[0].get("attributes") or {}).get(PROBE_ATTRIBUTE) or {}
    if value.get("ints") == [0, 1]:
        return True, "accepted"
    return False, "the apiserver dropped the list (its DRAListTypeAttributes gate is off)"
