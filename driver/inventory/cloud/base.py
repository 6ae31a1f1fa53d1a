"""What every provider answers: the attributes of one device and its provider network config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.model.device import AttributeValue


@dataclass(frozen=True)
class DeviceIdentifiers:
    """The locally discovered identity of a device, which a provider matches against its metadata
    (the Go driver's ``DeviceIdentifiers``: name, MAC, PCI address, plus what AWS and Alibaba ask)."""

    name: str
    mac: str | None = None  # lower-case, colon-separated, as sysfs writes it
    pci_address: str | None = None
    ifname: str | None = None
    rdma_device: str | None = None  # kernel RDMA name (mlx5_0, erdma_0)
    pci_driver: str | None = None  # the bound kernel driver (efa, mlx5_core)

    @property
    def rdma(self) -> bool:
        """Whether the device has an RDMA device."""
        return self.rdma_device is not None


class CloudInstance(Protocol):
    """One VM's metadata, fetched once; answers per device without I/O."""

    provider: str

    def device_attributes(self, device: DeviceIdentifiers) -> dict[str, AttributeValue]:
        """The provider's attributes of ``device`` (qualified names, e.g. ``gce.dra.net/block``)."""
        ...

    def device_config(self, device: DeviceIdentifiers) -> NetworkConfig | None:
        """The network config the provider requires for ``device`` (merged under the claim's), or None."""
        ...

    def summary(self) -> dict[str, object]:
        """What was learnt, for the log line that announces it."""
        ...


def normalize_mac(mac: str | None) -> str:
    """A MAC for comparison: lower case, no separators (Azure writes ``0011AAFFBB22``)."""
    return (mac or "").replace(":", "").replace("-", "").lower()
