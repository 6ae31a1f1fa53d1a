"""``dranet topology`` and ``dranet templates``: which NICs sit with which GPUs on this node.

``topology`` prints a matrix in the spirit of ``nvidia-smi topo -m`` over the node's GPUs and
the NICs this driver publishes, plus each NUMA node's CPU list. ``templates`` turns the same
facts into NUMA-aligned ResourceClaimTemplates in the examples' form (GPUs by ``pciBusID``, RDMA
NICs by ``dra.net/numaNode``), one per NUMA node that can hold the request.

NICs come from :class:`driver.inventory.discovery.Scanner`, so the tool shows exactly the devices (and
attribute values) a claim can select; GPUs are read from sysfs directly because another
driver publishes them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from driver.config import DEVICE_CLASS, DRIVER_NAME
from driver.inventory.discovery import Scanner
from driver.inventory.sysfs import BDF_RE, SysfsReader, pcie_root_of
from driver.model.device import STANDARD_DOMAIN

# Relations, best first (as nvidia-smi orders them).
PIX, PXB, PHB, NODE, SYS, UNKNOWN = "PIX", "PXB", "PHB", "NODE", "SYS", "UNK"
LEGEND: dict[str, str] = {
    "X": "self",
    SYS: "across NUMA nodes (traverses the inter-socket interconnect)",
    NODE: "same NUMA node, different PCIe host bridges (root complexes)",
    PHB: "same PCIe host bridge (root complex), no shared switch",
    PXB: "same PCIe switch hierarchy, through more than one switch",
    PIX: "same PCIe switch (at most one switch between them)",
    UNKNOWN: "NUMA node unknown (sysfs numa_node = -1) on different root complexes",
}

GPU_VENDOR_CLASSES: dict[int, str] = {0x10DE: "gpu.nvidia.com", 0x1002: "gpu.amd.com"}
"""GPU vendors we know a DRA DeviceClass for (the class ``templates`` writes)."""
DEFAULT_GPU_DEVICE_CLASS = "gpu.nvidia.com"


@dataclass
class PciEndpoint:
    """A GPU or NIC as the matrix sees it: bus ID, NUMA node and the bridges above it."""

    label: str  # GPU0, NIC0, ...
    pci_bus_id: str
    numa_node: int | None
    pcie_root: str | None
    bridges: list[str] = field(default_factory=list)  # BDFs from the root port down, excluding self
    vendor: str | None = None
    device_name: str | None = None  # dra.net device name (NICs)
    rdma_device: str | None = None
    netdevs: list[str] = field(default_factory=list)


@dataclass
class Topology:
    """Everything ``dranet topology`` prints."""

    gpus: list[PciEndpoint]
    nics: list[PciEndpoint]
    numa_cpulists: dict[int, str]

    def relation(self, a: PciEndpoint, b: PciEndpoint) -> str:
        """The PIX/PXB/PHB/NODE/SYS relation of two devices (``X`` for a device and itself)."""
        return relation(a, b)

    def matrix(self) -> dict[str, dict[str, str]]:
        """Row label -> column label -> relation, over GPUs then NICs."""
        every = self.gpus + self.nics
        return {a.label: {b.label: relation(a, b) for b in every} for a in every}

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``--output json``."""
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "nics": [asdict(n) for n in self.nics],
            "matrix": self.matrix(),
            "numaNodes": {str(k): {"cpulist": v} for k, v in sorted(self.numa_cpulists.items())},
            "legend": LEGEND,
        }


def relation(a: PciEndpoint, b: PciEndpoint) -> str:
    """Classify the PCIe/NUMA path between two devices like ``nvidia-smi topo -m``.

    Bridges are compared as sysfs paths: a bridge both devices hang under is a shared switch (or
    root port). PIX when each device is at most one bridge below the deepest shared one (one
    switch between them), PXB when deeper, PHB when they only share the host bridge.
    """
    if a.pci_bus_id == b.pci_bus_id:
        return "X"
    if a.pcie_root and a.pcie_root == b.pcie_root:
        shared = 0
        for x, y in zip(a.bridges, b.bridges, strict=False):
            if x != y:
                break
            shared += 1
        if shared == 0:
            return PHB
        if len(a.bridges) - shared <= 1 and len(b.bridges) - shared <= 1:
            return PIX
        return PXB
    if a.numa_node is None or b.numa_node is None:
        return UNKNOWN
    return NODE if a.numa_node == b.numa_node else SYS


def _endpoint(sysfs: SysfsReader, bdf: str, label: str) -> PciEndpoint:
    base = f"bus/pci/devices/{bdf}"
    real = sysfs.resolve(base) or ""
    numa = sysfs.read_int(f"{base}/numa_node")
    root = pcie_root_of(real)
    parts = real.split("/")
    # Bridges are the BDF components between the host bridge and the function itself.
    start = parts.index(root) + 1 if root in parts else 0
    bridges = [p for p in parts[start:-1] if BDF_RE.match(p)]
    return PciEndpoint(
        label=label,
        pci_bus_id=bdf,
        numa_node=numa if numa is not None and numa >= 0 else None,
        pcie_root=root,
        bridges=bridges,
        vendor=sysfs.read(f"{base}/vendor"),
    )


def _is_gpu(pci_class: int, vendor: int | None) -> bool:
    # 0x0302 (3D controller) is what datacenter GPUs report. VGA (0x0300) and display (0x0380)
    # only count for GPU vendors: VMs expose emulated VGA adapters that are not accelerators.
    if pci_class >> 8 == 0x0302:
        return True
    return pci_class >> 8 in (0x0300, 0x0380) and vendor in GPU_VENDOR_CLASSES


def read_topology(sysfs_root: str = "/sys", exclude_interfaces: Sequence[str] = ()) -> Topology:
    """Read the GPUs, the published PCI NICs and the NUMA CPU lists of one sysfs tree.

    ``exclude_interfaces`` works as for ``dranet run``: on the host the uplink is found from
    the default route, but a fixture tree has no netlink, so tests name it.
    """
    sysfs = SysfsReader(sysfs_root)
    gpus: list[PciEndpoint] = []
    for bdf in sysfs.listdir("bus/pci/devices"):
        cls = sysfs.read_int(f"bus/pci/devices/{bdf}/class", 16)
        vendor = sysfs.read_int(f"bus/pci/devices/{bdf}/vendor", 16)
        if cls is not None and _is_gpu(cls, vendor):
            gpus.append(_endpoint(sysfs, bdf, f"GPU{len(gpus)}"))

    nics: list[PciEndpoint] = []
    scanned = [
        d for d in Scanner(sysfs_root, exclude_interfaces=exclude_interfaces, replay=False).scan() if d.host.pci_address
    ]
    for dev in sorted(scanned, key=lambda d: d.host.pci_address or ""):
        nic = _endpoint(sysfs, dev.host.pci_address or "", f"NIC{len(nics)}")
        nic.device_name = dev.name
        nic.rdma_device = dev.host.rdma_device
        nic.netdevs = [dev.host.ifname] if dev.host.ifname else []
        nics.append(nic)

    cpulists: dict[int, str] = {}
    for entry in sysfs.listdir("devices/system/node"):
        if entry.startswith("node") and entry[4:].isdigit():
            cpulists[int(entry[4:])] = sysfs.read(f"devices/system/node/{entry}/cpulist") or ""
    return Topology(gpus=gpus, nics=nics, numa_cpulists=cpulists)


def render_table(topo: Topology, out: TextIO) -> None:
    """Write the ``nvidia-smi topo -m`` style matrix, device list, NUMA CPUs and legend."""
    every = topo.gpus + topo.nics
    if not every:
        out.write("no GPUs or published NICs found\n")
    else:
        matrix = topo.matrix()
        width = max(6, *(len(e.label) + 2 for e in every))
        out.write(" " * width + "".join(e.label.ljust(width) for e in every) + "NUMA Affinity\n")
        for a in every:
            numa = "N/A" if a.numa_node is None else str(a.numa_node)
            out.write(
                a.label.ljust(width) + "".join(matrix[a.label][b.label].ljust(width) for b in every) + numa + "\n"
            )
        out.write("\nDevices:\n")
        for e in every:
            extra = ", ".join(x for x in [e.device_name or "", e.rdma_device or "", *e.netdevs] if x)
            out.write(f"  {e.label}: {e.pci_bus_id} root={e.pcie_root or '?'}{' (' + extra + ')' if extra else ''}\n")
    if topo.numa_cpulists:  # not known from ResourceSlices (kubectl dranet)
        out.write("\nNUMA nodes:\n")
        for node, cpus in sorted(topo.numa_cpulists.items()):
            out.write(f"  node{node}: CPUs {cpus or '(none)'}\n")
    out.write("\nLegend:\n")
    for key, text in LEGEND.items():
        out.write(f"  {key:<5}= {text}\n")


def _excluded(args: argparse.Namespace) -> list[str]:
    # --exclude-interfaces is optional on these subcommands (same meaning as for `dranet run`).
    return [i for i in (getattr(args, "exclude_interfaces", "") or "").split(",") if i]


def cli_topology(args: argparse.Namespace) -> int:
    """``dranet topology [--sysfs-root DIR] [--output json|table]``."""
    topo = read_topology(args.sysfs_root, _excluded(args))
    if args.output == "json":
        json.dump(topo.to_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        render_table(topo, sys.stdout)
    return 0


# -- templates ---------------------------------------------------------------------------------


@dataclass
class AlignedChoice:
    """The GPUs of one NUMA node chosen for an aligned template."""

    numa_node: int
    gpu_bus_ids: list[str]
    gpu_device_class: str


class NoAlignmentError(Exception):
    """No NUMA node holds enough GPUs and RDMA NICs for the request."""


def aligned_choices(topo: Topology, gpus: int) -> list[AlignedChoice]:
    """One choice per NUMA node with at least ``gpus`` GPUs and ``gpus`` RDMA NICs, by node id."""
    if gpus < 1:
        raise NoAlignmentError("--gpus must be at least 1")
    counts: dict[int, tuple[list[PciEndpoint], int]] = {}
    for node in sorted({e.numa_node for e in topo.gpus + topo.nics if e.numa_node is not None}):
        node_gpus = [g for g in topo.gpus if g.numa_node == node]
        rdma_nics = sum(1 for n in topo.nics if n.numa_node == node and n.rdma_device)
        counts[node] = (node_gpus, rdma_nics)
    choices: list[AlignedChoice] = []
    for node, (node_gpus, rdma_nics) in counts.items():
        if len(node_gpus) >= gpus and rdma_nics >= gpus:
            picked = sorted(node_gpus, key=lambda g: g.pci_bus_id)[:gpus]
            vendor = int(picked[0].vendor, 16) if picked[0].vendor else None
            choices.append(
                AlignedChoice(
                    node, [g.pci_bus_id for g in picked], GPU_VENDOR_CLASSES.get(vendor or 0, DEFAULT_GPU_DEVICE_CLASS)
                )
            )
    if not choices:
        have = (
            ", ".join(f"NUMA {n}: {len(g)} GPUs, {r} RDMA NICs" for n, (g, r) in counts.items())
            or "no NUMA information"
        )
        raise NoAlignmentError(f"no NUMA node has {gpus} GPUs and {gpus} RDMA NICs ({have})")
    return choices


def render_template(choice: AlignedChoice, gpus: int, nic_class: str = DEVICE_CLASS, gpu_class: str = "") -> str:
    """One ResourceClaimTemplate in the examples' form (folded CEL, bus IDs in a list); the GPU
    request names ``gpu_class``, else the class of the GPUs' vendor."""
    ids = ", ".join(f'"{b}"' for b in choice.gpu_bus_ids)
    return f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {gpus}gpu-{gpus}nic-numa{choice.numa_node}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: {gpu_class or choice.gpu_device_class}
          count: {gpus}
          selectors:
          - cel:
              expression: >-
                device.attributes["{STANDARD_DOMAIN}"]["pciBusID"] in
                [{ids}]
      - name: nic
        exactly:
          deviceClassName: {nic_class}
          count: {gpus}
          selectors:
          - cel:
              expression: >-
                device.attributes["{DRIVER_NAME}"]["rdma"] == true &&
                device.attributes["{DRIVER_NAME}"]["numaNode"] == {choice.numa_node}
"""


def cli_templates(args: argparse.Namespace) -> int:
    """``dranet templates --gpus N [--sysfs-root DIR] [--nic-class C] [--gpu-class C]``: aligned
    templates on stdout."""
    try:
        choices = aligned_choices(read_topology(args.sysfs_root, _excluded(args)), args.gpus)
    except NoAlignmentError as err:
        sys.stderr.write(f"dranet templates: {err}\n")
        return 1
    sys.stdout.write("---\n".join(render_template(c, args.gpus, args.nic_class, args.gpu_class) for c in choices))
    return 0
