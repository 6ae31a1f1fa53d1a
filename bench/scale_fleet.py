"""A simulated fleet of GPU nodes for the scheduler benchmark: Node objects without kubelets,
each with the ResourceSlices this driver publishes for its shape and a GPU driver's slice.

Every node shape is a fixture sysfs tree (``devcluster/doubles/topologies``): the driver's own
:class:`Scanner` and default filter turn it into devices, the driver's own
:class:`SlicePublisher` writes them (LIST, plan, create or update), exactly what ``dranet run``
does on such a node. Nodes of one shape publish the same devices (the scheduler's work does not
depend on MAC values). The GPU slice is read from the same fixture tree (every ``0x0302``
function), with the attributes the NVIDIA DRA driver publishes.

This module is the benchmarks' one door into the driver's discovery and publishing code.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.cluster.controlplane import create_node
from devcluster.doubles.gpu_double import GPU_DRIVER, device_class
from devcluster.doubles.sysfs_fixture import build
from driver.config import DEFAULT_FILTER, DRIVER_NAME
from driver.dra.publisher import SlicePublisher
from driver.dra.slices import owner_reference
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner
from driver.kube.client import RESOURCE_API, KubeClient
from driver.model.device import Device

STANDARD = "resource.kubernetes.io"
D = f"{DRIVER_NAME}/"

GO_ATTRIBUTES = frozenset(
    [
        *(
            D + a
            for a in (
                "pciAddress",
                "pciVendor",
                "pciDevice",
                "pciSubsystem",
                "numaNode",
                "ifName",
                "mac",
                "mtu",
                "encapsulation",
                "alias",
                "state",
                "type",
                "ipv4",
                "ipv6",
                "tcFilterNames",
                "tcxProgramNames",
                "ebpf",
                "sriov",
                "sriovVfs",
                "isSriovVf",
                "virtual",
                "rdma",
                "rdmaDevice",
            )
        ),
        f"{STANDARD}/numaNode",
        f"{STANDARD}/pcieRoot",
    ]
)
"""The Go reference driver's attribute names (its ``pkg/apis/attributes.go``, no cloud provider)."""

VARIANTS = ("dranet", "go")
"""``dranet``: the devices as this driver publishes them; ``go``: cut to :data:`GO_ATTRIBUTES`."""


@dataclass(frozen=True)
class Shape:
    """One kind of node: its fixture topology, the interface carrying its default route."""

    name: str
    topology: str
    uplink: str


SHAPES = {
    "nd": Shape("nd", "nd-h100-v5", "eth0"),
    "dgx": Shape("dgx", "dgx-h100", "enp170s0f0np0"),
    "gb200": Shape("gb200", "gb200", "enP6p3s0f0np0"),
}
MIX = ("nd", "dgx", "nd", "dgx", "gb200")
"""Node i has shape ``MIX[i % 5]``: 40 % ND H100 v5, 40 % DGX H100, 20 % GB200 at every size."""


@dataclass(frozen=True)
class Gpu:
    """A GPU as the fixture tree shows it."""

    index: int
    bus_id: str
    numa: int
    pcie_root: str
    device_id: str


_GPU_MODELS = {
    "0x2330": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", "80Gi"),
    "0x2941": ("NVIDIA GB200", "Blackwell", "10.0", "186Gi"),
}


def fixture_gpus(root: Path) -> list[Gpu]:
    """The NVIDIA 3D controllers (class 0x0302) of a sysfs tree, in bus order."""
    out = []
    pci = root / "bus/pci/devices"
    for bdf in sorted(os.listdir(pci)):
        fn = pci / bdf
        if (fn / "class").read_text().startswith("0x0302") and (fn / "vendor").read_text().strip() == "0x10de":
            real = os.path.relpath(os.path.realpath(fn), os.path.realpath(root))
            out.append(
                Gpu(
                    len(out),
                    bdf,
                    int((fn / "numa_node").read_text()),
                    real.split("/")[1],  # devices/<pci host bridge>/...
                    (fn / "device").read_text().strip(),
                )
            )
    return out


def gpu_device(g: Gpu) -> dict[str, Any]:
    """The v1 device entry the NVIDIA GPU DRA driver publishes for ``g`` (its attribute names)."""
    product, arch, cc, memory = _GPU_MODELS.get(g.device_id, ("NVIDIA GPU", "unknown", "0.0", "80Gi"))
    a = {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{zlib.crc32(g.bus_id.encode()):08x}-0000-4000-8000-{g.index:012x}"},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": arch},
        "cudaComputeCapability": {"version": f"{cc}.0"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
        "index": {"int": g.index},
        "minor": {"int": g.index},
    }
    attrs = {f"{GPU_DRIVER}/{k}": v for k, v in a.items()}
    attrs[f"{STANDARD}/pciBusID"] = {"string": g.bus_id}
    attrs[f"{STANDARD}/pcieRoot"] = {"string": g.pcie_root}
    attrs[f"{STANDARD}/numaNode"] = {"int": g.numa}
    return {"name": f"gpu-{g.index}", "attributes": attrs, "capacity": {"memory": {"value": memory}}}


def gpu_slice(node: str, uid: str, gpus: list[Gpu]) -> dict[str, Any]:
    """The GPU driver's one ResourceSlice for ``node``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{GPU_DRIVER}-", "ownerReferences": [owner_reference(node, uid)]},
        "spec": {
            "driver": GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [gpu_device(g) for g in gpus],
        },
    }


def go_cut(devices: Iterable[Device]) -> list[Device]:
    """The same devices with only the attributes the Go driver publishes."""
    return [Device(d.name, {k: v for k, v in d.attributes.items() if k in GO_ATTRIBUTES}, d.host) for d in devices]


@dataclass
class ShapeDevices:
    """What a node of one shape publishes, per variant, and its GPUs."""

    shape: Shape
    devices: dict[str, list[Device]]
    gpus: list[Gpu]

    @property
    def product(self) -> str:
        """The GPUs' ``productName``."""
        return _GPU_MODELS.get(self.gpus[0].device_id, ("NVIDIA GPU",))[0]


def scan_shape(shape: Shape, work: Path) -> ShapeDevices:
    """Build the shape's fixture tree and run the driver's discovery and default filter on it."""
    root = build(shape.topology, work / shape.name)
    scanner = Scanner(str(root), netlink=False, exclude_interfaces=[shape.uplink], replay=False)
    try:
        devices = DeviceFilter(DEFAULT_FILTER).apply(scanner.scan())
    finally:
        scanner.close()
    return ShapeDevices(shape, {"dranet": devices, "go": go_cut(devices)}, fixture_gpus(root))


@dataclass
class FleetNode:
    name: str
    shape: str
    uid: str
    publisher: SlicePublisher


@dataclass
class Fleet:
    """The simulated nodes of one control plane; :meth:`grow` adds nodes, :meth:`publish` switches variants."""

    kube: KubeClient
    prefix: str = "gpu"
    workers: int = 8
    shapes: dict[str, ShapeDevices] = field(default_factory=dict)
    nodes: list[FleetNode] = field(default_factory=list)
    variant: str = "dranet"

    def __post_init__(self) -> None:
        with tempfile.TemporaryDirectory(prefix="dn-fleet-") as tmp:
            self.shapes = {name: scan_shape(s, Path(tmp)) for name, s in SHAPES.items()}
        try:
            self.kube.request("POST", f"{RESOURCE_API}/deviceclasses", device_class())
        except Exception as exc:
            if getattr(exc, "status", None) != 409:
                raise

    def _map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(fn, items))

    def grow(self, count: int) -> None:
        """Add nodes until there are ``count``, each with its GPU slice and this driver's slices."""

        def add(i: int) -> FleetNode:
            shape = MIX[i % len(MIX)]
            name = f"{self.prefix}-{shape}-{i:04d}"
            uid = create_node(self.kube, name, labels={"dranet.bench/shape": shape})["metadata"]["uid"]
            self.kube.request("POST", f"{RESOURCE_API}/resourceslices", gpu_slice(name, uid, self.shapes[shape].gpus))
            pub = SlicePublisher(self.kube, DRIVER_NAME, name)
            pub.node_uid = uid
            pub.update(self.shapes[shape].devices[self.variant])
            pub.sync()
            return FleetNode(name, shape, uid, pub)

        self.nodes += self._map(add, list(range(len(self.nodes), count)))

    def publish(self, variant: str) -> int:
        """Every node publishes ``variant`` (through its publisher: LIST, plan, PUT); returns writes."""
        self.variant = variant

        def one(n: FleetNode) -> int:
            n.publisher.update(self.shapes[n.shape].devices[variant])
            return n.publisher.sync().writes

        return sum(self._map(one, self.nodes))

    def count(self, shape: str) -> int:
        return sum(1 for n in self.nodes if n.shape == shape)
