"""What the cluster publishes, as typed rows: each node's NICs (this driver's slices) and GPUs
(other drivers' slices), and which claims hold them.

Read with a namespace user's rights: every ResourceSlice, and the claims of every namespace when
the user may list them, else of their own namespace only (:attr:`ClusterView.claims_scope` says
which, so a device held by a claim the user cannot see shows as unknown, not as free).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from driver.config import DRIVER_NAME
from driver.kube.client import KubeClient
from driver.kube.errors import Forbidden
from driver.model.device import STANDARD_DOMAIN, AttributeValue, attribute_from_api, first_int

GPU_DRIVERS = ("gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com")
"""DRA drivers whose devices are GPUs (besides any device whose ``<driver>/type`` is ``gpu``)."""

ALL_NAMESPACES = "all namespaces"
UNKNOWN = "?"
"""Allocated-to of a device when the user may not list every namespace's claims."""


@dataclass
class SliceDevice:
    """One device of one ResourceSlice, attributes decoded under their qualified names."""

    driver: str
    pool: str
    node: str
    name: str
    attributes: dict[str, AttributeValue]
    taints: list[dict[str, Any]] = field(default_factory=list)

    def attr(self, name: str, domain: str = DRIVER_NAME) -> AttributeValue | None:
        """Attribute ``name`` of ``domain`` (``numaNode`` of ``dra.net``)."""
        return self.attributes.get(f"{domain}/{name}")

    @property
    def numa_node(self) -> int | None:
        """The device's NUMA node: its driver's ``numaNode``, else the standard one (its first entry)."""
        for value in (
            self.attr("numaNode", self.driver),
            self.attr("numaNode"),
            self.attr("numaNode", STANDARD_DOMAIN),
        ):
            node = first_int(value)
            if node is not None and node >= 0:
                return node
        return None

    @property
    def pci_bus_id(self) -> str | None:
        value = self.attr("pciBusID", STANDARD_DOMAIN)
        return value if isinstance(value, str) else None

    @property
    def pcie_root(self) -> str | None:
        value = self.attr("pcieRoot", STANDARD_DOMAIN)
        return value if isinstance(value, str) else None


@dataclass
class Nic:
    """A device of this driver on a node (a row of ``kubectl dranet nodes``)."""

    node: str
    device: str
    ifName: str | None  # noqa: N815 - JSON output names follow the API's camelCase
    numaNode: int | None  # noqa: N815
    rdma: bool
    rdmaDevice: str | None  # noqa: N815
    linkLayer: str | None  # noqa: N815
    state: str | None
    pciBusID: str | None  # noqa: N815
    pcieRoot: str | None  # noqa: N815
    taints: list[str]
    allocatedTo: str | None  # noqa: N815 - "ns/claim", None when free, "?" when not visible


@dataclass
class Gpu:
    """A GPU of another driver on a node."""

    node: str
    driver: str
    device: str
    numaNode: int | None  # noqa: N815
    pciBusID: str | None  # noqa: N815
    pcieRoot: str | None  # noqa: N815
    allocatedTo: str | None  # noqa: N815


@dataclass
class NodeView:
    """One node: its NICs and GPUs, and per NUMA node how many of each (and free)."""

    name: str
    nics: list[Nic]
    gpus: list[Gpu]

    def numa_summary(self) -> list[dict[str, Any]]:
        """Per NUMA node: GPUs and RDMA NICs, how many are held by claims the caller can see, and
        how many are free (None when some may be held by claims the caller cannot see)."""
        known = [n.numaNode for n in self.nics] + [g.numaNode for g in self.gpus]
        out = []
        for numa in sorted({n for n in known if n is not None}):
            entry: dict[str, Any] = {"numaNode": numa}
            for name, devices in (
                ("Gpus", [g.allocatedTo for g in self.gpus if g.numaNode == numa]),
                ("RdmaNics", [n.allocatedTo for n in self.nics if n.numaNode == numa and n.rdma]),
            ):
                entry[name[0].lower() + name[1:]] = len(devices)
                entry[f"held{name}"] = sum(1 for a in devices if a not in (None, UNKNOWN))
                entry[f"free{name}"] = None if UNKNOWN in devices else sum(1 for a in devices if a is None)
            out.append(entry)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nics": [asdict(n) for n in self.nics],
            "gpus": [asdict(g) for g in self.gpus],
            "numa": self.numa_summary(),
        }


def decode_slices(slices: Iterable[dict[str, Any]]) -> list[SliceDevice]:
    """Every device of ``slices`` (the newest generation of each pool only: older slices are being
    replaced), attribute values decoded; unqualified names belong to the driver's domain."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        driver, pool_name = str(spec.get("driver") or ""), str(pool.get("name") or "")
        if int(pool.get("generation") or 0) < newest[(driver, pool_name)]:
            continue
        for dev in spec.get("devices") or []:
            attrs: dict[str, AttributeValue] = {}
            for name, encoded in (dev.get("attributes") or {}).items():
                try:
                    attrs[name if "/" in name else f"{driver}/{name}"] = attribute_from_api(encoded)
                except (ValueError, TypeError, KeyError):
                    continue  # an attribute type this tool does not know: not needed here
            node = str(spec.get("nodeName") or pool_name)
            out.append(SliceDevice(driver, pool_name, node, str(dev.get("name")), attrs, dev.get("taints") or []))
    return out


def is_gpu(device: SliceDevice, gpu_drivers: Iterable[str] = GPU_DRIVERS) -> bool:
    """A GPU: a device of a known GPU driver, or one whose driver calls its type ``gpu``."""
    return device.driver in set(gpu_drivers) or device.attr("type", device.driver) == "gpu"


@dataclass
class Allocations:
    """(driver, pool, device) -> ``namespace/claim`` of the claims the user may read."""

    holders: dict[tuple[str, str, str], str]
    scope: str  # ALL_NAMESPACES, or the one namespace whose claims were read

    def holder(self, driver: str, pool: str, device: str) -> str | None:
        """Who holds the device: a claim, None (free), or ``?`` (maybe a claim the user cannot see)."""
        found = self.holders.get((driver, pool, device))
        if found is not None or self.scope == ALL_NAMESPACES:
            return found
        return UNKNOWN


def claim_holders(claims: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> ``namespace/name`` of each allocated claim."""
    out = {}
    for c in claims:
        meta = c.get("metadata") or {}
        results = (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        for r in results:
            out[(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))] = (
                f"{meta.get('namespace')}/{meta.get('name')}"
            )
    return out


def read_allocations(kube: KubeClient, namespace: str) -> Allocations:
    """Every namespace's claims when the user may list them, else their own namespace's."""
    try:
        items: list[dict[str, Any]] = []
        cont = None
        while True:
            page = kube.list_resource_claim_for_all_namespaces(cont=cont)
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                break
        return Allocations(claim_holders(items), ALL_NAMESPACES)
    except Forbidden:
        own = kube.list_namespaced_resource_claim(namespace).get("items") or []
        return Allocations(claim_holders(own), namespace)


def node_views(
    devices: list[SliceDevice],
    allocations: Allocations,
    driver_name: str = DRIVER_NAME,
    gpu_drivers: Iterable[str] = GPU_DRIVERS,
    only: str | None = None,
) -> list[NodeView]:
    """One :class:`NodeView` per node with devices of this driver or GPUs (``only``: that node)."""
    gpu_drivers = tuple(gpu_drivers)
    nodes: dict[str, NodeView] = {}
    for d in sorted(devices, key=lambda d: (d.node, d.pci_bus_id or "", d.name)):
        if only is not None and d.node != only:
            continue
        view = nodes.setdefault(d.node, NodeView(d.node, [], []))
        holder = allocations.holder(d.driver, d.pool, d.name)
        if d.driver == driver_name:
            rdma_device, layer, state, ifname = (d.attr(n) for n in ("rdmaDevice", "linkLayer", "state", "ifName"))
            view.nics.append(
                Nic(
                    node=d.node,
                    device=d.name,
                    ifName=ifname if isinstance(ifname, str) else None,
                    numaNode=d.numa_node,
                    rdma=d.attr("rdma") is True,
                    rdmaDevice=rdma_device if isinstance(rdma_device, str) else None,
                    linkLayer=layer if isinstance(layer, str) else None,
                    state=state if isinstance(state, str) else None,
                    pciBusID=d.pci_bus_id,
                    pcieRoot=d.pcie_root,
                    taints=[f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}" for t in d.taints],
                    allocatedTo=holder,
                )
            )
        elif is_gpu(d, gpu_drivers):
            view.gpus.append(Gpu(d.node, d.driver, d.name, d.numa_node, d.pci_bus_id, d.pcie_root, holder))
    return [nodes[n] for n in sorted(nodes) if nodes[n].nics or nodes[n].gpus]


def read_slices(kube: KubeClient, node: str | None = None) -> list[SliceDevice]:
    """Every driver's ResourceSlices (of ``node`` only when given), decoded."""
    selector = f"spec.nodeName={node}" if node else ""
    return decode_slices(kube.list_resource_slice(selector).get("items") or [])
