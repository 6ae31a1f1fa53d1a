"""Alibaba Cloud ECS: the instance metadata service (``100.100.100.200/latest``, IMDSv2 session token).

Attributes (the Go driver's names): ``alibaba.dra.net/instanceType`` on every device, from
``/latest/meta-data/instance/instance-type``; ``alibaba.dra.net/erdma: true`` on eRDMA adapters
(an RDMA device named ``erdma*``, the Go driver's ``/sys/class/infiniband/erdma_*`` test).
Every request carries a token from ``PUT /latest/api/token`` (the Go driver uses IMDSv2 only).
"""

from __future__ import annotations

from dataclasses import dataclass

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.inventory.cloud.base import DeviceIdentifiers
from driver.inventory.cloud.metadata import MetadataClient, MetadataError
from driver.model.device import AttributeValue

NAME = "alibaba"
HOST = "http://100.100.100.200"
TOKEN_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
TOKEN_TTL = "21600"
PREFIX = "alibaba.dra.net/"


@dataclass(frozen=True)
class AlibabaInstance:
    """An ECS instance: its type."""

    instance_type: str = ""
    provider: str = NAME

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """Instance type on every device; ``erdma`` on eRDMA adapters."""
        out: dict[str, AttributeValue] = {}
        if self.instance_type:
            out[PREFIX + "instanceType"] = self.instance_type
        if device.rdma_device and device.rdma_device.startswith("erdma"):
            out[PREFIX + "erdma"] = True
        return out

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """None (the Go driver's HPN IPVLAN config has no equivalent here)."""
        return None

    def summary(self) -> dict[str, object]:
        """For the log."""
        return {"instanceType": self.instance_type}


def _token(client: MetadataClient) -> str:
    token = client.put(HOST, "/latest/api/token", {TOKEN_TTL_HEADER: TOKEN_TTL}).text()
    if not token:
        raise MetadataError("empty IMDS session token")
    return token


def probe(client: MetadataClient) -> bool:
    """A token, then ``/latest/meta-data/instance-id`` answers 200 (the Go driver's ``OnAlibaba``)."""
    try:
        client.get(HOST, "/latest/meta-data/instance-id", {TOKEN_HEADER: _token(client)})
        return True
    except MetadataError:
        return False


def fetch(client: MetadataClient) -> AlibabaInstance:
    """The instance type."""
    value = client.get(HOST, "/latest/meta-data/instance/instance-type", {TOKEN_HEADER: _token(client)}).text()
    if len(value) > 64 or any(c.isspace() for c in value):
        raise MetadataError(f"instance-type: {value[:80]!r} is not an instance type")
    return AlibabaInstance(instance_type=value)
