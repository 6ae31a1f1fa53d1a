"""Oracle Cloud (OKE): the instance metadata service v2 (``/opc/v2``, header ``Authorization: Bearer Oracle``).

Attributes (the Go driver's names), the same on every device of the host, from ``/opc/v2/host/``'s
``rdmaTopologyData`` (present only on RDMA shapes whose tenancy enabled topology data):
``oke.dra.net/hpcIslandId``, ``networkBlockId``, ``localBlockId``, ``gpuMemoryFabricId`` (the OCID
suffix after the last ``.``, at most 60 characters: full OCIDs exceed the 64-byte attribute limit,
the suffix is unique per resource) and ``rackId`` (the host document's ``rackId``, as published).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.inventory.cloud.base import DeviceIdentifiers
from driver.inventory.cloud.metadata import MetadataClient, MetadataError
from driver.model.device import AttributeValue

NAME = "oke"
HOST = "http://169.254.169.254"
HEADERS = {"Authorization": "Bearer Oracle"}
PREFIX = "oke.dra.net/"
TOPOLOGY_FIELDS = {
    "customerHPCIslandId": "hpcIslandId",
    "customerNetworkBlock": "networkBlockId",
    "customerLocalBlock": "localBlockId",
    "customerGpuMemoryFabric": "gpuMemoryFabricId",
}
"""``rdmaTopologyData`` field -> attribute name; values are OCIDs, published as their suffix."""
MAX_SUFFIX = 60


def ocid_suffix(value: str, where: str) -> str:
    """The unique part of an OCID (after the last ``.``, last 60 characters); :class:`MetadataError` if not an OCID."""
    if "ocid" not in value or "." not in value:
        raise MetadataError(f"{where}: {value!r} is not an OCID")
    return value.rsplit(".", 1)[1][-MAX_SUFFIX:]


@dataclass(frozen=True)
class OkeInstance:
    """An OCI host's RDMA topology (attribute name -> value); empty on shapes without one."""

    topology: dict[str, str] = field(default_factory=dict)
    provider: str = NAME

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """Node-level topology, the same for every device."""
        return {PREFIX + name: value for name, value in self.topology.items() if value}

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """None. (The Go driver's GB200/GB300 ``enableIPv6`` signal has no equivalent field here.)"""
        return None

    def summary(self) -> dict[str, object]:
        """For the log."""
        return dict(self.topology)


def probe(client: MetadataClient) -> bool:
    """``/opc/v2/instance/`` answers 200 with the Oracle bearer header (the Go driver's ``OnOKE``)."""
    try:
        client.get(HOST, "/opc/v2/instance/", HEADERS)
        return True
    except MetadataError:
        return False


def parse_host(raw: Any) -> OkeInstance:
    """``/opc/v2/host/`` -> topology attributes; no ``rdmaTopologyData`` gives none (not an error)."""
    if not isinstance(raw, dict):
        raise MetadataError("host: not a JSON object")
    topo = raw.get("rdmaTopologyData")
    if topo is None:
        return OkeInstance()
    if not isinstance(topo, dict):
        raise MetadataError("host.rdmaTopologyData: not an object")
    out: dict[str, str] = {}
    for src, name in TOPOLOGY_FIELDS.items():
        value = topo.get(src)
        if value:
            if not isinstance(value, str):
                raise MetadataError(f"host.rdmaTopologyData.{src}: not a string")
            out[name] = ocid_suffix(value, f"host.rdmaTopologyData.{src}")
    rack = raw.get("rackId")
    if rack:
        if not isinstance(rack, str):
            raise MetadataError("host.rackId: not a string")
        out["rackId"] = rack
    return OkeInstance(topology=out)


def fetch(client: MetadataClient) -> OkeInstance:
    """The host document's topology."""
    return parse_host(client.get(HOST, "/opc/v2/host/", HEADERS).json())
