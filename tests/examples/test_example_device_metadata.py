"""The training example reads the files the driver writes: its NICs, their HCAs, the GPU pairing.

The driver's :class:`~driver.claims.device_metadata.DeviceMetadataWriter` writes a claim's file
(after prepare and pod start); the example's standard-library reader turns it into the
interfaces, HCAs and NUMA node the benchmark uses, ahead of the ``DRANET_*`` variables.
"""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint.state import GpuPair, PreparedClaim, PreparedDevice
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import MetadataPaths
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import PrepareResult
from driver.model.device import Device, HostFacts
from harness import load_example_module

example = load_example_module("device_metadata")
placement = load_example_module("placement")


def _claim_files(tmp_path: Path) -> list[str]:
    devices = [
        PreparedDevice(
            "nic",
            "node-a",
            f"nic-{i}",
            Device(
                f"nic-{i}",
                {"dra.net/numaNode": 1, "dra.net/rdmaDevice": f"mlx5_{i}"},
                HostFacts(rdma_device=f"mlx5_{i}"),
            ),
        )
        for i in (3, 2)
    ]
    claim = PreparedClaim("uid-1", "ns", "c1", ["pod"], devices)
    paths = MetadataPaths("dra.net", str(tmp_path / "plugin"), str(tmp_path / "cdi"))
    writer = DeviceMetadataWriter(paths)
    pairs = {"nic-3": GpuPair("gpu-1", "gpu.nvidia.com", "0000:1b:00.0", "PIX")}
    writer.gpu_pairs = lambda record, claim: pairs  # type: ignore[method-assign]
    writer.prepared(claim, PrepareResult(), {"metadata": {"annotations": {}}})
    writer.network_ready(claim, [DeviceResult("nic-3", "net3"), DeviceResult("nic-2", "net2")])
    return [str(paths.file("ns", "c1", "nic"))]


def test_the_example_reads_the_drivers_file(tmp_path: Path) -> None:
    nics = example.read_nics(_claim_files(tmp_path))
    assert [(n.interface, n.rdma_device, n.numa_node) for n in nics] == [("net3", "mlx5_3", 1), ("net2", "mlx5_2", 1)]
    assert example.common_numa_node(nics) == 1
    paired = example.nic_for_gpu(nics, "0000:1B:00.0")
    assert paired is not None and (paired.interface, paired.gpu_path) == ("net3", "PIX")
    assert example.nic_for_gpu(nics, "0000:99:00.0") is None


def test_metadata_comes_before_the_drivers_variables_and_after_the_users(tmp_path: Path) -> None:
    nics = example.read_nics(_claim_files(tmp_path))
    env = {"DRANET_RDMA_DEVICES": "mlx5_7", "DRANET_INTERFACES": "ib7"}
    assert placement.nccl_ib_hca(env, nics) == ("=mlx5_2,mlx5_3", "device metadata")
    assert placement.gloo_socket_ifname(env, nics) == ("net2,net3", "device metadata")
    assert placement.nccl_ib_hca(env) == ("=mlx5_7", "DRANET_RDMA_DEVICES")  # no files: the variables
    assert placement.gloo_socket_ifname({**env, "GLOO_SOCKET_IFNAME": "eth9"}, nics) == ("eth9", "GLOO_SOCKET_IFNAME")


def test_no_or_broken_files_mean_no_nics(tmp_path: Path) -> None:
    assert example.read_nics([]) == []
    broken = tmp_path / "x" / "dra.net-metadata.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    assert example.read_nics([str(broken), str(tmp_path / "missing")]) == []
    assert example.metadata_files(str(tmp_path / "none")) == []
