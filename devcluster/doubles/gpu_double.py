"""TEST DOUBLE for the NVIDIA GPU DRA driver (gpu.nvidia.com) - not the real driver.

It only publishes what the real driver would publish for the node's machine so that the
ResourceClaimTemplates of the training example (which also request 4 GPUs by ``resource.kubernetes.io/pciBusID``)
and the GPU-NIC pair templates (``matchAttribute`` on ``resource.kubernetes.io/pcieRoot``) can be
allocated: one ResourceSlice with the node's GPUs, each with its ``pciBusID`` and ``pcieRoot`` as
the node's fixture sysfs has them (:func:`fixture_gpus`; the 8 H100 of an Azure ND H100 v5 node
when there is none), and the ``gpu.nvidia.com`` DeviceClass. It never prepares anything: a GPU
claim is only ever allocated by the scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from driver.dra.slices import owner_reference
from driver.inventory.sysfs import SysfsReader
from driver.inventory.topology import read_gpus
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, KubeError, NotFound

GPU_DRIVER = "gpu.nvidia.com"

# ND H100 v5: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1 (PCI domains as Hyper-V exposes them).
ND_H100_V5_GPUS: tuple[tuple[str, int], ...] = (
    ("0001:00:00.0", 0),
    ("0002:00:00.0", 0),
    ("0003:00:00.0", 0),
    ("0008:00:00.0", 0),
    ("0009:00:00.0", 1),
    ("000a:00:00.0", 1),
    ("000b:00:00.0", 1),
    ("000c:00:00.0", 1),
)


# PCI device ID -> (productName, architecture, memory) of the GPUs the bundled topologies have.
PRODUCTS: dict[int, tuple[str, str, str]] = {
    0x2330: ("NVIDIA H100 80GB HBM3", "Hopper", "80Gi"),
    0x2941: ("NVIDIA GB200", "Blackwell", "186Gi"),
    0x31C2: ("NVIDIA GB300", "Blackwell", "279Gi"),
}
H100 = PRODUCTS[0x2330]


@dataclass(frozen=True)
class FakeGPU:
    """One GPU as the double publishes it. ``pcie_root`` empty: its PCI domain's host bridge
    (``pci<domain>:00``), as on ND H100 v5 where every GPU has a domain of its own."""

    index: int
    pci_bus_id: str
    numa_node: int | None
    pcie_root: str = ""
    product: tuple[str, str, str] = H100

    def to_api(self) -> dict[str, Any]:
        """The v1 device entry (attribute names modelled on the NVIDIA driver's)."""
        name, architecture, memory = self.product
        attributes: dict[str, Any] = {
            "resource.kubernetes.io/pciBusID": {"string": self.pci_bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": self.pcie_root or f"pci{self.pci_bus_id[:4]}:00"},
            f"{GPU_DRIVER}/productName": {"string": name},
            f"{GPU_DRIVER}/type": {"string": "gpu"},
            f"{GPU_DRIVER}/index": {"int": self.index},
            f"{GPU_DRIVER}/architecture": {"string": architecture},
        }
        if self.numa_node is not None:
            attributes[f"{GPU_DRIVER}/numaNode"] = {"int": self.numa_node}
        return {
            "name": f"gpu-{self.index}",
            "attributes": attributes,
            "capacity": {f"{GPU_DRIVER}/memory": {"value": memory}},
        }


def nd_h100_v5_gpus() -> list[FakeGPU]:
    """The 8 GPUs of an ND H100 v5 node."""
    return [FakeGPU(i, bus, numa) for i, (bus, numa) in enumerate(ND_H100_V5_GPUS)]


def fixture_gpus(sysfs_root: str) -> list[FakeGPU]:
    """The GPUs of a (fixture) sysfs tree, ``gpu-0``.. by bus ID, with the NUMA node and PCIe root
    sysfs gives them; the ND H100 v5 GPUs when the tree has none (or is not there)."""
    found = read_gpus(sysfs_root)
    if not found:
        return nd_h100_v5_gpus()
    sysfs = SysfsReader(sysfs_root)
    out = []
    for i, g in enumerate(sorted(found, key=lambda g: g.pci_bus_id)):
        device = sysfs.read_int(f"bus/pci/devices/{g.pci_bus_id}/device", 16) or 0
        product = PRODUCTS.get(device, ("NVIDIA GPU", "unknown", "80Gi"))
        out.append(FakeGPU(i, g.pci_bus_id, g.numa_node, g.pcie_root or "", product))
    return out


def device_class() -> dict[str, Any]:
    """The ``gpu.nvidia.com`` DeviceClass (as the NVIDIA chart installs it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    }


def gpu_slice(node_name: str, node_uid: str, gpus: Sequence[FakeGPU] | None = None) -> dict[str, Any]:
    """The double's one ResourceSlice for ``node_name`` (pool named after the node): ``gpus``,
    the ND H100 v5 ones by default."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "generateName": f"{node_name}-{GPU_DRIVER}-",
            "ownerReferences": [owner_reference(node_name, node_uid)],
        },
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [g.to_api() for g in (nd_h100_v5_gpus() if gpus is None else gpus)],
        },
    }


def install(kube: KubeClient, node_name: str, gpus: Sequence[FakeGPU] | None = None) -> dict[str, Any]:
    """Create the DeviceClass (if missing) and the node's GPU slice of ``gpus`` (default: ND H100
    v5's) if missing; returns the slice."""
    try:
        kube.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
    except KubeError as exc:
        if not isinstance(exc, Conflict):
            raise
    existing = kube.request(
        "GET",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver={GPU_DRIVER},spec.nodeName={node_name}"},
    )["items"]
    if existing:
        return existing[0]
    uid = kube.read_node(node_name)["metadata"]["uid"]
    return kube.request("POST", f"{RESOURCE_API}/resourceslices", gpu_slice(node_name, uid, gpus))


def uninstall(kube: KubeClient, node_name: str, delete_class: bool = False) -> None:
    """Remove the node's GPU slices (and optionally the DeviceClass)."""
    kube.request(
        "DELETE",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver={GPU_DRIVER},spec.nodeName={node_name}"},
    )
    if delete_class:
        try:
            kube.request("DELETE", f"{RESOURCE_API}/deviceclasses/{GPU_DRIVER}")
        except KubeError as exc:
            if not isinstance(exc, NotFound):
                raise
