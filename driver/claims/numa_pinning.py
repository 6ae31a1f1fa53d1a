"""NUMA pinning of a claim's consumers: which node (``numa.pin``) and which cpuset.

prepare calls :func:`numa_pin_node` to refuse a claim whose NICs span NUMA nodes before any pod
starts; :mod:`driver.claims.container_settings` calls it again with :func:`cpuset_for` when a
container is created. CPUs come from the kernel's cpulist files under sysfs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import PreparedDevice
from driver.config import DRIVER_NAME


@dataclass(frozen=True)
class CpusetPlan:
    """cpuset for a container pinned to one NUMA node (``linux.resources.cpu``)."""

    numa_node: int
    cpus: str  # the node's cpulist, e.g. "0-23,48-71"
    mems: str  # the node number, e.g. "0"


def numa_pin_node(devices: Iterable[tuple[NetworkConfig, int | None, str]], path: str = "numa.pin") -> int | None:
    """The NUMA node to pin to, or None when no device asks for pinning.

    ``devices``: ``(config, NUMA node or None, device name)``. Raises :class:`ConfigError` when
    pinning is asked for and the NICs span several NUMA nodes or a NIC's node is unknown.
    """
    wanted = False
    nodes: dict[int, list[str]] = {}
    unknown: list[str] = []
    for config, node, name in devices:
        wanted = wanted or config.numa_pin
        if node is None or node < 0:
            unknown.append(name)
        else:
            nodes.setdefault(node, []).append(name)
    if not wanted:
        return None
    if unknown:
        raise ConfigError(path, f"cannot pin: the NUMA node of {', '.join(sorted(unknown))} is unknown")
    if len(nodes) != 1:
        spans = "; ".join(f"node {n}: {', '.join(sorted(d))}" for n, d in sorted(nodes.items()))
        raise ConfigError(path, f"cannot pin to one NUMA node: the claim's NICs span several ({spans})")
    return next(iter(nodes))


def device_numa_node(device: PreparedDevice) -> int | None:
    """The NUMA node of a ``PreparedDevice`` (its published attribute, else the host fact)."""
    attr = device.snapshot.attributes.get(f"{DRIVER_NAME}/numaNode")
    if isinstance(attr, int) and not isinstance(attr, bool):
        return attr
    return device.snapshot.host.numa_node


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0,1,2,3,8,10,11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> ``"0-3,8"``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def cpuset_for(numa_node: int, sysfs_root: str = "/sys", requested: str | None = None) -> CpusetPlan:
    """The cpuset pinning a container to ``numa_node``.

    CPUs come from ``<sysfs>/devices/system/node/node<N>/cpulist``. ``requested`` is the
    cpuset the kubelet asked for in CreateContainer (``linux.resources.cpu.cpus``), if any. We
    only narrow it and never widen it: the result is the intersection, so CPUs the kubelet's
    static CPU manager gave another container exclusively are never added. An empty intersection
    raises :class:`ConfigError`. That happens when the kubelet gave this container exclusive CPUs
    on another node, and then the container must not be pinned.
    """
    cpulist = Path(sysfs_root, "devices/system/node", f"node{numa_node}", "cpulist")
    node_cpus = parse_cpulist(cpulist.read_text())
    if not node_cpus:
        raise ConfigError("numa.pin", f"NUMA node {numa_node} has no CPUs ({cpulist} is empty)")
    cpus = node_cpus
    if requested and requested.strip():
        cpus = node_cpus & parse_cpulist(requested)
        if not cpus:
            raise ConfigError(
                "numa.pin",
                f"the container's CPUs ({requested}) are all outside NUMA node "
                f"{numa_node} ({format_cpulist(node_cpus)}); not pinning",
            )
    return CpusetPlan(numa_node=numa_node, cpus=format_cpulist(cpus), mems=str(numa_node))
