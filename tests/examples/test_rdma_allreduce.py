"""The example's RDMA check (``rdma_allreduce.py``): the variables that keep an allreduce on the
claim's RDMA devices' verbs transports, and the UD check Soft-RoCE needs off. It runs for real,
pod to pod over Soft-RoCE, in tests/nic_settings/test_rxe_between_pods.py (Linux 7.3's tier)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import load_example_module

rdma_allreduce = load_example_module("rdma_allreduce")


def _sysfs(root: Path) -> str:
    """mlx5_0 under a PCI function, rxe0 a virtual device (as the kernel links them)."""
    ib = root / "class" / "infiniband"
    ib.mkdir(parents=True)
    for dev, where in (("mlx5_0", "pci0000:00/0000:00:01.0/infiniband"), ("rxe0", "virtual/infiniband")):
        real = root / "devices" / where / dev
        real.mkdir(parents=True)
        (ib / dev).symlink_to(os.path.relpath(real, ib))
    return str(root)


def test_the_ranks_use_the_claims_devices_over_verbs_only(tmp_path: Path) -> None:
    env = rdma_allreduce.ucx_environment(["mlx5_0"], _sysfs(tmp_path))
    assert env["OMPI_MCA_pml"] == "ucx" and env["OMPI_MCA_btl"] == "self"
    assert env["UCX_TLS"] == "rc_verbs,ud_verbs,self" and "tcp" not in env["UCX_TLS"]
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert "UCX_UD_VERBS_ETH_DGID_CHECK" not in env, "a hardware NIC keeps UCX's check"


def test_soft_roce_turns_the_ud_destination_check_off(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path)
    assert rdma_allreduce.soft_devices(["mlx5_0", "rxe0"], sysfs) == ["rxe0"]
    env = rdma_allreduce.ucx_environment(["mlx5_0", "rxe0"], sysfs)
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,rxe0:1" and env["UCX_UD_VERBS_ETH_DGID_CHECK"] == "n"


def test_a_container_without_rdma_devices_is_told_so_not_a_traceback() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DRANET_RDMA_DEVICES"}
    out = subprocess.run(
        [sys.executable, str(Path(rdma_allreduce.__file__))], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode != 0 and "no DRANET_RDMA_DEVICES" in out.stderr and "Traceback" not in out.stderr
