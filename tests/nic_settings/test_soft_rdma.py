"""Soft RDMA devices (Soft-RoCE, ``rdma_rxe``) on a real kernel: discovered with their netdev, never
handed to a pod after the move destroyed them, made again when the NIC comes home.

They need the kernel's RDMA core and ``rdma_rxe``: the stock-kernel tier (Debian's 6.1) has them;
elsewhere these tests skip naming the kernel. Every device and link made here is removed after.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.claims.status_entries import DeviceResult
from driver.inventory import rdma as rdma_inventory
from driver.inventory.discovery import Scanner
from driver.inventory.sysfs import SysfsReader
from driver.netlink.kernel_features import KernelFeatures
from driver.nic_settings.rdma import REMAKE_LATER
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.support import kernel
from tests.support.hook_node import Node

pytestmark = [pytest.mark.root, pytest.mark.kernel]
D = "dra.net/"


def _rdma(*args: str, netns: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, "rdma", *args], capture_output=True, text=True)


def _soft_roce() -> None:
    """Skip unless this kernel can make Soft-RoCE devices (RDMA netlink and the rdma_rxe module)."""
    kernel.skip_unless(kernel.features().has("rdmaNetlink"), "RDMA core (RDMA netlink)")
    loaded = subprocess.run(["modprobe", "rdma_rxe"], capture_output=True).returncode == 0
    kernel.skip_unless(loaded, "Soft-RoCE (the rdma_rxe module)")
    # The connection manager's char device, loaded on a node by rdma-core's own service.
    subprocess.run(["modprobe", "rdma_ucm"], capture_output=True)


def _gone(path: Path, within: float = 30) -> bool:
    deadline = time.monotonic() + within
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def _appears(path: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.exists()


@pytest.fixture
def rxe(netns_factory: NetnsFactory) -> Iterator[list[str]]:
    """A list the test appends the names of the Soft-RoCE devices it makes to; each is deleted after."""
    _soft_roce()
    made: list[str] = []
    yield made
    for name in made:
        _rdma("link", "delete", name)


def test_a_soft_roce_device_is_published_with_its_netdev(netns_factory: NetnsFactory, rxe: list[str]) -> None:
    """``rdma link add rxeT type rxe netdev VETH``: the kernel puts it under devices/virtual (no PCI
    function); discovery publishes the veth's device with ``rdma``, the RDMA device, its link layer,
    rate and char devices, as it does a PCI NIC's, from sysfs and again through pyverbs."""
    nic, _ = netns_factory.veth()
    subprocess.run(["ip", "link", "set", nic, "up"], check=True)
    name = f"rxt{nic[-4:]}"
    made = _rdma("link", "add", name, "type", "rxe", "netdev", nic)
    assert made.returncode == 0, made.stderr
    rxe.append(name)
    assert Path(f"/sys/class/infiniband/{name}").resolve().parent.name == "infiniband"
    for pyverbs in (False, True):
        scanner = Scanner("/sys", pci_ids_paths=(), use_pyverbs=pyverbs, replay=False)
        try:
            device = {d.name: d for d in scanner.scan()}[nic]
        finally:
            scanner.close()
        attrs = device.attributes
        assert (attrs[D + "rdma"], attrs[D + "rdmaDevice"], attrs[D + "linkLayer"]) == (True, name, "Ethernet")
        assert isinstance(attrs.get(D + "rateGbps"), int) and attrs[D + "rateGbps"] > 0
        paths = [c.path for c in device.host.char_devices]
        assert any(p.startswith("/dev/infiniband/uverbs") for p in paths) and "/dev/infiniband/rdma_cm" in paths
        for char in device.host.char_devices:  # the numbers are the kernel's own nodes
            assert Path(char.path).exists(), char
    # pyverbs (Debian's python3-pyverbs, on the tier's path) opens the device and reads its port.
    if rdma_inventory.rdma_has_pyverbs():
        layer, rate = rdma_inventory._pyverbs_port(name)
        assert layer == "Ethernet" and rate == attrs[D + "rateGbps"], (layer, rate)


class Statuses:
    """The hooks' status sink: what each RunPodSandbox reported."""

    def __init__(self) -> None:
        self.ready: list[DeviceResult] = []

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        self.ready += results

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        raise AssertionError(f"{device} {step}: {message}")


@pytest.mark.parametrize("exclusive", [False, True], ids=["shared-mode", "exclusive-mode"])
def test_a_move_that_destroys_the_soft_device_starts_the_pod_without_it_and_makes_it_again(
    netns_factory: NetnsFactory, rxe: list[str], tmp_path: Path, exclusive: bool
) -> None:
    """Moving a netdev out of its namespace destroys its rxe device, and rxe cannot change namespace
    (EOPNOTSUPP) in either mode: known before the move, the NIC goes in alone. The containers get
    none of the gone device's char devices and no NCCL_IB_HCA, the claim's status says why, and once
    the NIC is home the device is made again on it under its name."""
    node = Node(netns_factory, tmp_path)
    name = f"rxn{node.nic[-4:]}"
    made = _rdma("link", "add", name, "type", "rxe", "netdev", node.nic, netns=node.host)
    assert made.returncode == 0, made.stderr
    rxe.append(name)
    found = rdma_inventory.scan_rdma(SysfsReader("/sys"))[name]  # as the node's scan publishes it
    chars = [{"path": c.path, "major": c.major, "minor": c.minor} for c in found.char_devices]
    assert found.soft and found.netdev == node.nic and len(chars) == 2, found
    statuses = Statuses()
    hooks = NRIHooks(
        node.store,
        statuses,
        host_netns=f"/run/netns/{node.host}",
        rdma_exclusive=exclusive,
        kernel=KernelFeatures(kernel.release()),
    )
    before = link_facts(node.nic, node.host)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "rdma_device": name, "char_devices": chars}])
    hooks.run_pod_sandbox(node.pod)
    # The kernel unregisters it from a work queue: gone a moment after the move, not with it.
    assert _gone(Path(f"/sys/class/infiniband/{name}")), "the move destroyed it (known before)"
    record = node.record("rdma")
    assert record["soft"] == name and record["type"] == "rxe" and "Soft-RoCE" in record["reason"]
    (result,) = statuses.ready
    assert result.no_rdma is not None and name in result.no_rdma
    container = api.Container(id="c1", name="main", pod_sandbox_id=node.pod.id)
    adjustment = hooks.create_container(node.pod, container)
    assert adjustment is not None and not adjustment.linux.devices, adjustment
    env = {e.key: e.value for e in adjustment.env}
    assert env == {"DRANET_INTERFACES": node.nic}, "no NCCL_IB_HCA of a device that is gone"
    hooks.stop_pod_sandbox(node.pod)
    # sysfs, not `rdma link`: its dump is cut short by devices other tests add or delete meanwhile.
    # Made in the hook, or, where the kernel frees the old name slowly (a loaded guest), off it.
    parent = Path(f"/sys/class/infiniband/{name}/parent")
    assert _appears(parent, within=REMAKE_LATER + 5), "made again"
    assert parent.read_text().strip() == node.nic, "made again on the NIC"
    assert link_facts(node.nic, node.host) == before
    hooks.close()
