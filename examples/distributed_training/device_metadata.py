"""The pod's NICs from the DRA device metadata files (Kubernetes 1.37's KEP-5304), standard library only.

dra.net writes one file per claim request into every container that uses the claim, at
``/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<pod claim>/<request>/dra.net-metadata.json``
(``resourceclaims/<claim>/...`` for a claim referenced by name). Each holds the request's NICs
as the pod sees them: the interface name, addresses, the RDMA device, the NUMA node and, in a
claim that also holds GPUs, the GPU each NIC pairs with. On clusters or drivers without the
files, :func:`read_nics` returns nothing and the benchmark falls back to the ``DRANET_*``
environment variables the driver also sets.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
DRIVER = "dra.net"


@dataclass(frozen=True)
class Nic:
    """One NIC of the pod, from its metadata."""

    interface: str  # the name inside the pod
    rdma_device: str | None
    numa_node: int | None
    gpu_bus_id: str | None  # the paired GPU's PCI bus ID
    gpu_path: str | None  # PIX, PXB, PHB, NODE, SYS


def _value(attributes: Mapping[str, Mapping[str, object]], name: str) -> object:
    entry = attributes.get(f"{DRIVER}/{name}") or {}
    return next(iter(entry.values()), None)


def _first_object(text: str) -> dict[str, object]:
    """The first object of the file's stream: the newest API version the driver wrote."""
    obj, _ = json.JSONDecoder().raw_decode(text.lstrip())
    return obj if isinstance(obj, dict) else {}


def metadata_files(root: str = CONTAINER_DIR) -> list[str]:
    """Every dra.net metadata file mounted in this container, sorted (claims by template or by name)."""
    return sorted(glob.glob(os.path.join(root, "*", "*", "*", f"{DRIVER}-metadata.json")))


def read_nics(files: Iterable[str] | None = None) -> list[Nic]:
    """The NICs of every metadata file, in file then device order; unreadable files are skipped."""
    nics: list[Nic] = []
    for path in metadata_files() if files is None else files:
        try:
            with open(path, encoding="utf-8") as f:
                doc = _first_object(f.read())
        except (OSError, ValueError):
            continue
        for request in doc.get("requests") or []:  # type: ignore[union-attr]
            for device in request.get("devices") or []:
                attrs = device.get("attributes") or {}
                network = device.get("networkData") or {}
                name = network.get("interfaceName") or _value(attrs, "podInterfaceName")
                if not name:
                    continue
                numa = _value(attrs, "numaNode")
                nics.append(
                    Nic(
                        interface=str(name),
                        rdma_device=str(_value(attrs, "rdmaDevice") or "") or None,
                        numa_node=numa if isinstance(numa, int) else None,
                        gpu_bus_id=str(_value(attrs, "gpuPciBusID") or "") or None,
                        gpu_path=str(_value(attrs, "gpuPath") or "") or None,
                    )
                )
    return nics


def nic_for_gpu(nics: Iterable[Nic], gpu_bus_id: str | None) -> Nic | None:
    """The NIC the driver paired with this rank's GPU, if any."""
    if not gpu_bus_id:
        return None
    want = gpu_bus_id.lower()
    return next((n for n in nics if n.gpu_bus_id and n.gpu_bus_id.lower() == want), None)


def common_numa_node(nics: Iterable[Nic]) -> int | None:
    """The NUMA node every NIC is on (None when unknown or when they differ)."""
    nodes = {n.numa_node for n in nics}
    return nodes.pop() if len(nodes) == 1 and None not in nodes else None
