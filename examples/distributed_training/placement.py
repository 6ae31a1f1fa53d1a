"""Where one training rank runs: its GPU's NUMA node (CPUs and memory) and the HCAs NCCL uses.

Standard library only (it ships in the benchmark ConfigMap and runs in any training image,
where the driver is not installed), so the cpulist parser here is a deliberate copy of
``driver.claims.container_settings.parse_cpulist`` (this one returns a sorted list and rejects
reversed ranges).

Rules (seed 004): a device ``numa_node`` of ``-1`` means the firmware did not say, so the rank
runs unbound rather than mis-bound; binding is skipped on single-NUMA machines, where there is
no remote node to avoid; memory uses libnuma's *preferred* policy, not ``membind``, because a
strict bind fails allocations instead of spilling when the node fills up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # loaded by file path in the tests: no import at run time
    from device_metadata import Nic

log = logging.getLogger("placement")


def parse_cpulist(text: str) -> list[int]:
    """Parse a kernel cpulist (``0-23,48-71``; empty = no CPUs) into sorted CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        lo = int(first)
        hi = int(last) if sep else lo
        if hi < lo:
            raise ValueError(f"bad cpulist range {part!r}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def device_numa_node(pci_bus_id: str, sysfs_root: str = "/sys") -> int | None:
    """The NUMA node of a PCI device, or None when sysfs says ``-1`` or nothing."""
    text = _read(os.path.join(sysfs_root, "bus/pci/devices", pci_bus_id.lower(), "numa_node"))
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def numa_nodes(sysfs_root: str = "/sys") -> dict[int, list[int]]:
    """NUMA node id -> CPU ids, from ``devices/system/node/node<N>/cpulist``."""
    base = os.path.join(sysfs_root, "devices/system/node")
    try:
        entries = os.listdir(base)
    except OSError:
        return {}
    out: dict[int, list[int]] = {}
    for entry in entries:
        if entry.startswith("node") and entry[4:].isdigit():
            out[int(entry[4:])] = parse_cpulist(_read(os.path.join(base, entry, "cpulist")) or "")
    return out


@dataclass(frozen=True)
class Binding:
    """What a rank was bound to; ``summary`` goes into the ``MFU_RESULT`` line."""

    node: int | None
    cpus: tuple[int, ...]
    memory: str  # "preferred", "no-libnuma", "node-unknown-to-libnuma", "-"
    reason: str

    @property
    def summary(self) -> str:
        """``node0``, or ``none`` when unbound."""
        return "none" if self.node is None else f"node{self.node}"


def plan_binding(node: int | None, nodes: Mapping[int, list[int]], allowed: set[int]) -> Binding:
    """Decide a rank's CPU set from its GPU's node, the node CPU lists and the CPUs it may use.

    ``allowed`` is the process's current affinity (the container's cpuset): pinning outside
    it is impossible, so the binding is the intersection, and no binding when that is empty.
    """
    if len(nodes) <= 1:
        return Binding(None, (), "-", "single NUMA node: nothing to align")
    if node is None:
        return Binding(None, (), "-", "GPU NUMA node unknown (numa_node = -1): running unbound")
    if node not in nodes:
        return Binding(None, (), "-", f"NUMA node {node} has no cpulist")
    cpus = tuple(c for c in nodes[node] if c in allowed)
    if not cpus:
        return Binding(None, (), "-", f"no CPU of NUMA node {node} in this container's cpuset")
    return Binding(node, cpus, "-", "bound to the GPU's NUMA node")


def _libnuma() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("numa")
    for candidate in ([name] if name else []) + ["libnuma.so.1"]:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        if lib.numa_available() >= 0:
            return lib
    return None


def _set_all_threads(cpus: set[int]) -> None:
    # sched_setaffinity(0) pins only the calling thread; threads torch already started
    # (e.g. its intra-op pool) would stay unbound, so pin every task of the process.
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # the thread exited meanwhile


def apply_binding(binding: Binding) -> Binding:
    """Pin this process's threads to ``binding.cpus`` and prefer the node's memory (libnuma)."""
    if binding.node is None:
        return binding
    _set_all_threads(set(binding.cpus))
    lib = _libnuma()
    if lib is None:
        return Binding(binding.node, binding.cpus, "no-libnuma", binding.reason)
    # libnuma sees the kernel's nodes, which a --sysfs-root tree may not match.
    if binding.node > lib.numa_max_node():
        return Binding(binding.node, binding.cpus, "node-unknown-to-libnuma", binding.reason)
    lib.numa_set_preferred(ctypes.c_int(binding.node))
    return Binding(binding.node, binding.cpus, "preferred", binding.reason)


def bind_rank(pci_bus_id: str | None, sysfs_root: str = "/sys", nic_node: int | None = None) -> Binding:
    """Bind the calling process to the NUMA node of its GPU (``pci_bus_id``; None on CPU), else
    to ``nic_node``, the node of the pod's NICs (from the device metadata)."""
    node = device_numa_node(pci_bus_id, sysfs_root) if pci_bus_id else None
    if node is None:
        node = nic_node
    binding = plan_binding(node, numa_nodes(sysfs_root), set(os.sched_getaffinity(0)))
    return apply_binding(binding)


@dataclass(frozen=True)
class RepinWorker:
    """DataLoader ``worker_init_fn``: re-apply the rank's CPU set inside each worker.

    Affinity survives ``fork`` but not ``spawn``/``forkserver``, and the policy may have been
    changed in between, so each worker re-asserts it. No CUDA calls here: CUDA in a DataLoader
    worker is unsupported.
    """

    cpus: tuple[int, ...]

    def __call__(self, worker_id: int) -> None:
        """Pin the worker (a picklable callable, so it works with spawn)."""
        if self.cpus:
            os.sched_setaffinity(0, set(self.cpus))


def nccl_ib_hca(env: Mapping[str, str], nics: Sequence[Nic] = ()) -> tuple[str | None, str]:
    """The ``NCCL_IB_HCA`` value this rank should use and where it came from.

    ``NCCL_IB_HCA`` (set by the user or injected by the driver) wins as is. Otherwise the RDMA
    devices of the pod's NICs in the device metadata files (``nics``), else the driver's
    ``DRANET_RDMA_DEVICES`` (comma-separated RDMA devices of this pod's claim), in the exact-match
    form ``=mlx5_0,mlx5_1``: without ``=`` NCCL treats each name as a prefix, and ``mlx5_1``
    would also select ``mlx5_10``..``mlx5_19``.
    """
    current = env.get("NCCL_IB_HCA", "").strip()
    if current:
        return current, "NCCL_IB_HCA"
    from_metadata = sorted({n.rdma_device for n in nics if n.rdma_device})
    if from_metadata:
        return "=" + ",".join(from_metadata), "device metadata"
    devices = [d.strip() for d in env.get("DRANET_RDMA_DEVICES", "").split(",") if d.strip()]
    if devices:
        return "=" + ",".join(devices), "DRANET_RDMA_DEVICES"
    return None, "unset: NCCL picks HCAs itself"


def gloo_socket_ifname(env: Mapping[str, str], nics: Sequence[Nic] = ()) -> tuple[str | None, str]:
    """The ``GLOO_SOCKET_IFNAME`` this rank should use and where it came from.

    ``GLOO_SOCKET_IFNAME`` (set by the user) wins as is. Otherwise the pod's interfaces from the
    device metadata files (``nics``), else the driver's ``DRANET_INTERFACES`` (the pod's
    interfaces from dra.net claims, comma-separated), sorted so every worker lists them in the
    same order: gloo opens one device per interface and spreads collectives over them, each
    talking to the same-numbered interface of its peers, i.e. rail to rail.
    """
    current = env.get("GLOO_SOCKET_IFNAME", "").strip()
    if current:
        return current, "GLOO_SOCKET_IFNAME"
    from_metadata = sorted({n.interface for n in nics})
    if from_metadata:
        return ",".join(from_metadata), "device metadata"
    names = [n.strip() for n in env.get("DRANET_INTERFACES", "").split(",") if n.strip()]
    if names:
        return ",".join(names), "DRANET_INTERFACES"
    return None, "unset: gloo uses the interface of the host name"
