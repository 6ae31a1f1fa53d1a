"""Google Compute Engine: the metadata server (``computeMetadata/v1``, header ``Metadata-Flavor: Google``).

Attributes (the Go driver's names): ``gce.dra.net/machineType`` on every device; ``block``,
``subBlock`` and ``host`` from ``instance/attributes/physical_host`` (``/<block>/<subBlock>/<host>``,
only on VMs with a compact placement); per NIC, matched by MAC in
``instance/network-interfaces/?recursive=true&alt=json``: ``networkName`` and
``networkProjectNumber`` (from ``projects/<number>/networks/<name>``) and ``ipAliases``
(comma-joined ranges). Like the Go driver, GCE gives no per-NIC network config.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.inventory.cloud.base import DeviceIdentifiers, normalize_mac
from driver.inventory.cloud.metadata import MetadataClient, MetadataError
from driver.model.device import AttributeValue

log = logging.getLogger(__name__)

NAME = "gce"
HOST = "http://metadata.google.internal"
HEADERS = {"Metadata-Flavor": "Google"}
PREFIX = "gce.dra.net/"
BASE = "/computeMetadata/v1/instance"
_NETWORK_RE = re.compile(r"^projects/(\d+)/networks/([^/\s]+)$")


@dataclass(frozen=True)
class GceInterface:
    """One entry of ``network-interfaces``: what the attributes need."""

    mac: str
    network: str = ""
    ip_aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class GceInstance:
    """A GCE VM: machine type, physical host topology and NICs."""

    machine_type: str
    topology: str = ""  # physical_host: "/<block>/<subBlock>/<host>", "" when not populated
    interfaces: tuple[GceInterface, ...] = field(default_factory=tuple)
    provider: str = NAME

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """Machine type and placement for every device; network and aliases for a known MAC."""
        out: dict[str, AttributeValue] = {}
        if self.machine_type:
            out[PREFIX + "machineType"] = self.machine_type
        parts = self.topology.lstrip("/").split("/", 2) if self.topology else []
        if len(parts) == 3 and all(parts):
            out[PREFIX + "block"], out[PREFIX + "subBlock"], out[PREFIX + "host"] = parts
        mac = normalize_mac(device.mac)
        nic = next((i for i in self.interfaces if mac and normalize_mac(i.mac) == mac), None)
        if nic is None:
            return out
        if nic.ip_aliases:
            out[PREFIX + "ipAliases"] = ",".join(nic.ip_aliases)
        match = _NETWORK_RE.match(nic.network)
        if match:
            out[PREFIX + "networkProjectNumber"] = int(match.group(1))
            out[PREFIX + "networkName"] = match.group(2)
        return out

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """None: GCE requires no per-NIC config (as in the Go driver)."""
        return None

    def summary(self) -> dict[str, object]:
        """For the log."""
        return {"machineType": self.machine_type, "physicalHost": self.topology, "nics": len(self.interfaces)}


def probe(client: MetadataClient) -> bool:
    """The metadata server answers its root with ``Metadata-Flavor: Google`` (what Go's ``metadata.OnGCE`` checks)."""
    try:
        return client.get(HOST, "/", HEADERS).headers.get("metadata-flavor") == "Google"
    except MetadataError:
        return False


def _interface(raw: Any, index: int) -> GceInterface:
    if not isinstance(raw, dict) or not isinstance(raw.get("mac"), str):
        raise MetadataError(f"network-interfaces[{index}]: not an object with a mac")
    aliases = raw.get("ipAliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise MetadataError(f"network-interfaces[{index}].ipAliases: not a list of strings")
    network = raw.get("network") or ""
    if not isinstance(network, str):
        raise MetadataError(f"network-interfaces[{index}].network: not a string")
    return GceInterface(mac=raw["mac"], network=network, ip_aliases=tuple(aliases))


def fetch(client: MetadataClient) -> GceInstance:
    """Machine type, NICs and (when populated) the physical host; :class:`MetadataError` otherwise."""
    machine = client.get(HOST, f"{BASE}/machine-type", HEADERS).text()  # projects/<n>/machineTypes/<type>
    raw = client.get(HOST, f"{BASE}/network-interfaces/?recursive=true&alt=json", HEADERS).json()
    if not isinstance(raw, list):
        raise MetadataError("network-interfaces: not a JSON list")
    interfaces = tuple(_interface(r, i) for i, r in enumerate(raw))
    try:
        topology = client.get(HOST, f"{BASE}/attributes/physical_host", HEADERS).text()
    except MetadataError as exc:  # not every VM type has it: no placement attributes, not an error
        log.info("GCE physical_host not available; no block/subBlock/host attributes", extra={"kv": {"why": str(exc)}})
        topology = ""
    return GceInstance(machine_type=machine.rsplit("/", 1)[-1], topology=topology, interfaces=interfaces)
