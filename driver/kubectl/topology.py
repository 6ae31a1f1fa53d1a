"""``kubectl dranet topology`` and ``templates``: the local commands' matrix and aligned claim
templates, built from one node's ResourceSlices instead of its sysfs.

The same :class:`driver.inventory.topology.Topology` is filled in and printed by the same code, so
the two views cannot drift. What slices do not carry is left out, not guessed: PCIe switches
(two devices under one root complex show as ``PHB``, never ``PIX``/``PXB``) and the NUMA nodes'
CPU lists.
"""

from __future__ import annotations

from driver.inventory.topology import PciEndpoint, Topology
from driver.kubectl.cluster import NodeView


def topology_of(view: NodeView) -> Topology:
    """The node's GPUs and PCI NICs as the local ``dranet topology`` orders them (by bus ID)."""
    gpus = sorted((g for g in view.gpus if g.pciBusID), key=lambda g: g.pciBusID or "")
    nics = sorted((n for n in view.nics if n.pciBusID), key=lambda n: n.pciBusID or "")
    return Topology(
        gpus=[
            PciEndpoint(
                label=f"GPU{i}",
                pci_bus_id=g.pciBusID or "",
                numa_node=g.numaNode,
                pcie_root=g.pcieRoot,
                device_name=g.device,
            )
            for i, g in enumerate(gpus)
        ],
        nics=[
            PciEndpoint(
                label=f"NIC{i}",
                pci_bus_id=n.pciBusID or "",
                numa_node=n.numaNode,
                pcie_root=n.pcieRoot,
                device_name=n.device,
                rdma_device=n.rdmaDevice,
                netdevs=[n.ifName] if n.ifName else [],
            )
            for i, n in enumerate(nics)
        ],
        numa_cpulists={},
    )
