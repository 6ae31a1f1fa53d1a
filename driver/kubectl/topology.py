"""``kubectl dranet topology`` and ``templates``: the local commands' matrix and aligned claim
templates, built from one node's ResourceSlices instead of its sysfs. With them come each GPU's
own NIC (``pairs``) and the ``--pair pcie-root`` templates.

The same :class:`driver.inventory.topology.Topology` is filled in and printed by the same code, so
the two views cannot drift. What slices do not carry is left out, not guessed: PCIe switches
(two devices under one root complex show as ``PHB``, never ``PIX``/``PXB``, so ``--pair
pcie-switch`` is refused) and the NUMA nodes' CPU lists. A NIC's ``pcieRoot`` is the published
one: for a ConnectX-8 with a Data Direct function, that function's root (the GPU's).
"""

from __future__ import annotations

from driver.inventory.topology import PciEndpoint, Topology
from driver.kubectl.cluster import Gpu, Nic, NodeView


def _endpoint(label: str, device: Gpu | Nic) -> PciEndpoint:
    nic = device if isinstance(device, Nic) else None
    return PciEndpoint(
        label=label,
        pci_bus_id=device.pciBusID or "",
        numa_node=device.numaNode,
        pcie_root=device.pcieRoot,
        device_name=device.device,
        rdma_device=nic.rdmaDevice if nic else None,
        netdevs=[nic.ifName] if nic and nic.ifName else [],
    )


def topology_of(view: NodeView) -> Topology:
    """The node's GPUs and PCI NICs as the local ``dranet topology`` orders them (by bus ID)."""
    gpus = sorted((g for g in view.gpus if g.pciBusID), key=lambda g: g.pciBusID or "")
    nics = sorted((n for n in view.nics if n.pciBusID), key=lambda n: n.pciBusID or "")
    return Topology(
        gpus=[_endpoint(f"GPU{i}", g) for i, g in enumerate(gpus)],
        nics=[_endpoint(f"NIC{i}", n) for i, n in enumerate(nics)],
        numa_cpulists={},
    )
