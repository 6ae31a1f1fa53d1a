"""TEST DOUBLE for the NVIDIA GPU DRA driver (gpu.nvidia.com) - not the real driver.

It only publishes what the real driver would publish for an Azure ND H100 v5 node so that the
ResourceClaimTemplates of the training example (which also request 4 GPUs by ``resource.kubernetes.io/pciBusID``)
can be allocated: one ResourceSlice with the 8 H100 GPUs, and the ``gpu.nvidia.com``
DeviceClass. It never prepares anything: a GPU claim is only ever allocated by the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from driver.dra.slices import owner_reference
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


@dataclass(frozen=True)
class FakeGPU:
    """One GPU as the double publishes it."""

    index: int
    pci_bus_id: str
    numa_node: int

    def to_api(self) -> dict[str, Any]:
        """The v1 device entry (attribute names modelled on the NVIDIA driver's)."""
        return {
            "name": f"gpu-{self.index}",
            "attributes": {
                "resource.kubernetes.io/pciBusID": {"string": self.pci_bus_id},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci{self.pci_bus_id[:4]}:00"},
                f"{GPU_DRIVER}/productName": {"string": "NVIDIA H100 80GB HBM3"},
                f"{GPU_DRIVER}/type": {"string": "gpu"},
                f"{GPU_DRIVER}/index": {"int": self.index},
                f"{GPU_DRIVER}/numaNode": {"int": self.numa_node},
                f"{GPU_DRIVER}/architecture": {"string": "Hopper"},
            },
            "capacity": {f"{GPU_DRIVER}/memory": {"value": "80Gi"}},
        }


def nd_h100_v5_gpus() -> list[FakeGPU]:
    """The 8 GPUs of an ND H100 v5 node."""
    return [FakeGPU(i, bus, numa) for i, (bus, numa) in enumerate(ND_H100_V5_GPUS)]


def device_class() -> dict[str, Any]:
    """The ``gpu.nvidia.com`` DeviceClass (as the NVIDIA chart installs it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": GPU_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    }


def gpu_slice(node_name: str, node_uid: str) -> dict[str, Any]:
    """The double's one ResourceSlice for ``node_name`` (pool named after the node)."""
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
            "devices": [g.to_api() for g in nd_h100_v5_gpus()],
        },
    }


def install(kube: KubeClient, node_name: str) -> dict[str, Any]:
    """Create the DeviceClass (if missing) and the node's GPU slice (if missing); returns the slice."""
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
    return kube.request("POST", f"{RESOURCE_API}/resourceslices", gpu_slice(node_name, uid))


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
