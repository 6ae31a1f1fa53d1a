"""Real SR-IOV VFs: discovery of the VFs a PF makes when ``sriov_numvfs`` is written, their PF's
facts, their NUMA node and PCIe root from the real PCI tree, their IOMMU groups; a VF moved into a
pod and back by the hooks, found by its PCI function.

The machine is the stock-kernel tier's SR-IOV guest (tests/kernels, ``DRANET_GUEST_SRIOV``): two
NUMA nodes, each with an expander bridge holding an ``igb`` PF (QEMU's 82576, up to 7 VFs, its
``igbvf`` VFs) and an emulated Intel IOMMU. There a missing PF fails the test; anywhere else the
tests skip (this machine's PFs, if any, are not the test's to change).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import MetadataPaths
from driver.claims.prepare import Preparer
from driver.config import HOST_NETNS
from driver.dra.protocol import ClaimRef
from driver.dra.slices import build_slices
from driver.health.monitor import DEVICE_REMOVED, PF_LINK_DOWN, HealthMonitor, removed_holders
from driver.inventory import partitions, vf_counts
from driver.inventory.discovery import Scanner
from driver.inventory.names import pci_device_name
from driver.inventory.vfio_binding import VfioBinder, VfioTaints
from driver.kube.client import KubeClient
from driver.model.device import Device
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.plugins.sriov_scheduling import GUEST_OUT_ENV, NODE_PLACEHOLDER, SLICES_FILE, UID_PLACEHOLDER

SRIOV_ENV = "DRANET_GUEST_SRIOV"
K, D = "resource.kubernetes.io/", "dra.net/"
PCI = Path("/sys/bus/pci/devices")
VFS = 2  # per PF

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def _pfs() -> list[str]:
    """The igb PFs of this machine that can make VFs."""
    found = []
    for dev in sorted(PCI.iterdir()):
        driver = dev / "driver"
        if (dev / "sriov_totalvfs").exists() and driver.exists() and driver.resolve().name == "igb":
            found.append(dev.name)
    return found


def _set_vfs(pf: str, count: int) -> None:
    (PCI / pf / "sriov_numvfs").write_text("0")  # the kernel takes a new count only from 0
    if count:
        (PCI / pf / "sriov_numvfs").write_text(str(count))


def _vf(pf: str, index: int) -> str:
    return (PCI / pf / f"virtfn{index}").resolve().name


def _netdev(bdf: str) -> str | None:
    names = sorted(p.name for p in (PCI / bdf / "net").glob("*")) if (PCI / bdf / "net").is_dir() else []
    return names[0] if names else None


def _wait(what: str, done: object, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.2)
    assert done(), f"{what} within {within:.0f} s"  # type: ignore[operator]


@pytest.fixture
def pfs() -> Iterator[list[str]]:
    """Each PF with ``VFS`` VFs, their ``igbvf`` netdevs up to be found; no VFs again after."""
    found = _pfs()
    if len(found) < 2:
        why = f"this machine (kernel {os.uname().release}) has no two igb PFs with SR-IOV (found {found})"
        if os.environ.get(SRIOV_ENV):
            pytest.fail(f"the SR-IOV guest: {why}")
        pytest.skip(f"{why}: the stock-kernel tier's SR-IOV guest has them")
    try:
        for pf in found:
            _set_vfs(pf, VFS)
        # No udev in the guest: load the VFs' driver as a coldplug would.
        subprocess.run(["modprobe", "igbvf"], check=True, capture_output=True)
        _wait("every VF with its netdev", lambda: all(_netdev(_vf(pf, i)) for pf in found for i in range(VFS)))
        yield found
    finally:
        for pf in found:
            _set_vfs(pf, 0)


def _scan() -> dict[str, Device]:
    scanner = Scanner("/sys", pci_ids_paths=(), replay=False)
    try:
        return {d.attributes[D + "pciAddress"]: d for d in scanner.scan() if D + "pciAddress" in d.attributes}
    finally:
        scanner.close()


def _root(bdf: str) -> str:
    return (PCI / bdf).resolve().parts[3]  # /sys/devices/pci0000:40/...


def test_real_vfs_are_published_with_their_pfs_facts(pfs: list[str]) -> None:
    devices = _scan()
    nodes, groups = set(), set()
    for pf in pfs:
        numa = int((PCI / pf / "numa_node").read_text())
        pf_attrs = devices[pf].attributes
        assert (pf_attrs[D + "sriov"], pf_attrs[D + "sriovVfs"], pf_attrs[D + "numaNode"]) == (True, VFS, numa)
        assert D + "isSriovVf" not in pf_attrs and D + "pfPciAddress" not in pf_attrs
        nodes.add(numa)
        for index in range(VFS):
            bdf = _vf(pf, index)
            vf = devices[bdf]
            attrs = vf.attributes
            assert attrs[D + "isSriovVf"] is True and attrs[D + "sriov"] is False
            assert (attrs[D + "pfPciAddress"], attrs[D + "vfIndex"]) == (pf, index)
            assert (attrs[D + "pfName"], attrs[D + "pfDeviceID"]) == (_netdev(pf), "10c9"), attrs  # 82576
            assert attrs[D + "pciDevice"] == "10ca", "the 82576's VF"
            assert attrs[D + "ifName"] == _netdev(bdf) and attrs[K + "pciBusID"] == bdf
            assert attrs[D + "numaNode"] == numa and attrs[K + "pcieRoot"] == _root(pf), "its PF's node and root"
            assert vf.host.sriov_pf == pf and vf.host.pci_address == bdf
            group = (PCI / bdf / "iommu_group").resolve().name
            assert attrs[D + "iommuGroup"] == int(group) and D + "vfioUnsafe" not in attrs, attrs
            groups.add(group)
        assert pf_attrs[D + "iommuGroup"] == int((PCI / pf / "iommu_group").resolve().name)
    assert nodes == {0, 1}
    assert len(groups) == VFS * len(pfs), "each VF in an IOMMU group of its own"


def test_a_lower_vf_count_unpublishes_the_vfs_it_removed(pfs: list[str]) -> None:
    pf = pfs[0]
    gone = _vf(pf, 1)
    _set_vfs(pf, 1)
    _wait("VF 0 again with its netdev", lambda: _netdev(_vf(pf, 0)) is not None)
    devices = _scan()
    assert devices[pf].attributes[D + "sriovVfs"] == 1
    assert gone not in devices or devices[gone].attributes.get(D + "pfPciAddress") != pf
    assert [d.attributes[D + "vfIndex"] for d in devices.values() if d.attributes.get(D + "pfPciAddress") == pf] == [0]
    _set_vfs(pf, 0)
    assert not [d for d in _scan().values() if d.attributes.get(D + "pfPciAddress") == pf]


def test_a_vf_moves_into_its_pod_and_comes_back_as_it_was(
    pfs: list[str], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """RunPodSandbox moves the VF's netdev into the pod under the claim's name with the claim's
    address; StopPodSandbox gives it back to the host, name, MTU and addresses as before; the PF
    is not touched."""
    bdf = _vf(pfs[1], 0)
    ifname = _netdev(bdf)
    assert ifname
    subprocess.run(["ip", "link", "set", ifname, "mtu", "1400", "up"], check=True)
    before, pf_before = link_facts(ifname), link_facts(_netdev(pfs[1]) or "")
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = "pod-vf"
    iface = {"name": "net1", "mtu": 1500, "addresses": ["10.97.0.2/24"]}
    prepare_claim(store, uid, [{"ifname": ifname, "config": {"opaque": [{"interface": iface}]}}])
    pod = json_format.Parse(json.dumps(pod_json(uid, f"/run/netns/{pod_ns}")), api.PodSandbox())
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
    try:
        hooks.run_pod_sandbox(pod)
        inside = json.loads(
            subprocess.run(["ip", "-n", pod_ns, "-j", "addr", "show", "net1"], capture_output=True, text=True).stdout
        )
        assert inside and inside[0]["mtu"] == 1500
        assert "10.97.0.2" in [a["local"] for a in inside[0]["addr_info"]]
        pod_side = subprocess.run(
            ["ip", "netns", "exec", pod_ns, "readlink", "-f", "/sys/class/net/net1/device"],
            capture_output=True,
            text=True,
        )
        assert Path(pod_side.stdout.strip()).name == bdf, "the VF itself, by its PCI function"
        hooks.stop_pod_sandbox(pod)
    finally:
        hooks.close()
    assert link_facts(ifname) == before
    assert link_facts(_netdev(pfs[1]) or "") == pf_before, "the PF untouched"
    assert store.read(lambda s: s.pods) == {}


def _home_as_before(now: dict[str, object], before: dict[str, object], netdev: str) -> bool:
    """The PF's report of a VF home again is its report of before the pod; a PF that held no MAC for
    the VF before (all zeros: the VF's own was never taken) may hold the VF netdev's own now (the
    return gives the netdev its MAC back, which the VF tells its PF; none is written back)."""
    if before.get("mac") == "00:00:00:00:00:00" and now.get("mac") == (link_facts(netdev) or {}).get("mac"):
        now = {**now, "mac": before["mac"]}
    return now == before


def _vf_settings(pf: str, index: int) -> dict[str, object]:
    """What the PF reports for its VF ``index`` (``ip -d link show``'s ``vfinfo_list``), without the
    counters."""
    link = json.loads(
        subprocess.run(
            ["ip", "-j", "-d", "link", "show", _netdev(pf) or ""], capture_output=True, text=True, check=True
        ).stdout
    )[0]
    info = next(v for v in link["vfinfo_list"] if v["vf"] == index)
    vlan = (info.get("vlan_list") or [{}])[0]
    return {
        "mac": info.get("address"),
        "vlan": vlan.get("vlan", 0),
        "qos": vlan.get("qos", 0),
        "spoofchk": info.get("spoofchk"),
        "trust": info.get("trust"),
        "max_tx_rate": info.get("max_tx_rate", info.get("tx_rate", 0)),
        "min_tx_rate": info.get("min_tx_rate", 0),
    }


@pytest.fixture
def pf_up(pfs: list[str]) -> Iterator[str]:
    """The first PF with its link up (igb limits a VF's rate only while the PF has a link), down again after."""
    pf = _netdev(pfs[0]) or ""
    subprocess.run(["ip", "link", "set", pf, "up"], check=True)
    try:
        _wait(f"{pf}'s link", lambda: (PCI / pfs[0] / "net" / pf / "carrier").read_text().strip() == "1")
        yield pfs[0]
    finally:
        subprocess.run(["ip", "link", "set", pf, "down"], check=True)


def hooks_netns(pod: api.PodSandbox) -> str:
    """The name under /run/netns of the pod's network namespace."""
    return next(ns.path for ns in pod.linux.namespaces if ns.type == "network").rsplit("/", 1)[1]


def _vf_pod(
    pf: str, netns_factory: NetnsFactory, tmp_path: Path, sriov: dict[str, object]
) -> tuple[int, str, NRIHooks, api.PodSandbox, CheckpointStore]:
    """VF 1 of ``pf``, up on the host (every NIC comes home up), prepared for a pod with ``sriov``
    in its claim: (VF index, VF netdev, hooks, pod, store)."""
    index = 1
    ifname = _netdev(_vf(pf, index)) or ""
    subprocess.run(["ip", "link", "set", ifname, "up"], check=True)
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = f"pod-vf-{index}"
    config = {"opaque": [{"interface": {"name": "net1", "addresses": ["10.97.1.2/24"]}, "sriov": sriov}]}
    prepare_claim(store, uid, [{"ifname": ifname, "config": config}])
    pod = json_format.Parse(json.dumps(pod_json(uid, f"/run/netns/{pod_ns}")), api.PodSandbox())
    return index, ifname, NRIHooks(store, host_netns="/proc/self/ns/net"), pod, store


def test_a_vfs_settings_are_set_through_its_pf_and_put_back(
    pf_up: str, netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """The claim's MAC, VLAN and priority, spoof checking off, trust on and a tx ceiling, read back
    through the PF while the VF is in the pod (the MAC also on its netdev there); every one as before
    once it is home, the VF's netdev with its own MAC again (igb lets it take one only once the PF's
    is cleared)."""
    mac = "02:d7:00:00:01:01"
    sriov = {"vlan": 100, "vlanQoS": 3, "spoofChk": False, "trust": True, "maxTxRate": 100, "mac": mac}
    pf = pf_up
    index, ifname, hooks, pod, store = _vf_pod(pf, netns_factory, tmp_path, sriov)
    before, vf_before = _vf_settings(pf, index), link_facts(ifname)
    assert (before["vlan"], before["spoofchk"], before["trust"], before["max_tx_rate"]) == (0, True, False, 0), before
    try:
        hooks.run_pod_sandbox(pod)
        during = _vf_settings(pf, index)
        wanted = {"vlan": 100, "qos": 3, "spoofchk": False, "trust": True, "max_tx_rate": 100, "mac": mac}
        assert during == {**before, **wanted}
        in_pod = link_facts("net1", netns=hooks_netns(pod))
        assert in_pod is not None and in_pod["mac"] == mac, in_pod
        assert _vf_settings(pf, 0)["vlan"] == 0, "VF 0 untouched"
        moved = store.read(lambda s: s.pods[pod.uid].devices[0].records)
        assert moved["sriov"]["host"]["vlan"] == 0 and moved["sriov"]["pod"]["vlan"] == 100, "written ahead"
        hooks.stop_pod_sandbox(pod)
    finally:
        hooks.close()
    assert _home_as_before(_vf_settings(pf, index), before, ifname), (_vf_settings(pf, index), before)
    assert link_facts(ifname) == vf_before
    assert store.read(lambda s: s.pods) == {}


def test_a_setting_the_pf_refuses_is_named_and_nothing_is_left_half_applied(
    pf_up: str, netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """igb has no guaranteed rate (``igb_ndo_set_vf_bw``: EINVAL for any min_tx_rate): the pod is
    refused naming the claim's field and the PF, the VLAN set in the same step is put back, the VF
    is home as it was."""
    pf = pf_up
    index, ifname, hooks, pod, store = _vf_pod(
        pf, netns_factory, tmp_path, {"vlan": 200, "minTxRate": 10, "maxTxRate": 100}
    )
    before, vf_before = _vf_settings(pf, index), link_facts(ifname)
    try:
        with pytest.raises(HookError) as info:
            hooks.run_pod_sandbox(pod)
    finally:
        hooks.close()
    message = str(info.value)
    assert "sriov.minTxRate/maxTxRate" in message and _netdev(pf) in message, message
    assert _home_as_before(_vf_settings(pf, index), before, ifname), (_vf_settings(pf, index), before)
    assert link_facts(ifname) == vf_before
    assert store.read(lambda s: s.pods) == {}


def test_vf_counts_from_the_chart_are_set_once_and_kept_while_a_vf_is_prepared(pfs: list[str]) -> None:
    """``sriov.vfs`` on real PFs: one selected by its PCI address, the other by the 82576's IDs; a
    second start writes nothing; a PF whose VF a claim holds keeps its count; a count above the
    PF's 7 is refused for that PF alone."""
    first, second = pfs
    counts = vf_counts.decode(
        json.dumps(
            [
                {"nicSelector": {"rootDevices": [first]}, "numVfs": 3},
                {"nicSelector": {"vendor": "8086", "deviceID": "10c9", "pfNames": [_netdev(second)]}, "numVfs": 1},
            ]
        )
    )
    outcomes = {o.pf: o for o in vf_counts.apply(counts, "/sys", prepared=())}
    assert {pf: (o.before, o.after, o.refused) for pf, o in outcomes.items()} == {
        first: (VFS, 3, ""),
        second: (VFS, 1, ""),
    }
    assert [int((PCI / pf / "sriov_numvfs").read_text()) for pf in pfs] == [3, 1]
    assert len([e for e in os.listdir(PCI / first) if e.startswith("virtfn")]) == 3
    _wait("the new VFs' netdevs", lambda: all(_netdev(_vf(first, i)) for i in range(3)))
    assert {d.attributes.get(D + "pfPciAddress") for d in _scan().values()} >= {first, second}

    again = vf_counts.apply(counts, "/sys", prepared=())
    assert [(o.before, o.after, o.refused) for o in again] == [(3, 3, ""), (1, 1, "")], "a restart changes nothing"

    held = _vf(first, 2)
    busy = vf_counts.decode(json.dumps([{"nicSelector": {"rootDevices": [first]}, "numVfs": 2}]))
    (kept,) = vf_counts.apply(busy, "/sys", prepared={held})
    assert kept.after == 3 and held in kept.refused and "sriov.vfs[0].numVfs" in kept.refused, kept
    assert int((PCI / first / "sriov_numvfs").read_text()) == 3 and _vf(first, 2) == held

    over = vf_counts.decode(
        json.dumps(
            [
                {"nicSelector": {"rootDevices": [first]}, "numVfs": 8},
                {"nicSelector": {"rootDevices": [second]}, "numVfs": 2},
            ]
        )
    )
    refused, applied = sorted(vf_counts.apply(over, "/sys", prepared=()), key=lambda o: o.pf != first)
    assert "sriov.vfs[0].numVfs: 8 is above" in refused.refused and "(7)" in refused.refused, refused
    assert (applied.after, applied.refused) == (2, ""), "the other PF still gets its count"


def test_a_pf_set_down_makes_its_vfs_unhealthy_and_up_again_healthy(pfs: list[str], tmp_path: Path) -> None:
    """The health check on real VFs: their PF's netdev down makes each of its VFs ``PfLinkDown``
    (the other PF's VFs stay healthy); the PF up again, they are healthy."""
    devices = {d.name: d for d in _scan().values() if d.host.sriov_pf}
    assert len(devices) == VFS * len(pfs), devices
    monitor = HealthMonitor(
        CheckpointStore(tmp_path / "s", tmp_path / "r"), lambda: devices, "node", "/sys", HOST_NETNS
    )
    down_pf = pfs[0]
    pf_name = _netdev(down_pf)
    assert pf_name is not None
    for pf in pfs:
        subprocess.run(["ip", "link", "set", str(_netdev(pf)), "up"], check=True)
    _wait("both PFs up with carrier", lambda: all(s.reason != PF_LINK_DOWN for s in monitor.evaluate()))
    try:
        subprocess.run(["ip", "link", "set", pf_name, "down"], check=True)
        states = {devices[s.device].host.sriov_pf: s for s in monitor.evaluate() if not s.healthy}
        assert set(states) == {down_pf}, "only the downed PF's VFs"
        assert [s.reason for s in monitor.evaluate() if not s.healthy] == [PF_LINK_DOWN] * VFS
        assert f"its PF {down_pf} ({pf_name}) is down" in states[down_pf].message
    finally:
        subprocess.run(["ip", "link", "set", pf_name, "up"], check=True)
    # igb takes its link back up in a moment (the emulated autonegotiation): the VFs follow it.
    _wait("the VFs healthy again", lambda: all(s.reason != PF_LINK_DOWN for s in monitor.evaluate()))


def test_a_vf_removed_under_its_pod_is_reported_and_the_pod_still_stops(
    pfs: list[str], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """An admin lowers a PF's VF count while one of its VFs is in a pod: the health check says
    ``DeviceRemoved`` for that VF (the other PF's VFs are not), its holder is the pod's claim (the
    daemon tells it: tests/health/test_device_removed.py); the pod's stop reports the VF not found
    and forgets it, leaving no state behind."""
    devices = {d.name: d for d in _scan().values() if d.host.sriov_pf}
    bdf = _vf(pfs[1], 0)
    name = next(n for n, d in devices.items() if d.host.pci_address == bdf)
    ifname = _netdev(bdf)
    assert ifname
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = "pod-vf-removed"
    config = {"opaque": [{"interface": {"name": "net1", "addresses": ["10.97.2.2/24"]}}]}
    prepare_claim(store, uid, [{"ifname": ifname, "device": name, "pci_address": bdf, "config": config}])
    pod = json_format.Parse(json.dumps(pod_json(uid, f"/run/netns/{pod_ns}")), api.PodSandbox())
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
    monitor = HealthMonitor(store, lambda: devices, "node", "/sys", HOST_NETNS)
    try:
        hooks.run_pod_sandbox(pod)
        assert all(s.reason != DEVICE_REMOVED for s in monitor.evaluate())
        _set_vfs(pfs[1], 0)
        states = {s.device: s for s in monitor.evaluate()}
        assert (states[name].healthy, states[name].reason) == (False, DEVICE_REMOVED), states[name]
        assert bdf in states[name].message and "VF count was lowered" in states[name].message
        other_pf = [n for n, d in devices.items() if d.host.sriov_pf == pfs[0]]
        assert other_pf and all(states[n].reason != DEVICE_REMOVED for n in other_pf)
        [held] = store.read(lambda st: removed_holders(st, {name}))
        assert held.pod_uids == (uid,)
        # Nothing to give back: the stop says so (the runtime logs it) and forgets the VF.
        with pytest.raises(HookError, match=f"{name}: find failed: {ifname} is neither in"):
            hooks.stop_pod_sandbox(pod)
    finally:
        hooks.close()
    assert store.read(lambda st: st.pods) == {}


@pytest.fixture
def pfs_up(pfs: list[str]) -> Iterator[list[str]]:
    """Both PFs with their link up (a VF has a link only while its PF has one), down again after."""
    names = [_netdev(pf) or "" for pf in pfs]
    try:
        for name in names:
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        for pf, name in zip(pfs, names, strict=True):
            _wait(
                f"{name}'s link",
                lambda pf=pf, name=name: (PCI / pf / "net" / name / "carrier").read_text().strip() == "1",
            )
        yield pfs
    finally:
        for name in names:
            subprocess.run(["ip", "link", "set", name, "down"], check=False)


def _counters(netns: str, ifname: str) -> dict[str, int]:
    out = subprocess.run(["ip", "-n", netns, "-j", "-s", "link", "show", ifname], capture_output=True, text=True)
    stats = json.loads(out.stdout)[0]["stats64"]
    return {"rx": stats["rx"]["packets"], "tx": stats["tx"]["packets"]}


def test_two_pods_talk_over_their_vfs_on_the_claims_vlan(
    pfs_up: list[str], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """A VF of each PF (one per NUMA node; the two PFs share a wire) moved into a pod of its own with
    its claim's address and VLAN 100 set through its PF: the pods reach each other over the VFs (the
    PFs tag and untag), and each pod's counters show the traffic on its VF. Home again, both VFs and
    their PF settings are as before. A third pod whose VF has no VLAN does not reach them."""
    stores, hooks, pods, netns, vfs, befores = [], [], [], [], [], []
    address = {0: "10.98.0.1", 1: "10.98.0.2", 2: "10.98.0.3"}
    plan = [(pfs_up[0], 0, 100), (pfs_up[1], 0, 100), (pfs_up[1], 1, 0)]
    macs = {0: "02:d7:00:00:00:01", 1: "02:d7:00:00:00:02"}  # through the PFs, spoof checking on
    try:
        for n, (pf, index, vlan) in enumerate(plan):
            ifname = _netdev(_vf(pf, index)) or ""
            subprocess.run(["ip", "link", "set", ifname, "up"], check=True)
            befores.append((link_facts(ifname), _vf_settings(pf, index)))
            vfs.append(ifname)
            store = CheckpointStore(str(tmp_path / f"state{n}"), str(tmp_path / f"run{n}"))
            sriov = {"sriov": {"vlan": vlan, "mac": macs[n]}} if vlan else {}
            config = {"opaque": [{"interface": {"name": "net1", "addresses": [f"{address[n]}/24"]}, **sriov}]}
            uid = f"pod-talk-{n}"
            prepare_claim(store, uid, [{"ifname": ifname, "config": config}])
            netns.append(netns_factory.netns())
            pod = json_format.Parse(json.dumps(pod_json(uid, f"/run/netns/{netns[-1]}")), api.PodSandbox())
            stores.append(store)
            hooks.append(NRIHooks(store, host_netns="/proc/self/ns/net"))
            hooks[-1].run_pod_sandbox(pod)
            pods.append(pod)
        for n in (0, 1):
            pf_says = _vf_settings(pfs_up[n], 0)
            assert (pf_says["vlan"], pf_says["mac"], pf_says["spoofchk"]) == (100, macs[n], True), pf_says
            assert (link_facts("net1", netns=netns[n]) or {}).get("mac") == macs[n]
        before = _counters(netns[1], "net1")
        ping = subprocess.run(
            ["ip", "netns", "exec", netns[0], "busybox", "ping", "-c", "5", "-A", "-W", "3", "-w", "15", address[1]],
            capture_output=True,
            text=True,
        )
        assert ping.returncode == 0, f"pod 0 -> pod 1 over their VFs: {ping.stdout}{ping.stderr}"
        after = _counters(netns[1], "net1")
        assert after["rx"] - before["rx"] >= 5 and after["tx"] - before["tx"] >= 5, (before, after)
        untagged = subprocess.run(
            ["ip", "netns", "exec", netns[2], "busybox", "ping", "-c", "2", "-W", "1", "-w", "3", address[1]],
            capture_output=True,
            text=True,
        )
        assert untagged.returncode != 0, "a VF outside the claims' VLAN reached them"
    finally:
        for hook, pod in zip(hooks, pods, strict=False):  # also after a failure: the VFs and their VLANs back
            hook.stop_pod_sandbox(pod)
        for hook in hooks:
            hook.close()
    for (pf, index, _), ifname, (facts, settings) in zip(plan, vfs, befores, strict=True):
        assert link_facts(ifname) == facts, f"{ifname} not home as it was"
        assert _home_as_before(_vf_settings(pf, index), settings, ifname), (_vf_settings(pf, index), settings)
    assert all(s.read(lambda st: st.pods) == {} for s in stores)


def test_the_pool_of_the_real_pfs_and_vfs_is_published_with_their_counters(pfs: list[str]) -> None:
    """The ResourceSlices the driver publishes for this node (what its publisher writes: the scan,
    each PF and VF drawing on its PF's counter set, the counter sets): each PF draws all its VFs'
    worth, each VF one. Written for the host, which hands them to the real scheduler."""
    devices = partitions.with_counters(list(_scan().values()))
    sets = partitions.counter_sets(devices)
    assert sorted(s["name"] for s in sets) == sorted(partitions.counter_set_name(pf) for pf in pfs)
    assert all(s["counters"][partitions.COUNTER]["value"] == str(VFS) for s in sets)
    draws = {d.host.pci_address: (d.counters or {}) for d in devices}
    for pf in pfs:
        assert draws[pf] == {partitions.counter_set_name(pf): {partitions.COUNTER: VFS}}, draws[pf]
        for index in range(VFS):
            assert draws[_vf(pf, index)] == {partitions.counter_set_name(pf): {partitions.COUNTER: 1}}
    slices = build_slices(devices, "dra.net", NODE_PLACEHOLDER, UID_PLACEHOLDER, counter_sets=sets)
    out = os.environ.get(GUEST_OUT_ENV)
    if out:
        Path(out, SLICES_FILE).write_text(json.dumps({"pfs": pfs, "vfs_per_pf": VFS, "slices": slices}))


VFIO_GROUP_GET_STATUS = 0x3B67  # _IO(VFIO_TYPE ';', VFIO_BASE 100 + 3)
VFIO_GROUP_FLAGS_VIABLE = 1


def vfio_preparer(
    api: FakeAPIServer, tmp_path: Path, devices: dict[str, Device], name: str, uid: str, sriov: dict[str, object]
) -> tuple[Preparer, ClaimRef, MetadataPaths]:
    """The real Preparer (device metadata on, its files under ``tmp_path``) and a claim ``uid`` in
    ``api`` for device ``name`` with the config ``{"sriov": sriov}``, reserved for pod-1."""
    configs = [{"opaque": {"driver": "dra.net", "parameters": {"sriov": sriov}}, "source": "FromClaim"}]
    api.add_claim(make_claim("ns", "dpdk", uid, [result(name, "node")], configs=configs, pods=["pod-1"]))
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    paths = MetadataPaths("dra.net", str(tmp_path / "plugins"), str(tmp_path / "cdi"))
    builder = ClaimBuilder(lambda: devices, "dra.net", "node")
    preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), builder, metadata=DeviceMetadataWriter(paths))
    return preparer, ClaimRef("ns", "dpdk", uid), paths


def test_a_vf_goes_to_vfio_pci_for_its_claim_and_back_to_igbvf(pfs: list[str], tmp_path: Path) -> None:
    """``sriov.driver: vfio-pci`` through the Preparer on a real VF: on vfio-pci once the claim is
    prepared, its VFIO group's device there and viable (the VF alone in its group), the CDI spec
    naming it; back on igbvf with a netdev after unprepare, the override cleared."""
    subprocess.run(["modprobe", "vfio-pci"], check=True, capture_output=True)
    bdf = _vf(pfs[0], 1)
    devices = {d.name: d for d in _scan().values()}
    name = pci_device_name(bdf)
    group = devices[name].attributes[D + "iommuGroup"]
    assert isinstance(group, int)
    uid = "vfio-claim-1"
    with FakeAPIServer() as api:
        preparer, ref, paths = vfio_preparer(api, tmp_path, devices, name, uid, {"driver": "vfio-pci"})
        answer = preparer.prepare_now([ref])[uid]
        try:
            assert answer.error == ""
            assert (PCI / bdf / "driver").resolve().name == "vfio-pci"
            assert _netdev(bdf) is None, "no netdev: user space drives the VF"
            node = Path(f"/dev/vfio/{group}")
            _wait(f"{node} in devtmpfs", node.exists, within=5)
            assert stat.S_ISCHR(node.stat().st_mode) and stat.S_ISCHR(os.stat("/dev/vfio/vfio").st_mode)
            fd = os.open(node, os.O_RDWR)
            try:
                argsz_flags = fcntl.ioctl(fd, VFIO_GROUP_GET_STATUS, struct.pack("II", 8, 0))
            finally:
                os.close(fd)
            assert struct.unpack("II", argsz_flags)[1] & VFIO_GROUP_FLAGS_VIABLE, "every device of the group on vfio"
            [spec] = Path(paths.cdi_dir).iterdir()
            nodes = json.loads(spec.read_text())["devices"][0]["containerEdits"]["deviceNodes"]
            iommufd = ["/dev/iommu"] if Path("/sys/class/misc/iommu").exists() else []  # the kernel's, if any
            assert [n["path"] for n in nodes] == [str(node), "/dev/vfio/vfio", *iommufd]
        finally:
            unprepared = preparer.unprepare_now([ref])
    assert unprepared == {uid: ""}
    assert (PCI / bdf / "driver").resolve().name == "igbvf"
    assert (PCI / bdf / "driver_override").read_text().strip() == "(null)"
    _wait("the VF's netdev again", lambda: _netdev(bdf) is not None, within=10)


def test_a_vf_an_admin_put_on_vfio_pci_is_published_for_vfio_claims(pfs: list[str]) -> None:
    """A VF already on vfio-pci: published without a netdev, ``pciDriver`` saying so, tainted for
    claims that tolerate it; back on igbvf it is published as before."""
    subprocess.run(["modprobe", "vfio-pci"], check=True, capture_output=True)
    bdf = _vf(pfs[1], 0)
    before = _scan()[bdf].attributes
    binder = VfioBinder()
    binder.bind(bdf)
    try:
        device = _scan()[bdf]
        assert device.attributes[D + "pciDriver"] == "vfio-pci"
        assert (device.attributes[D + "vfIndex"], device.attributes[D + "pfPciAddress"]) == (0, pfs[1])
        assert D + "ifName" not in device.attributes and device.host.ifname is None
        [taint] = VfioTaints().of([device])[device.name]
        assert (taint["key"], taint["effect"]) == ("dra.net/vfio-pci", "NoSchedule")
    finally:
        binder.give_back(bdf, "igbvf")
    _wait("the VF's netdev again", lambda: _netdev(bdf) is not None, within=10)
    fresh = (D + "mac", D + "ifName")  # a probe may give the VF another random MAC and the next free ethN
    assert {k: v for k, v in _scan()[bdf].attributes.items() if k not in fresh} == {
        k: v for k, v in before.items() if k not in fresh
    }
