"""Discovery, topology and templates on a real kernel's PCI and NUMA, checked against that kernel's
own sysfs; and a PCI NIC the kernel gives back to the host when its pod's namespace dies, found by
its identity and restored.

The machine is the stock-kernel guest's (:class:`harness.guest.Topology`): two NUMA nodes, each
with an expander bridge (``pxb-pcie``) holding two e1000e NICs and a GPU-vendor display controller
behind root ports. These tests run only there (``DRANET_GUEST_TOPOLOGY``, set by tests/kernels):
anywhere else the machine's NICs are not the test's to move.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.inventory.discovery import Scanner
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.inventory.test_discover_cli import dranet
from tests.nri.test_lost_stop import Unattended

GUEST = os.environ.get("DRANET_GUEST_TOPOLOGY")
K, D = "resource.kubernetes.io/", "dra.net/"

pytestmark = [
    pytest.mark.root,
    pytest.mark.kernel,
    pytest.mark.skipif(not GUEST, reason="runs in the stock-kernel guest (tests/kernels), on its own PCI NICs"),
]


def _pci_nics() -> dict[str, str]:
    """PCI NIC netdev -> its PCI function, as the kernel shows them."""
    out = {}
    for net in Path("/sys/class/net").iterdir():
        device = net / "device"
        if device.exists() and (device / "class").read_text().startswith("0x02"):
            out[net.name] = device.resolve().name
    return out


def _sysfs(bdf: str, name: str) -> str:
    return Path(f"/sys/bus/pci/devices/{bdf}/{name}").read_text().strip()


@pytest.fixture(scope="module")
def soft_roce() -> Iterator[dict[str, str]]:
    """A Soft-RoCE device on every PCI NIC (netdev -> RDMA device), deleted after: the RDMA NICs of
    this machine."""
    if subprocess.run(["modprobe", "rdma_rxe"], capture_output=True).returncode != 0:
        pytest.skip(f"kernel {os.uname().release} has no Soft-RoCE (the rdma_rxe module)")
    made = {}
    try:
        for ifname in sorted(_pci_nics()):
            name = f"rxe_{ifname}"
            subprocess.run(["rdma", "link", "add", name, "type", "rxe", "netdev", ifname], check=True)
            made[ifname] = name
        yield made
    finally:
        for name in made.values():
            subprocess.run(["rdma", "link", "delete", name], capture_output=True)


def test_discovery_publishes_what_the_kernel_says_of_each_pci_nic(soft_roce: dict[str, str]) -> None:
    nics = _pci_nics()
    assert len(nics) == 4, nics
    scanner = Scanner("/sys", pci_ids_paths=(), replay=False)
    try:
        devices = {d.name: d for d in scanner.scan()}
    finally:
        scanner.close()
    nodes = set()
    for ifname, bdf in nics.items():
        device = devices[f"pci-{bdf.replace(':', '-').replace('.', '-')}"]
        attrs = device.attributes
        numa = int(_sysfs(bdf, "numa_node"))
        root = Path(f"/sys/bus/pci/devices/{bdf}").resolve().parts[3]  # /sys/devices/pci0000:40/...
        assert (attrs[D + "ifName"], attrs[K + "pciBusID"], attrs[D + "numaNode"]) == (ifname, bdf, numa)
        assert attrs[K + "numaNode"] == numa and attrs[K + "pcieRoot"] == root
        assert device.host.numa_node == numa and device.host.pci_address == bdf
        assert root.startswith("pci") and root != "pci0000:00", "behind its node's expander bridge"
        assert (attrs[D + "rdma"], attrs[D + "rdmaDevice"]) == (True, soft_roce[ifname]), "paired by its netdev"
        nodes.add(numa)
    assert nodes == {0, 1}
    shown = dranet("discover", "--output", "json", "--filter", "")
    assert shown.returncode == 0, shown.stderr
    listed = {d["name"]: d["attributes"] for d in json.loads(shown.stdout)}
    for name, device in devices.items():
        if name.startswith("pci-"):
            assert listed[name][K + "pcieRoot"] == {"string": device.attributes[K + "pcieRoot"]}


def test_topology_and_templates_pair_each_gpu_with_its_numa_nodes_nics(soft_roce: dict[str, str]) -> None:
    shown = dranet("topology", "--output", "json")
    assert shown.returncode == 0, shown.stderr
    topo = json.loads(shown.stdout)
    gpus, nics = topo["gpus"], topo["nics"]
    assert sorted(g["numa_node"] for g in gpus) == [0, 1] and len(nics) == 4
    for gpu in gpus:
        assert gpu["numa_node"] == int(_sysfs(gpu["pci_bus_id"], "numa_node"))
        for nic in nics:
            expected = "PHB" if nic["pcie_root"] == gpu["pcie_root"] else "SYS"  # one host bridge per node
            assert topo["matrix"][gpu["label"]][nic["label"]] == expected, (gpu, nic)
    cpus = {k: v["cpulist"] for k, v in topo["numaNodes"].items()}
    assert cpus == {n: Path(f"/sys/devices/system/node/node{n}/cpulist").read_text().strip() for n in ("0", "1")}
    templates = dranet("templates", "--gpus", "1")
    assert templates.returncode == 0, templates.stderr
    text = templates.stdout
    assert "gpu.amd.com" in text  # the display controllers' vendor (0x1002)
    for node in (0, 1):
        assert f'device.attributes["dra.net"]["numaNode"] == {node}' in text, text


def _link(name: str) -> dict[str, object] | None:
    out = subprocess.run(["ip", "-j", "-d", "link", "show", name], capture_output=True, text=True)
    return json.loads(out.stdout)[0] if out.returncode == 0 else None


def test_a_pci_nic_its_pods_namespace_died_with_comes_back_and_is_restored(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """Unlike a veth, a PCI NIC outlives its namespace: the kernel hands it back to the host under
    its pod-side name (or ``devN``). A driver that was not there when it happened (restarted, no
    namespace pinned) finds it by its PCI function at Synchronize and gives it its name, MTU and
    addresses back."""
    ifname = sorted(_pci_nics())[-1]
    subprocess.run(["ip", "addr", "add", "10.98.0.1/24", "dev", ifname], check=True)
    subprocess.run(["ip", "link", "set", ifname, "mtu", "1400", "up"], check=True)
    before = link_facts(ifname)
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = "pod-pci"
    prepare_claim(
        store, uid, [{"ifname": ifname, "config": {"opaque": [{"interface": {"name": "net1", "mtu": 1500}}]}}]
    )
    pod = json_format.Parse(json.dumps(pod_json(uid, f"/run/netns/{pod_ns}")), api.PodSandbox())
    first = NRIHooks(store, host_netns="/proc/self/ns/net")
    try:
        first.run_pod_sandbox(pod)
        assert _link(ifname) is None, "in the pod"
        first.pins.unpin(uid)  # the driver is gone: nothing holds the namespace
    finally:
        first.close()
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    netns_factory.namespaces.remove(pod_ns)
    deadline = time.monotonic() + 30
    while _link("net1") is None and time.monotonic() < deadline:  # namespaces die asynchronously
        time.sleep(0.2)
    back = _link("net1")
    assert back is not None and back["mtu"] == 1500, "the kernel gave it back under its pod-side name"
    sink = Unattended()
    second = NRIHooks(store, sink, host_netns="/proc/self/ns/net")  # type: ignore[arg-type]
    try:
        second.synchronize([], [])
    finally:
        second.close()
    assert link_facts(ifname) == before
    assert store.read(lambda s: s.pods) == {}
    ((device, message, lost),) = sink.told  # the claim is told what happened
    assert not lost and "came back to the host by itself, was found by its identity and restored" in message
    subprocess.run(["ip", "addr", "del", "10.98.0.1/24", "dev", ifname], check=True)
