"""What the NRI CreateContainer adjustment adds for a container's ``dra.net`` devices.

Two things, both derived from the typed claim configs and the device snapshots that prepare
stored in the checkpoint:

- environment: ``NCCL_IB_HCA`` / ``DRANET_RDMA_DEVICES`` naming the allocated RDMA devices
  (:func:`container_env`, unless ``rdma.injectEnv: false``), and ``DRANET_INTERFACES`` naming
  the NICs' interfaces inside the pod (:func:`interfaces_env`), for socket transports that
  choose interfaces by name (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``);
- a cpuset on the NICs' NUMA node when ``numa.pin`` asks for it
  (:mod:`driver.claims.numa_pinning`), narrowed to the CPUs the kubelet gave the container and
  never widened.

:func:`settings_for_container` combines them for the NRI hooks.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import PreparedDevice
from driver.claims.numa_pinning import CpusetPlan, cpuset_for, device_numa_node, numa_pin_node


def container_env(devices: Iterable[tuple[NetworkConfig, str | None]]) -> dict[str, str]:
    """Environment for containers consuming the given devices.

    ``devices``: ``(config, RDMA device name or None)`` per allocated device
    (``PreparedDevice.config``, ``PreparedDevice.snapshot.host.rdma_device``).
    Returns ``NCCL_IB_HCA="=mlx5_0,mlx5_1"`` (a leading ``=`` is NCCL's exact-match form, so
    ``mlx5_1`` does not also select ``mlx5_10``) and ``DRANET_RDMA_DEVICES="mlx5_0,mlx5_1"``;
    empty when no device has RDMA or every RDMA device has ``rdma.injectEnv: false``.
    """
    hcas: list[str] = []
    for config, rdma_device in devices:
        if rdma_device and config.rdma_env_enabled and rdma_device not in hcas:
            hcas.append(rdma_device)
    if not hcas:
        return {}
    hcas.sort()
    return {"NCCL_IB_HCA": "=" + ",".join(hcas), "DRANET_RDMA_DEVICES": ",".join(hcas)}


def interfaces_env(devices: Iterable[PreparedDevice]) -> dict[str, str]:
    """``DRANET_INTERFACES="ib0,ib1"``: the pod-side names of the devices' netdevs, sorted (so
    every worker of a job lists its NICs in the same order); empty without netdevs."""
    names = sorted(
        {
            (d.config.interface.name if d.config.interface and d.config.interface.name else None)
            or d.snapshot.host.ifname
            or ""
            for d in devices
            if d.moves  # a netdev, not a VF on vfio-pci
        }
    )
    return {"DRANET_INTERFACES": ",".join(names)} if names else {}


def roce_gid_index(sysfs_root: str, rdma_device: str, address: str) -> int | None:
    """The index of the RoCE v2 GID the kernel made for ``address`` (an address of a sub-interface
    of the RDMA device's netdev: an IPv4 one is in the table as ``::ffff:a.b.c.d``, an IPv6 one as
    itself) on the device's Ethernet port; None when there is none.

    The GID table (``/sys/class/infiniband/<dev>/ports/<n>/gids/<i>``, ``gid_attrs/types/<i>``)
    holds one entry per address of the port's netdev and its upper devices (macvlan, ipvlan): a
    pod sharing a RoCE NIC must use its own, or its traffic carries another pod's address."""
    ip = ipaddress.ip_address(address)
    mapped = (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip).exploded
    ports = Path(sysfs_root, "class/infiniband", rdma_device, "ports")
    try:
        port_dirs = sorted(ports.iterdir())
    except OSError:
        return None
    for port in port_dirs:
        if _read(port / "link_layer") != "Ethernet":
            continue
        for gid in sorted((port / "gids").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
            if _read(gid) == mapped and _read(port / "gid_attrs/types" / gid.name) == "RoCE v2":
                return int(gid.name)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def pod_gid_index(sysfs_root: str, rdma_device: str, cidrs: Iterable[str]) -> int | None:
    """The RoCE v2 GID index of the first of a pod's addresses (CIDRs) that has one: its IPv4 ones
    first, else a global IPv6 one (IPv6-only clusters); never a link-local one."""
    ips = [a.split("/", 1)[0] for a in cidrs]
    ips = [a for a in ips if ":" not in a] + [a for a in ips if ":" in a and not a.lower().startswith("fe80")]
    return next((i for i in (roce_gid_index(sysfs_root, rdma_device, a) for a in ips) if i is not None), None)


def gid_env(
    devices: Iterable[PreparedDevice], addresses: Mapping[str, Sequence[str]], sysfs_root: str
) -> dict[str, str]:
    """``NCCL_IB_GID_INDEX`` of the RoCE GID of the pod's own sub-interface address (its IPv4 one
    first, else a global IPv6 one: IPv6-only clusters), when every RDMA sub-interface of the pod
    has one and they agree (NCCL takes one index for every HCA)."""
    found = set()
    for d in devices:
        rdma = d.snapshot.host.rdma_device
        if not (d.sub_interface and rdma and d.config.rdma_env_enabled):
            continue
        index = pod_gid_index(sysfs_root, rdma, addresses.get(d.device, ()))
        if index is None:
            return {}
        found.add(index)
    return {"NCCL_IB_GID_INDEX": str(found.pop())} if len(found) == 1 else {}


@dataclass(frozen=True)
class ContainerSettings:
    """What the NRI CreateContainer adjustment adds for a container's dra.net devices."""

    env: dict[str, str] = field(default_factory=dict)
    cpuset: CpusetPlan | None = None
    skipped_pin: str | None = None  # why numa.pin was asked for and not applied (for the log)


def settings_for_container(
    devices: Sequence[PreparedDevice],
    sysfs_root: str = "/sys",
    requested_cpus: str | None = None,
    addresses: Mapping[str, Sequence[str]] | None = None,
) -> ContainerSettings:
    """Env and cpuset for a container consuming ``devices`` (``checkpoint.state.PreparedDevice``).

    ``requested_cpus`` is the container's cpuset in the CreateContainer request
    (``container.linux.resources.cpu.cpus``). Pinning problems never fail the container: prepare
    already refused claims whose NICs span NUMA nodes, so what is left here (an empty
    intersection with the kubelet's exclusive CPUs, a missing cpulist) is reported in
    ``skipped_pin`` and the container runs unpinned. ``addresses``: the pod's sub-interfaces'
    addresses by device, for the RoCE GID index (:func:`gid_env`).
    """
    # A VF on vfio-pci has no RDMA device of the kernel's in the pod: user space drives it.
    env = container_env((d.config, None if d.vfio else d.snapshot.host.rdma_device) for d in devices)
    env |= interfaces_env(devices)
    env |= gid_env(devices, addresses or {}, sysfs_root)
    cpuset, skipped = None, None
    try:
        node = numa_pin_node(((d.config, device_numa_node(d), d.device) for d in devices), "numa.pin")
        if node is not None:
            cpuset = cpuset_for(node, sysfs_root, requested_cpus)
    except ConfigError as exc:
        skipped = str(exc)
    except OSError as exc:
        skipped = f"numa.pin: cannot read the NUMA node's CPUs: {exc}"
    return ContainerSettings(env=env, cpuset=cpuset, skipped_pin=skipped)
