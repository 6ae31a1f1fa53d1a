"""Azure: the Instance Metadata Service (``/metadata/instance``, header ``Metadata: true``).

Attributes (the Go driver's names), the same on every device of the VM: ``azure.dra.net/vmSize``,
``placementGroupId``, ``interconnectGroupId``, ``interconnectSubgroupId`` from
``/metadata/instance/compute``; per NIC (matched by MAC in ``/metadata/instance/network``):
``azure.dra.net/subnet`` (first IPv4 subnet, CIDR).

Per-NIC network config, as the Go driver computes it: NIC number ``i`` in IMDS order gets its own
routing table ``100 + i`` with a rule ``from <subnet> lookup 100+i`` and a default route via the
subnet's first address (Azure's gateway) in that table, so traffic sourced from that NIC's subnet
leaves through it. (The Go driver adds the IPv6 equivalent from the host's IPv6 default route;
that needs a netlink lookup at prepare time and is not done here.)
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig, RouteConfig, RuleConfig
from driver.inventory.cloud.base import DeviceIdentifiers, normalize_mac
from driver.inventory.cloud.metadata import MetadataClient, MetadataError
from driver.model.device import AttributeValue

log = logging.getLogger(__name__)

NAME = "azure"
HOST = "http://169.254.169.254"
HEADERS = {"Metadata": "true"}
API_VERSION = "2025-11-11"  # the Go driver's; IMDS serves older versions' fields unchanged
PREFIX = "azure.dra.net/"
ROUTING_TABLE_BASE = 100
COMPUTE_FIELDS = {
    "vmSize": "vmSize",
    "placementGroupId": "placementGroupId",
    "interconnectGroupId": "interconnectGroupId",
    "interconnectSubgroupId": "interconnectSubgroupId",
}
"""IMDS compute field -> attribute name (identical, as in the Go driver)."""


@dataclass(frozen=True)
class AzureInterface:
    """One IMDS network interface: MAC and its first IPv4 subnet."""

    mac: str
    subnet: str | None = None  # CIDR, e.g. 10.0.1.0/24


@dataclass(frozen=True)
class AzureInstance:
    """An Azure VM: the compute fields we publish and the NICs in IMDS order."""

    compute: dict[str, str] = field(default_factory=dict)
    interfaces: tuple[AzureInterface, ...] = ()
    provider: str = NAME

    def _nic(self, device: DeviceIdentifiers) -> tuple[int, AzureInterface] | None:
        mac = normalize_mac(device.mac)
        if not mac:
            return None
        return next(((i, n) for i, n in enumerate(self.interfaces) if normalize_mac(n.mac) == mac), None)

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """The VM's placement on every device; the subnet of a known NIC."""
        out: dict[str, AttributeValue] = {PREFIX + name: value for name, value in self.compute.items() if value}
        found = self._nic(device)
        if found and found[1].subnet:
            out[PREFIX + "subnet"] = found[1].subnet
        return out

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """Policy routing of a known NIC: rule ``from <subnet> lookup 100+i``, default route via the gateway."""
        found = self._nic(device)
        if found is None or found[1].subnet is None:
            return None
        index = found[0]
        subnet = ipaddress.ip_network(found[1].subnet)  # checked when parsed
        table = ROUTING_TABLE_BASE + index
        gateway = str(next(subnet.hosts()))
        return NetworkConfig(
            routes=(RouteConfig(destination="0.0.0.0/0", gateway=gateway, table=table),),
            rules=(RuleConfig(source=subnet.with_prefixlen, table=table),),
        )

    def summary(self) -> dict[str, object]:
        """For the log."""
        return {**self.compute, "nics": len(self.interfaces)}


def probe(client: MetadataClient) -> bool:
    """IMDS answers ``/metadata/instance?format=text`` with 200 (the Go driver's ``OnAzure``)."""
    try:
        client.get(HOST, f"/metadata/instance?api-version={API_VERSION}&format=text", HEADERS)
        return True
    except MetadataError:
        return False


def _subnet(raw: Any, where: str) -> str | None:
    subnets = raw if isinstance(raw, list) else []
    if not subnets:
        return None
    first = subnets[0]
    if not isinstance(first, dict) or not first.get("address") or not first.get("prefix"):
        return None
    try:
        net = ipaddress.IPv4Network(f"{first['address']}/{first['prefix']}", strict=True)
    except ValueError as exc:
        raise MetadataError(f"{where}: not an IPv4 subnet: {exc}") from None
    if net.num_addresses < 4:  # no room for Azure's gateway (first host) and a NIC
        raise MetadataError(f"{where}: subnet {net} too small")
    return net.with_prefixlen


def parse_network(raw: Any) -> tuple[AzureInterface, ...]:
    """``/metadata/instance/network`` -> NICs in IMDS order; :class:`MetadataError` on a wrong shape."""
    if not isinstance(raw, dict) or not isinstance(raw.get("interface"), list):
        raise MetadataError("network: no 'interface' list")
    out = []
    for i, nic in enumerate(raw["interface"]):
        where = f"network.interface[{i}]"
        if not isinstance(nic, dict) or not isinstance(nic.get("macAddress"), str):
            raise MetadataError(f"{where}: no macAddress")
        ipv4 = nic.get("ipv4")
        ipv4 = ipv4 if isinstance(ipv4, dict) else {}
        out.append(AzureInterface(mac=nic["macAddress"], subnet=_subnet(ipv4.get("subnet"), f"{where}.ipv4.subnet")))
    return tuple(out)


def parse_compute(raw: Any) -> dict[str, str]:
    """``/metadata/instance/compute`` -> the fields we publish (empty ones dropped)."""
    if not isinstance(raw, dict):
        raise MetadataError("compute: not a JSON object")
    out = {}
    for src, name in COMPUTE_FIELDS.items():
        value = raw.get(src)
        if value is not None and not isinstance(value, str):
            raise MetadataError(f"compute.{src}: not a string")
        if value:
            out[name] = value
    return out


def fetch(client: MetadataClient) -> AzureInstance:
    """Compute fields and NICs (network metadata failing only drops per-NIC data, as in the Go driver)."""
    query = f"?api-version={API_VERSION}&format=json"
    compute = parse_compute(client.get(HOST, f"/metadata/instance/compute{query}", HEADERS).json())
    try:
        network = parse_network(client.get(HOST, f"/metadata/instance/network{query}", HEADERS).json())
    except MetadataError as exc:
        log.warning("Azure IMDS network metadata unusable; no per-NIC data", extra={"kv": {"error": str(exc)}})
        network = ()
    return AzureInstance(compute=compute, interfaces=network)
