"""pytest fixtures: fixture sysfs trees built from devcluster/doubles/topologies/*.yaml.

Trees are built once per session into a pytest temp dir (removed by pytest) and must be treated
as read-only; tests that modify a tree build their own with :func:`build_topology`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from devcluster.doubles.sysfs_fixture import build


class SysfsTrees:
    """Session cache: topology name -> built tree (built on first use)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.built: dict[str, Path] = {}

    def get(self, topology: str) -> Path:
        """The read-only tree of ``topology``."""
        if topology not in self.built:
            self.built[topology] = build(topology, self.base / topology)
        return self.built[topology]


@pytest.fixture(scope="session")
def sysfs_trees(tmp_path_factory: pytest.TempPathFactory) -> SysfsTrees:
    """Shared, read-only fixture trees by topology name."""
    return SysfsTrees(tmp_path_factory.mktemp("sysfs"))


@pytest.fixture
def build_topology(tmp_path: Path) -> Callable[[str], Path]:
    """Build a private (writable) copy of any topology into this test's tmp_path."""

    def _build(topology: str) -> Path:
        return build(topology, tmp_path / "sysfs")

    return _build


@pytest.fixture
def nd_h100_sysfs(sysfs_trees: SysfsTrees) -> Path:
    """Azure ND96isr H100 v5 (8 GPUs, 8 IB NICs, eth0 uplink with its VF)."""
    return sysfs_trees.get("nd-h100-v5")


@pytest.fixture
def sriov_sysfs(sysfs_trees: SysfsTrees) -> Path:
    """SR-IOV RoCE host: 2 PFs x 64 VFs, 4 VFs of each on vfio-pci."""
    return sysfs_trees.get("sriov-roce")


@pytest.fixture
def single_socket_sysfs(sysfs_trees: SysfsTrees) -> Path:
    """Single-socket node (E810, ConnectX-6 Dx, eRDMA class 0x00ff, bridge, bond)."""
    return sysfs_trees.get("single-socket")


@pytest.fixture
def vm_no_numa_sysfs(sysfs_trees: SysfsTrees) -> Path:
    """VM with numa_node = -1 everywhere."""
    return sysfs_trees.get("vm-no-numa")


@pytest.fixture
def many_devices_sysfs(sysfs_trees: SysfsTrees) -> Path:
    """141 allocatable devices (more than one ResourceSlice holds)."""
    return sysfs_trees.get("many-devices")
