"""The list form of ``resource.kubernetes.io/numaNode`` (KEP-6072 with KEP-5491's list attributes).

The device's own (physical) NUMA node first, then the other nodes of the same socket at the
smallest ACPI SLIT distance from it, in ascending order: what Kubernetes'
``deviceattribute.GetNUMANodeAttributeByPCIBusID`` publishes in its list form and what the Go
driver publishes with ``--feature-gates DRAListTypeAttributes=true``. A node whose socket cannot
be told (a CPU-less memory node) is kept rather than dropped, as upstream does; without a
readable distance table the list is just the physical node.
"""

from __future__ import annotations

from driver.inventory.sysfs import SysfsReader


def _first_cpu(cpulist: str | None) -> int | None:
    if not cpulist:
        return None
    first = cpulist.split(",", 1)[0].split("-", 1)[0].strip()
    return int(first) if first.isdigit() else None


def socket_of(sysfs: SysfsReader, node: int) -> int | None:
    """The physical package of ``node``'s first CPU, or None (no CPUs, unreadable)."""
    cpu = _first_cpu(sysfs.read(f"devices/system/node/node{node}/cpulist"))
    if cpu is None:
        return None
    return sysfs.read_int(f"devices/system/cpu/cpu{cpu}/topology/physical_package_id")


def numa_node_list(sysfs: SysfsReader, node: int) -> list[int]:
    """``[node, same-socket nodes at the minimum SLIT distance...]``; ``[node]`` when unknown."""
    row = sysfs.read(f"devices/system/node/node{node}/distance")
    try:
        distances = [int(d) for d in (row or "").split()]
    except ValueError:
        return [node]
    if node >= len(distances):
        return [node]
    others = [d for i, d in enumerate(distances) if i != node]
    if not others:
        return [node]
    nearest = min(others)
    own_socket = socket_of(sysfs, node)
    out = []
    for i, d in enumerate(distances):
        if i == node or d != nearest:
            continue
        if own_socket is not None:
            other = socket_of(sysfs, i)
            if other is not None and other != own_socket:
                continue
        out.append(i)
    return [node, *sorted(out)]
