"""What the NRI CreateContainer adjustment adds for a container's ``dra.net`` devices.

Two things, both derived from the claim configs stored at prepare time
(:func:`driver.claims.decode.stored_config`) and the device snapshots in the checkpoint:

- environment: ``NCCL_IB_HCA`` / ``DRANET_RDMA_DEVICES`` naming the allocated RDMA devices
  (:func:`container_env`, unless ``rdma.injectEnv: false``);
- a cpuset on the NICs' NUMA node when ``numa.pin`` asks for it (:func:`numa_pin_node`,
  :func:`cpuset_for`), narrowed to the CPUs the kubelet gave the container and never widened.

:func:`container_settings` combines them for the NRI hooks; prepare calls :func:`numa_pin_node`
alone to refuse a claim whose NICs span NUMA nodes before the pod starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from driver.checkpoint import PreparedDevice
from driver.claims.decode import ConfigError, stored_config
from driver.model.device import DRIVER_NAME


@dataclass(frozen=True)
class CpusetPlan:
    """cpuset for a container pinned to one NUMA node (``linux.resources.cpu``)."""

    numa_node: int
    cpus: str  # the node's cpulist, e.g. "0-23,48-71"
    mems: str  # the node number, e.g. "0"


def container_env(devices: Iterable[tuple[dict[str, Any], str | None]]) -> dict[str, str]:
    """Environment for containers consuming the given devices.

    ``devices``: ``(PreparedDevice.config, RDMA device name or None)`` per allocated device
    (``PreparedDevice.snapshot.host.rdma_device``); see :func:`stored_config`.
    Returns ``NCCL_IB_HCA="=mlx5_0,mlx5_1"`` (a leading ``=`` is NCCL's exact-match form, so
    ``mlx5_1`` does not also select ``mlx5_10``) and ``DRANET_RDMA_DEVICES="mlx5_0,mlx5_1"``;
    empty when no device has RDMA or every RDMA device has ``rdma.injectEnv: false``.
    """
    hcas: list[str] = []
    for params, rdma_device in devices:
        if not rdma_device:
            continue
        config = stored_config(params)
        if config.rdma_env_enabled and rdma_device not in hcas:
            hcas.append(rdma_device)
    if not hcas:
        return {}
    hcas.sort()
    return {"NCCL_IB_HCA": "=" + ",".join(hcas), "DRANET_RDMA_DEVICES": ",".join(hcas)}


def numa_pin_node(devices: Iterable[tuple[dict[str, Any], int | None, str]], path: str = "numa.pin") -> int | None:
    """The NUMA node to pin to, or None when no device asks for pinning.

    ``devices``: ``(PreparedDevice.config, NUMA node or None, device name)``. Raises
    :class:`ConfigError` when pinning is asked for and the NICs span several NUMA nodes or a
    NIC's node is unknown. prepare calls it to refuse the claim early; the NRI hooks again.
    """
    wanted = False
    nodes: dict[int, list[str]] = {}
    unknown: list[str] = []
    for params, node, name in devices:
        config = stored_config(params)
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
            raise ConfigError("numa.pin", f"the container's CPUs ({requested}) are all outside NUMA node "
                                          f"{numa_node} ({format_cpulist(node_cpus)}); not pinning")
    return CpusetPlan(numa_node=numa_node, cpus=format_cpulist(cpus), mems=str(numa_node))


@dataclass(frozen=True)
class ContainerSettings:
    """What the NRI CreateContainer adjustment adds for a container's dra.net devices."""

    env: dict[str, str] = field(default_factory=dict)
    cpuset: CpusetPlan | None = None
    skipped_pin: str | None = None  # why numa.pin was asked for and not applied (for the log)


def container_settings(devices: Sequence[PreparedDevice], sysfs_root: str = "/sys",
                       requested_cpus: str | None = None) -> ContainerSettings:
    """Env and cpuset for a container consuming ``devices`` (``checkpoint.PreparedDevice``).

    ``requested_cpus`` is the container's cpuset in the CreateContainer request
    (``container.linux.resources.cpu.cpus``). Pinning problems never fail the container: prepare
    already refused claims whose NICs span NUMA nodes, so what is left here (an empty
    intersection with the kubelet's exclusive CPUs, a missing cpulist) is reported in
    ``skipped_pin`` and the container runs unpinned.
    """
    env = container_env((d.config, d.snapshot.host.rdma_device) for d in devices)
    cpuset, skipped = None, None
    try:
        node = numa_pin_node(
            ((d.config, device_numa_node(d), d.device) for d in devices), "numa.pin")
        if node is not None:
            cpuset = cpuset_for(node, sysfs_root, requested_cpus)
    except ConfigError as exc:
        skipped = str(exc)
    except OSError as exc:
        skipped = f"numa.pin: cannot read the NUMA node's CPUs: {exc}"
    return ContainerSettings(env=env, cpuset=cpuset, skipped_pin=skipped)


def device_numa_node(device: PreparedDevice) -> int | None:
    """The NUMA node of a ``PreparedDevice`` (its published attribute, else the host fact)."""
    attr = device.snapshot.attributes.get(f"{DRIVER_NAME}/numaNode")
    if isinstance(attr, int) and not isinstance(attr, bool):
        return attr
    return device.snapshot.host.numa_node
