"""Unit tests of the NUMAAligned condition (sysfs tree built in tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.numa_report import numa_condition, other_devices, own_devices, pci_numa_node
from driver.model.device import Device, HostFacts

GPU_BDFS = {"0001:00:00.0": 0, "0002:00:00.0": 0, "0009:00:00.0": 1}


@pytest.fixture
def sysfs(tmp_path: Path) -> str:
    for n in (0, 1):
        node = tmp_path / f"devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{n * 48}-{n * 48 + 47}\n")
    for bdf, numa in GPU_BDFS.items():
        d = tmp_path / "bus/pci/devices" / bdf
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{numa}\n")
    return str(tmp_path)


def claim_with_nics(*numa: int | None) -> PreparedClaim:
    devices = []
    for i, node in enumerate(numa):
        attrs = {"dra.net/rdma": True}
        if node is not None:
            attrs["dra.net/numaNode"] = node
        devices.append(PreparedDevice("nic", "node-a", f"nic-{i}", Device(f"nic-{i}", attrs, HostFacts())))
    return PreparedClaim(uid="u1", namespace="default", name="c", devices=devices)


def gpu_slice(devices: dict[str, dict]) -> dict:
    return {
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "node-a"},
            "devices": [{"name": name, "attributes": attrs} for name, attrs in devices.items()],
        }
    }


SLICES = [
    gpu_slice(
        {
            "gpu-0": {"resource.kubernetes.io/pciBusID": {"string": "0001:00:00.0"}},
            "gpu-1": {"resource.kubernetes.io/pciBusID": {"string": "0002:00:00.0"}},
            "gpu-4": {"resource.kubernetes.io/pciBusID": {"string": "0009:00:00.0"}},
            "gpu-x": {"resource.kubernetes.io/numaNode": {"int": 1}},  # attribute only (KEP-6072)
            "gpu-y": {"index": {"int": 7}},  # nothing to go by
        }
    )
]


def results(*gpus: str) -> list[dict]:
    out = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-a", "device": g} for g in gpus]
    return out + [{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "nic-0"}]


def test_pci_numa_node(sysfs: str):
    assert pci_numa_node(sysfs, "0009:00:00.0") == 1
    assert pci_numa_node(sysfs, "0000:ff:00.0") is None


def test_aligned_is_true(sysfs: str):
    cond = numa_condition(own_devices(claim_with_nics(0, 0)), other_devices(results("gpu-0", "gpu-1"), SLICES, sysfs))
    assert cond["status"] == "True" and cond["reason"] == "NUMAAligned"
    assert "all devices on NUMA node 0" in cond["message"]
    assert "NICs: node 0: nic-0, nic-1" in cond["message"]
    assert "gpu.nvidia.com: node 0: gpu-0, gpu-1" in cond["message"]


def test_unaligned_is_false_and_lists_nodes(sysfs: str):
    cond = numa_condition(own_devices(claim_with_nics(1, 1)), other_devices(results("gpu-0", "gpu-x"), SLICES, sysfs))
    assert cond["status"] == "False" and cond["reason"] == "NUMAMisaligned"
    assert "span NUMA nodes 0, 1" in cond["message"]
    assert "gpu.nvidia.com: node 0: gpu-0; node 1: gpu-x" in cond["message"]


def test_unknown_gpu_gives_unknown_with_the_reason(sysfs: str):
    cond = numa_condition(own_devices(claim_with_nics(0)), other_devices(results("gpu-y", "gpu-gone"), SLICES, sysfs))
    assert cond["status"] == "Unknown" and cond["reason"] == "NUMAUnknown"
    assert "gpu.nvidia.com/gpu-gone: unknown: not found in its driver's ResourceSlices" in cond["message"]
    assert "gpu.nvidia.com/gpu-y: unknown" in cond["message"]


def test_known_split_beats_unknown(sysfs: str):
    cond = numa_condition(own_devices(claim_with_nics(0, None, 1)), [])
    assert cond["status"] == "False"
    assert "no other devices in the claim" in cond["message"]


def test_single_node_host_treats_missing_as_node0(sysfs: str):
    claim = claim_with_nics(None)
    assert own_devices(claim)[0].numa is None
    assert own_devices(claim, single_node=True)[0].numa == 0
