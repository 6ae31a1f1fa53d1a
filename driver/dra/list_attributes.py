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

from driver.kube.client import KubeClient
from driver.model.device import STANDARD_DOMAIN
from driver.publish.api_probe import stored_device

log = logging.getLogger(__name__)

PROBE_ATTRIBUTE = f"{STANDARD_DOMAIN}/numaNode"


def list_attributes_accepted(kube: KubeClient, driver_name: str, node_name: str) -> tuple[bool, str]:
    """(accepted, why): whether the apiserver stores ``ints`` attributes, and the evidence."""
    device = {"name": "list-probe", "attributes": {PROBE_ATTRIBUTE: {"ints": [0, 1]}}}
    stored, why = stored_device(kube, driver_name, node_name, "list", device)
    if stored is None:
        return False, why
    value = (stored.get("attributes") or {}).get(PROBE_ATTRIBUTE) or {}
    if value.get("ints") == [0, 1]:
        return True, "accepted"
    return False, "the apiserver dropped the list (its DRAListTypeAttributes gate is off)"
