"""``dranet topology`` and ``dranet templates``: which NICs sit with which GPUs on this node.

``topology`` prints a matrix in the spirit of ``nvidia-smi topo -m`` over the node's GPUs and
the NICs this driver publishes (the PCIe path class of every GPU-NIC pair: PIX, PXB, PHB, NODE,
SYS), each GPU's own NIC (``pairs``), and each NUMA node's CPU list. ``templates`` turns the same
facts into ResourceClaimTemplates in the examples' form: NUMA-aligned by default (GPUs by
``pciBusID``, RDMA NICs by ``dra.net/numaNode``, one per NUMA node that can hold the request), or
with ``--pair`` one NIC per GPU: ``pcie-root`` (a ``matchAttribute`` on
``resource.kubernetes.io/pcieRoot`` per GPU/NIC pair, portable across nodes of one shape) or
``pcie-switch`` (GPUs and NICs by bus ID, each pair under one PCIe switch: PIX or PXB, where NCCL
uses GPUDirect RDMA by default).

NICs come from :class:`driver.inventory.discovery.Scanner`, so the tool shows exactly the devices (and
attribute values) a claim can select; GPUs are read from sysfs directly because another
driver publishes them. A ConnectX-8 NIC whose DMA goes through a Data Direct function is placed
where that function is (its published ``pcieRoot``), see :func:`driver.inventory.sysfs.data_direct_for`.
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
from driver.inventory.sysfs import BDF_RE, SysfsReader, data_direct_for, pcie_root_of
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
PATH_RANK: dict[str, int] = {p: i for i, p in enumerate((PIX, PXB, PHB, NODE, SYS, UNKNOWN))}
"""Path classes, best (shortest PCIe path) first."""
SWITCH_PATHS = frozenset({PIX, PXB})
"""Under one PCIe switch: where NCCL uses GPUDirect RDMA by default (``NCCL_NET_GDR_LEVEL`` PXB)."""

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
    data_direct: str | None = None  # the Data Direct DMA function whose place (root, bridges) this NIC takes

    def describe(self) -> str:
        """``0000:18:00.0 (mlx5_0, ibp24s0)``: bus ID, RDMA device, netdev, Data Direct function."""
        extra = [x for x in (self.rdma_device, *self.netdevs) if x]
        if self.data_direct:
            extra.append(f"DMA via Data Direct {self.data_direct}")
        return f"{self.pci_bus_id} ({', '.join(extra)})" if extra else self.pci_bus_id


@dataclass(frozen=True)
class Pair:
    """One GPU and the NIC that goes with it, and the PCIe path class between them."""

    gpu: PciEndpoint
    nic: PciEndpoint
    path: str

    def to_json(self) -> dict[str, Any]:
        """A ``pairs`` entry of ``--output json``."""
        return {
            "gpu": self.gpu.label,
            "gpuPciBusID": self.gpu.pci_bus_id,
            "nic": self.nic.label,
            "nicPciBusID": self.nic.pci_bus_id,
            "nicDevice": self.nic.device_name,
            "rdmaDevice": self.nic.rdma_device,
            "pcieRoot": self.nic.pcie_root if self.nic.pcie_root == self.gpu.pcie_root else None,
            "dataDirect": self.nic.data_direct,
            "path": self.path,
        }


def pair_up(
    gpus: Sequence[PciEndpoint], nics: Sequence[PciEndpoint], paths: frozenset[str] | None = None
) -> list[Pair]:
    """One NIC per GPU, the shortest PCIe paths paired first (ties by GPU, then NIC bus ID).

    Only RDMA NICs take part (GPUDirect RDMA needs one); ``paths``: only pairs of these classes.
    Greedy by path class: on PCIe trees (a NIC is close to the GPUs of its own switch or root
    only) it pairs as many GPUs at the best class as any matching would.
    """
    options = sorted(
        (PATH_RANK.get(path, len(PATH_RANK)), g.pci_bus_id, n.pci_bus_id, path, g, n)
        for g in gpus
        for n in nics
        if n.rdma_device
        for path in (relation(g, n),)
        if paths is None or path in paths
    )
    pairs: list[Pair] = []
    taken: set[str] = set()
    for _, gpu_bus, nic_bus, path, gpu, nic in options:
        if gpu_bus in taken or nic_bus in taken:
            continue
        taken |= {gpu_bus, nic_bus}
        pairs.append(Pair(gpu, nic, path))
    return sorted(pairs, key=lambda p: p.gpu.pci_bus_id)


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

    def pairs(self) -> list[Pair]:
        """Each GPU's own RDMA NIC (one NIC per GPU, the closest first), by GPU bus ID."""
        return pair_up(self.gpus, self.nics)

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``--output json``."""
        return {
            "gpus": [asdict(g) for g in self.gpus],
            "nics": [asdict(n) for n in self.nics],
            "matrix": self.matrix(),
            "pairs": [p.to_json() for p in self.pairs()],
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
    # A NIC whose DMA goes through a Data Direct function is, for GPUDirect RDMA, where that
    # function is: its root and bridges place the NIC (the published pcieRoot says the same).
    direct = data_direct_for(sysfs, bdf).function
    if direct is not None:
        real = direct.real_path
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
        data_direct=direct.pci_address if direct is not None else None,
    )


def _is_gpu(pci_class: int, vendor: int | None) -> bool:
    # 0x0302 (3D controller) is what datacenter GPUs report. VGA (0x0300) and display (0x0380)
    # only count for GPU vendors: VMs expose emulated VGA adapters that are not accelerators.
    if pci_class >> 8 == 0x0302:
        return True
    return pci_class >> 8 in (0x0300, 0x0380) and vendor in GPU_VENDOR_CLASSES


def _gpus(sysfs: SysfsReader) -> list[PciEndpoint]:
    gpus: list[PciEndpoint] = []
    for bdf in sysfs.listdir("bus/pci/devices"):
        cls = sysfs.read_int(f"bus/pci/devices/{bdf}/class", 16)
        vendor = sysfs.read_int(f"bus/pci/devices/{bdf}/vendor", 16)
        if cls is not None and _is_gpu(cls, vendor):
            gpus.append(_endpoint(sysfs, bdf, f"GPU{len(gpus)}"))
    return gpus


def read_gpus(sysfs_root: str = "/sys") -> list[PciEndpoint]:
    """The GPUs of one sysfs tree (``GPU0``.. by bus ID) with their NUMA node and PCIe root."""
    return _gpus(SysfsReader(sysfs_root))


def read_topology(sysfs_root: str = "/sys", exclude_interfaces: Sequence[str] = ()) -> Topology:
    """Read the GPUs, the published PCI NICs and the NUMA CPU lists of one sysfs tree.

    ``exclude_interfaces`` works as for ``dranet run``: on the host the uplink is found from
    the default route, but a fixture tree has no netlink, so tests name it.
    """
    sysfs = SysfsReader(sysfs_root)
    gpus = _gpus(sysfs)
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
            direct = f" via Data Direct {e.data_direct}" if e.data_direct else ""
            out.write(
                f"  {e.label}: {e.pci_bus_id} root={e.pcie_root or '?'}{direct}{' (' + extra + ')' if extra else ''}\n"
            )
        render_pairs(topo, out)
    if topo.numa_cpulists:  # not known from ResourceSlices (kubectl dranet)
        out.write("\nNUMA nodes:\n")
        for node, cpus in sorted(topo.numa_cpulists.items()):
            out.write(f"  node{node}: CPUs {cpus or '(none)'}\n")
    out.write("\nLegend:\n")
    for key, text in LEGEND.items():
        out.write(f"  {key:<5}= {text}\n")


def render_pairs(topo: Topology, out: TextIO) -> None:
    """Each GPU's own RDMA NIC and the path class between them (``-``: no RDMA NIC left for it)."""
    if not topo.gpus:
        return
    by_gpu = {p.gpu.pci_bus_id: p for p in topo.pairs()}
    out.write(
        "\nPairs (each GPU's own RDMA NIC, the closest first; NCCL uses GPUDirect RDMA by default at PXB or closer):\n"
    )
    for gpu in topo.gpus:
        pair = by_gpu.get(gpu.pci_bus_id)
        if pair is None:
            out.write(f"  {gpu.label}  -     no RDMA NIC left for it\n")
        else:
            out.write(f"  {gpu.label}  {pair.path:<5} {pair.nic.label}: {pair.nic.describe()}\n")


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
    numa_published: bool = True
    """False on a host of one NUMA node whose PCI functions report ``numa_node = -1`` (a VM):
    every device is on that node, but the NICs publish no ``numaNode`` to select on."""


class NoAlignmentError(Exception):
    """No NUMA node holds enough GPUs and RDMA NICs for the request."""


def aligned_choices(topo: Topology, gpus: int) -> list[AlignedChoice]:
    """One choice per NUMA node with at least ``gpus`` GPUs and ``gpus`` RDMA NICs, by node id."""
    if gpus < 1:
        raise NoAlignmentError("--gpus must be at least 1")
    counts: dict[int, tuple[list[PciEndpoint], int]] = {}
    every = topo.gpus + topo.nics
    # One NUMA node and no function saying where it sits (numa_node = -1, as in VMs whose
    # firmware gives no proximity): every device is on that node, so nothing needs aligning.
    single = len(topo.numa_cpulists) == 1 and all(e.numa_node is None for e in every)
    if single:
        (node,) = topo.numa_cpulists
        counts[node] = (list(topo.gpus), sum(1 for n in topo.nics if n.rdma_device))
    for node in sorted({e.numa_node for e in every if e.numa_node is not None}):
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
                    node,
                    [g.pci_bus_id for g in picked],
                    GPU_VENDOR_CLASSES.get(vendor or 0, DEFAULT_GPU_DEVICE_CLASS),
                    numa_published=not single,
                )
            )
    if not choices:
        have = (
            ", ".join(
                f"NUMA {n}{' (the only node; sysfs numa_node = -1)' if single else ''}: {len(g)} GPUs, {r} RDMA NICs"
                for n, (g, r) in counts.items()
            )
            or "no NUMA information"
        )
        raise NoAlignmentError(f"no NUMA node has {gpus} GPUs and {gpus} RDMA NICs ({have})")
    return choices


def render_template(choice: AlignedChoice, gpus: int, nic_class: str = DEVICE_CLASS, gpu_class: str = "") -> str:
    """One ResourceClaimTemplate in the examples' form (folded CEL, bus IDs in a list); the GPU
    request names ``gpu_class``, else the class of the GPUs' vendor."""
    ids = ", ".join(f'"{b}"' for b in choice.gpu_bus_ids)
    nic_numa = (
        f' &&\n                device.attributes["{DRIVER_NAME}"]["numaNode"] == {choice.numa_node}'
        if choice.numa_published
        else ""
    )
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
                device.attributes["{DRIVER_NAME}"]["rdma"] == true{nic_numa}
"""


# -- GPU-NIC pair templates --------------------------------------------------------------------

PCIE_ROOT, PCIE_SWITCH = "pcie-root", "pcie-switch"
PAIR_MODES: tuple[str, ...] = (PCIE_ROOT, PCIE_SWITCH)
"""``--pair``: one NIC per GPU by ``resource.kubernetes.io/pcieRoot``, or by the PCIe switch between them."""


class NoPairingError(Exception):
    """The node cannot give each GPU of the request a NIC of its own under its root (or switch)."""


@dataclass
class PairTemplate:
    """One ResourceClaimTemplate of ``--pair``: its name, mode and the pairs it stands for on this node."""

    name: str
    mode: str
    pairs: list[Pair]
    gpu_device_class: str
    available: int = 0  # how many such pairs this node has (pcie-root: the template takes the first)


def _gpu_class(gpus: Sequence[PciEndpoint]) -> str:
    vendor = int(gpus[0].vendor, 16) if gpus and gpus[0].vendor else 0
    return GPU_VENDOR_CLASSES.get(vendor, DEFAULT_GPU_DEVICE_CLASS)


def _own_domains(topo: Topology) -> bool:
    """Whether every GPU and RDMA NIC is alone in a PCI domain of its own (Hyper-V: Azure ND VMs)."""
    ends = topo.gpus + [n for n in topo.nics if n.rdma_device]
    domains = [e.pci_bus_id.split(":")[0] for e in ends]
    return len(ends) > 1 and len(set(domains)) == len(domains)


def _why_unpaired(topo: Topology, gpu: PciEndpoint, mode: str, taken: Sequence[Pair]) -> str:
    """Why ``gpu`` gets no NIC in ``mode`` (``taken``: the pairs made), naming its closest RDMA NIC
    and what to use instead."""
    rdma = [n for n in topo.nics if n.rdma_device]
    if mode == PCIE_ROOT:
        shares, near = "shares a PCIe root with", [n for n in rdma if gpu.pcie_root and n.pcie_root == gpu.pcie_root]
    else:
        shares, near = "shares a PCIe switch with", [n for n in rdma if relation(gpu, n) in SWITCH_PATHS]
    if near:
        holders = {p.nic.pci_bus_id: p.gpu.pci_bus_id for p in taken}
        busy = ", ".join(f"NIC {n.pci_bus_id} (with GPU {holders.get(n.pci_bus_id, '?')})" for n in near)
        return f"every RDMA NIC that {shares} GPU {gpu.pci_bus_id} is paired with another GPU: {busy}"
    text = f"no RDMA NIC {shares} GPU {gpu.pci_bus_id} (root {gpu.pcie_root or '?'})"
    if _own_domains(topo):
        return (
            f"{text}: every GPU and RDMA NIC here has a PCI domain of its own, as on Azure ND VMs (Hyper-V gives "
            "each device its own), so none pairs by pcieRoot or switch; use the NUMA-aligned templates (without --pair)"
        )
    if rdma:
        best = min(rdma, key=lambda n: (PATH_RANK.get(relation(gpu, n), len(PATH_RANK)), n.pci_bus_id))
        return f"{text}: its closest is NIC {best.pci_bus_id} ({relation(gpu, best)}); use the NUMA-aligned templates"
    return f"{text}: there is no RDMA NIC"


def pair_templates(topo: Topology, gpus: int, mode: str) -> list[PairTemplate]:
    """The ``--pair`` templates of ``gpus`` GPU/NIC pairs each (raises :class:`NoPairingError`).

    ``pcie-root``: one template; its pairs are what this node would give (the scheduler picks by
    pcieRoot on any node). ``pcie-switch``: pairs of class PIX or PXB, grouped ``gpus`` at a time
    (by NUMA node, then GPU bus ID) into one template each.
    """
    if mode not in PAIR_MODES:
        raise NoPairingError(f"--pair {mode!r}: must be one of {', '.join(PAIR_MODES)}")
    if gpus < 1:
        raise NoPairingError("--gpus must be at least 1")
    if not topo.gpus:
        raise NoPairingError("no GPUs found")
    if gpus > len(topo.gpus):
        raise NoPairingError(f"--gpus {gpus}: this node has {len(topo.gpus)} GPUs")
    if mode == PCIE_ROOT:
        pairs = [p for p in pair_up(topo.gpus, topo.nics) if p.gpu.pcie_root and p.gpu.pcie_root == p.nic.pcie_root]
    else:
        pairs = pair_up(topo.gpus, topo.nics, SWITCH_PATHS)
    if len(pairs) < gpus:
        paired = {p.gpu.pci_bus_id for p in pairs}
        lonely = next(g for g in sorted(topo.gpus, key=lambda g: g.pci_bus_id) if g.pci_bus_id not in paired)
        have = f"only {len(pairs)} of {len(topo.gpus)} GPUs pair, --gpus asks for {gpus}; " if pairs else ""
        raise NoPairingError(have + _why_unpaired(topo, lonely, mode, pairs))
    gpu_class = _gpu_class(topo.gpus)
    if mode == PCIE_ROOT:
        return [PairTemplate(f"{gpus}gpu-{gpus}nic-pcie-root", mode, pairs[:gpus], gpu_class, len(pairs))]
    ordered = sorted(pairs, key=lambda p: (p.gpu.numa_node if p.gpu.numa_node is not None else -1, p.gpu.pci_bus_id))
    groups = [ordered[i : i + gpus] for i in range(0, len(ordered) - gpus + 1, gpus)]
    return [
        PairTemplate(f"{gpus}gpu-{gpus}nic-pcie-switch-{i}", mode, g, gpu_class, len(pairs))
        for i, g in enumerate(groups)
    ]


def _request(name: str, device_class: str, expression: str | None) -> str:
    text = f"""      - name: {name}
        exactly:
          deviceClassName: {device_class}
          count: 1
"""
    if expression:
        text += f"""          selectors:
          - cel:
              expression: >-
                {expression}
"""
    return text


def render_pair_template(
    template: PairTemplate,
    nic_class: str = DEVICE_CLASS,
    gpu_class: str = "",
    source: str = "dranet templates",
    switches_known: bool = True,
) -> str:
    """One ``--pair`` ResourceClaimTemplate: requests ``gpu-i`` and ``nic-i`` (one device each,
    each GPU followed by its NIC so the scheduler settles a pair before the next), a comment with
    the pairs and their path class on this node. ``switches_known``: False when the topology came
    from ResourceSlices, which show roots but no PCIe switches."""
    rdma = f'device.attributes["{DRIVER_NAME}"]["rdma"] == true'
    bus = f'device.attributes["{STANDARD_DOMAIN}"]["pciBusID"]'
    if template.mode == PCIE_ROOT:
        head = [
            f"# {source} --pair {PCIE_ROOT}: gpu-i and nic-i (an RDMA NIC) under the same PCIe root, by a",
            f"# matchAttribute on {STANDARD_DOMAIN}/pcieRoot per pair: no bus IDs, so it fits every node of",
            f"# this shape. This node has {template.available} such pairs; the scheduler may give, e.g.:",
        ]
    else:
        head = [
            f"# {source} --pair {PCIE_SWITCH}: gpu-i and nic-i by bus ID, each pair under one PCIe switch",
            "# (PIX or PXB, where NCCL uses GPUDirect RDMA by default; NCCL_NET_GDR_LEVEL). The pairs:",
        ]
    for i, p in enumerate(template.pairs):
        path = p.path if switches_known else f"same root {p.nic.pcie_root}"
        head.append(f"#   gpu-{i} {p.gpu.pci_bus_id} + nic-{i} {p.nic.describe()}: {path}")
    requests, constraints = "", ""
    for i, p in enumerate(template.pairs):
        if template.mode == PCIE_ROOT:
            requests += _request(f"gpu-{i}", gpu_class or template.gpu_device_class, None)
            requests += _request(f"nic-{i}", nic_class, rdma)
            constraints += f"""      - requests: [gpu-{i}, nic-{i}]
        matchAttribute: {STANDARD_DOMAIN}/pcieRoot
"""
        else:
            requests += _request(f"gpu-{i}", gpu_class or template.gpu_device_class, f'{bus} == "{p.gpu.pci_bus_id}"')
            requests += _request(f"nic-{i}", nic_class, f'{rdma} &&\n                {bus} == "{p.nic.pci_bus_id}"')
    body = f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: {template.name}
spec:
  spec:
    devices:
      requests:
{requests}"""
    if constraints:
        body += "      constraints:\n" + constraints
    return "\n".join(head) + "\n" + body


def cli_templates(args: argparse.Namespace) -> int:
    """``dranet templates --gpus N [--pair pcie-root|pcie-switch] [--sysfs-root DIR] [--nic-class C]
    [--gpu-class C]``: NUMA-aligned (default) or GPU-NIC pair templates on stdout; 1 when the node
    cannot hold them (the reason on stderr)."""
    topo = read_topology(args.sysfs_root, _excluded(args))
    pair = getattr(args, "pair", None)
    try:
        if pair:
            pairs = pair_templates(topo, args.gpus, pair)
            docs = [render_pair_template(t, args.nic_class, args.gpu_class) for t in pairs]
        else:
            choices = aligned_choices(topo, args.gpus)
            docs = [render_template(c, args.gpus, args.nic_class, args.gpu_class) for c in choices]
    except (NoAlignmentError, NoPairingError) as err:
        sys.stderr.write(f"dranet templates: {err}\n")
        return 1
    sys.stdout.write("---\n".join(docs))
    return 0


# -- one device at a time (the claims' GPU pairing) ---------------------------------------------


def pci_endpoint(sysfs_root: str, bdf: str) -> PciEndpoint:
    """One PCI function as the matrix sees it (its NUMA node, root and bridges), labelled by bus ID."""
    return _endpoint(SysfsReader(sysfs_root), bdf, bdf)


def is_gpu_function(sysfs_root: str, bdf: str) -> bool:
    """Whether sysfs shows ``bdf`` as a GPU (its PCI class and vendor; False when not readable)."""
    sysfs = SysfsReader(sysfs_root)
    cls = sysfs.read_int(f"bus/pci/devices/{bdf}/class", 16)
    return cls is not None and _is_gpu(cls, sysfs.read_int(f"bus/pci/devices/{bdf}/vendor", 16))
