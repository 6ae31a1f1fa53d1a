"""Fixtures of the prepare tests: a fake apiserver and a Preparer with a real KubeClient and checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.kube.client import KubeClient
from driver.model.device import Device, HostFacts
from harness.fake_apiserver import FakeAPIServer

NODE = "node-a"


def inventory(count: int = 4) -> dict[str, Device]:
    """``count`` RDMA NICs ``pci-0000-8a-00-<i>`` (netdev ``ib<i>``, ``mlx5_<i>``)."""
    devs = {}
    for i in range(count):
        name = f"pci-0000-8a-00-{i}"
        devs[name] = Device(
            name=name,
            attributes={"dra.net/ifName": f"ib{i}", "dra.net/rdma": True},
            host=HostFacts(pci_address=f"0000:8a:00.{i}", ifname=f"ib{i}", rdma_device=f"mlx5_{i}"),
        )
    return devs


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    """A fake apiserver, stopped at teardown."""
    with FakeAPIServer() as server:
        yield server


@pytest.fixture
def preparer(api: FakeAPIServer, tmp_path: Path) -> Preparer:
    """A Preparer for node ``NODE`` over :func:`inventory` (4 NICs)."""
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    return Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE))
