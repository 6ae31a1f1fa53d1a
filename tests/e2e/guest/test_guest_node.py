"""A real node on Linux 7.3 (containerd, the kubelet, the driver, under QEMU) joined to a control
plane on this machine: two pods made by ``kubectl apply`` of their claims run rping, ``ib_write_bw``
and ``ib_send_lat`` between them over Soft-RoCE devices the driver made in their namespaces; the
bytes go over the claimed NICs only; every NIC comes home with its device; again after the
driver was killed. What is checked is :mod:`devcluster.guest_node.host`'s; ``make guest-node``
runs the same alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from devcluster.builders.stock_kernel import StockKernelError
from devcluster.guest_node import host

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_rdma_between_two_pods_of_a_real_node_on_linux_7(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (QEMU's 9p export of the root, namespaces in the guest)")
    try:
        report = host.run(rounds=2, timeout=1500, folder=tmp_path / "run")
    except StockKernelError as exc:
        pytest.fail(f"the 7.3 kernel or QEMU 10 cannot be had here: {exc}")
    print(json.dumps(report.__dict__, indent=1))
    assert report.kernel.startswith("7.3"), report.kernel
    assert len(report.rounds) == 2
    assert not report.failures, "\n".join(report.failures)
    for r in report.rounds:
        assert r["rping_pings"] == 10 and r["ib_write_bw_MBps"] > 0, r
