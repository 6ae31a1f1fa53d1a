"""AWS EC2: IMDSv2 (``PUT /latest/api/token``, then ``X-aws-ec2-metadata-token`` on every GET).

The instance type comes from ``/latest/dynamic/instance-identity/document``. Like the Go driver,
attributes are published only on Neuron instances (Trainium/Inferentia: type prefix ``trn``/``inf``)
and only on EFA devices (PCI function bound to the ``efa`` driver): the EFA device-group IDs of
AWS's ``connected-device-maps-over-efa-for-neuron`` library, under that library's names:

- ``resource.aws.com/devicegroup1_id``: the EFA's own BDF (aligns 1 Neuron device with its EFA);
- ``resource.aws.com/devicegroup{4,8,16}_id``: a 16-hex-digit hash shared by the EFAs of the Neuron
  devices ``n // size * size .. + size`` (sha256 of their sorted, de-duplicated BDFs joined by ``,``).

The Neuron-device-to-EFA tables below are the library's (per instance family; one EFA may serve two
Neuron devices on trn1). On other instance types EFAs are still published with ``dra.net/rdma``,
PCI and NUMA attributes, just without device groups.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.inventory.cloud.base import DeviceIdentifiers
from driver.inventory.cloud.metadata import MetadataClient, MetadataError
from driver.model.device import AttributeValue

NAME = "aws"
HOST = "http://169.254.169.254"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL = "21600"
PREFIX = "resource.aws.com/"
GROUP_SIZES = (4, 8, 16)
EFA_DRIVER = "efa"


def _table(*bdfs: str) -> dict[int, str]:
    return dict(enumerate(bdfs))


NEURON_TO_EFA: dict[str, dict[int, str]] = {
    "trn1": _table(
        *("0000:10:1a.0", "0000:10:1a.0", "0000:a0:1a.0", "0000:a0:1a.0", "0000:20:19.0", "0000:20:19.0"),
        *("0000:90:19.0", "0000:90:19.0", "0000:20:1a.0", "0000:20:1a.0", "0000:90:1a.0", "0000:90:1a.0"),
        *("0000:10:19.0", "0000:10:19.0", "0000:a0:19.0", "0000:a0:19.0"),
    ),
    "trn1n": _table(
        *("0000:10:17.0", "0000:10:1a.0", "0000:a0:17.0", "0000:a0:1a.0", "0000:20:19.0", "0000:20:18.0"),
        *("0000:90:19.0", "0000:90:18.0", "0000:20:17.0", "0000:20:1a.0", "0000:90:17.0", "0000:90:1a.0"),
        *("0000:10:19.0", "0000:10:18.0", "0000:a0:19.0", "0000:a0:18.0"),
    ),
    "trn2": _table(
        *("0000:c9:00.0", "0000:b4:00.0", "0000:b3:00.0", "0000:ca:00.0", "0000:6c:00.0", "0000:57:00.0"),
        *("0000:56:00.0", "0000:6d:00.0", "0000:98:00.0", "0000:83:00.0", "0000:82:00.0", "0000:99:00.0"),
        *("0000:f5:00.0", "0000:e0:00.0", "0000:df:00.0", "0000:f6:00.0"),
    ),
    "trn3": _table(
        *("0000:be:00.0", "0000:a9:00.0", "0000:a8:00.0", "0000:bf:00.0", "0000:61:00.0", "0000:4c:00.0"),
        *("0000:4b:00.0", "0000:62:00.0", "0000:8d:00.0", "0000:78:00.0", "0000:77:00.0", "0000:8e:00.0"),
        *("0000:ea:00.0", "0000:d5:00.0", "0000:d4:00.0", "0000:eb:00.0"),
    ),
    "trn3pds": _table(
        *("0000:a9:00.0", "0000:a8:00.0", "0000:bf:00.0", "0000:be:00.0", "0000:d5:00.0", "0000:d4:00.0"),
        *("0000:eb:00.0", "0000:ea:00.0", "0000:4c:00.0", "0000:4b:00.0", "0000:62:00.0", "0000:61:00.0"),
        *("0000:78:00.0", "0000:77:00.0", "0000:8e:00.0", "0000:8d:00.0"),
    ),
}
"""Instance family -> Neuron device ID -> EFA BDF."""
EFA_INSTANCE_TYPES: dict[str, str] = {
    "trn1.32xlarge": "trn1",
    "trn1n.32xlarge": "trn1n",
    "trn2.48xlarge": "trn2",
    "trn2e.48xlarge": "trn2",
    "trn2u.48xlarge": "trn2",
    "trn3.48xlarge": "trn3",
    "trn3p.48xlarge": "trn3",
    "trn3pd98.48xlarge": "trn3",
    "trn3s.48xlarge": "trn3",
    "trn3-dev0.48xlarge": "trn3pds",
    "trn3-dev1.48xlarge": "trn3pds",
}
"""EFA-enabled Neuron instance types -> their mapping table."""


def is_neuron(instance_type: str) -> bool:
    """Trainium or Inferentia: the letters before the first digit are ``trn`` or ``inf``."""
    letters = ""
    for c in instance_type.lower():
        if c.isdigit():
            break
        letters += c
    return letters in ("trn", "inf")


def group_hash(bdfs: list[str]) -> str:
    """The device-group ID of a set of EFAs: sha256 of the sorted unique BDFs joined by ``,``, 16 hex digits."""
    return hashlib.sha256(",".join(sorted(set(bdfs))).encode()).hexdigest()[:16]


def device_groups(table: dict[int, str], efa_bdf: str) -> dict[str, str]:
    """The four device-group attributes of one EFA (empty when the EFA is not in the table)."""
    neurons = sorted(n for n, bdf in table.items() if bdf == efa_bdf)
    if not neurons:
        return {}
    neuron = neurons[-1]  # trn1: two Neuron devices share an EFA; both are in every group of 4+
    out = {PREFIX + "devicegroup1_id": efa_bdf}
    for size in GROUP_SIZES:
        start = neuron // size * size
        members = [table[n] for n in range(start, start + size) if n in table]
        out[PREFIX + f"devicegroup{size}_id"] = group_hash(members)
    return out


@dataclass(frozen=True)
class AwsInstance:
    """An EC2 instance: its type (and so its Neuron/EFA mapping table, if any)."""

    instance_type: str = ""
    region: str = ""
    provider: str = NAME

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """EFA device groups on Neuron instances, nothing elsewhere (as the Go driver)."""
        if not is_neuron(self.instance_type) or device.pci_driver != EFA_DRIVER or not device.pci_address:
            return {}
        table = NEURON_TO_EFA.get(EFA_INSTANCE_TYPES.get(self.instance_type, ""), {})
        return dict(device_groups(table, device.pci_address.lower()))

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """None (the Go driver returns none for AWS either)."""
        return None

    def summary(self) -> dict[str, object]:
        """For the log."""
        return {"instanceType": self.instance_type, "region": self.region, "neuron": is_neuron(self.instance_type)}


def _token(client: MetadataClient) -> str:
    token = client.put(HOST, "/latest/api/token", {TOKEN_TTL_HEADER: TOKEN_TTL}).text()
    if not token:
        raise MetadataError("empty IMDSv2 token")
    return token


def _document(client: MetadataClient) -> dict[str, object]:
    doc = client.get(HOST, "/latest/dynamic/instance-identity/document", {TOKEN_HEADER: _token(client)}).json()
    if not isinstance(doc, dict) or not isinstance(doc.get("instanceType"), str):
        raise MetadataError("instance-identity document: no instanceType")
    return doc


def probe(client: MetadataClient) -> bool:
    """The identity document is served (the Go driver's ``OnAWS``)."""
    try:
        _document(client)
        return True
    except MetadataError:
        return False


def fetch(client: MetadataClient) -> AwsInstance:
    """Instance type and region from the identity document."""
    doc = _document(client)
    region = doc.get("region")
    return AwsInstance(instance_type=str(doc["instanceType"]), region=region if isinstance(region, str) else "")
