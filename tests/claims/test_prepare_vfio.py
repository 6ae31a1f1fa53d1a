"""A claim's VF on vfio-pci (``sriov.driver: vfio-pci``) through the real Preparer, apiserver client and
checkpoint: bound only once its record (with the driver it goes back to) is durable, given back
before the claim is forgotten, refused with the field named; its CDI device hands the container
the VF's VFIO group. The PCI bus is a temporary tree answering as the kernel's
(:class:`tests.inventory.pci_kernel.PciKernel`); the real bind is in tests/inventory/test_sriov_vfs.py."""

from __future__ import annotations

import errno
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as nri
from driver.checkpoint.state import claim_device_counts
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import MetadataPaths
from driver.claims.prepare import Preparer
from driver.claims.status_entries import DeviceResult, StatusUpdate, status_body
from driver.claims.vfio_vf_settings import VfioVfSettings
from driver.dra.protocol import ClaimRef
from driver.inventory.vfio_binding import VfioBinder
from driver.kube.client import KubeClient
from driver.model.device import Device, HostFacts
from driver.netlink.channel import NetlinkChannel
from driver.nri.hooks import NRIHooks
from driver.nri.pod_plan import netdevs_of
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.nri import pod_json
from tests.claims.conftest import NODE
from tests.inventory.pci_kernel import PciKernel
from tests.netlink.test_sriov_vf import PF_INDEX, FakePf

VF, PF, NIC = "0000:44:10.0", "0000:44:00.0", "0000:8a:00.0"
VF_DEVICE, NIC_DEVICE = "pci-0000-44-10-0", "pci-0000-8a-00-0"
UID = "0b5c7a52-1111-4222-8333-944455556666"
VFIO = {"sriov": {"driver": "vfio-pci"}}


def _inventory() -> dict[str, Device]:
    vf = Device(
        VF_DEVICE,
        {"dra.net/ifName": "eth1", "dra.net/iommuGroup": 22, "dra.net/pciAddress": VF, "dra.net/isSriovVf": True},
        HostFacts(pci_address=VF, ifname="eth1", sriov_pf=PF),
    )
    nic = Device(NIC_DEVICE, {"dra.net/ifName": "eth0"}, HostFacts(pci_address=NIC, ifname="eth0"))
    return {vf.name: vf, nic.name: nic}


@pytest.fixture
def kernel(tmp_path: Path) -> PciKernel:
    k = PciKernel(tmp_path / "sys")
    k.function(VF, "igbvf", 22)
    k.function(NIC, "igb", 23)
    return k


@pytest.fixture
def paths(tmp_path: Path) -> MetadataPaths:
    return MetadataPaths("dra.net", str(tmp_path / "plugins/dra.net"), str(tmp_path / "cdi"))


def _preparer(api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths | None) -> Preparer:
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    builder = ClaimBuilder(_inventory, "dra.net", NODE, sysfs_root=str(kernel.root))
    metadata = DeviceMetadataWriter(paths) if paths is not None else None
    preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), builder, metadata=metadata)
    preparer.vfio = VfioBinder(str(kernel.root), timeout_s=0.2, write=kernel.write)
    return preparer


def _claim(api: FakeAPIServer, device: str = VF_DEVICE, params: dict[str, Any] | None = None) -> ClaimRef:
    opaque = {"driver": "dra.net", "parameters": params or VFIO}
    configs = [{"source": "FromClaim", "requests": ["nic"], "opaque": opaque}]
    api.add_claim(make_claim("ns", "dpdk", UID, [result(device, NODE)], configs=configs, pods=["pod-1"]))
    return ClaimRef("ns", "dpdk", UID)


def test_the_vf_goes_to_vfio_pci_after_its_record_and_back_before_the_claim_is_forgotten(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    preparer = _preparer(api, tmp_path, kernel, paths)
    ref = _claim(api)
    stored_at_write: list[bool] = []
    write = kernel.write

    def watching(path: str, value: str) -> None:
        stored_at_write.append(preparer.store.read(lambda s: UID in s.claims))
        write(path, value)

    preparer.vfio = VfioBinder(str(kernel.root), timeout_s=0.2, write=watching)
    answer = preparer.prepare_now([ref])[UID]
    assert answer.error == ""
    assert kernel.driver(VF) == "vfio-pci"
    assert stored_at_write and all(stored_at_write), "every sysfs write came after the durable record"
    record = CheckpointStore(preparer.store.directory).read(lambda s: s.claims[UID])
    assert record.devices[0].host_driver == "igbvf", "the driver it goes back to, durable"
    state = preparer.store.read(lambda s: s)
    assert netdevs_of(state, "pod-1") == [], "no netdev moves for a VF on vfio-pci"
    assert claim_device_counts(state) == (1, 1), "ready once prepared: nothing to attach"

    [spec_path] = Path(paths.cdi_dir).iterdir()
    [cdi_device] = json.loads(spec_path.read_text())["devices"]
    edits = cdi_device["containerEdits"]
    assert edits["deviceNodes"] == [{"path": "/dev/vfio/22"}, {"path": "/dev/vfio/vfio"}]
    key = VF_DEVICE.upper().replace("-", "_")
    assert sorted(edits["env"]) == [f"DRANET_VFIO_DEVICE_{key}={VF}", f"DRANET_VFIO_GROUP_{key}=/dev/vfio/22"]
    assert answer.devices[0].cdi_device_ids and cdi_device["name"] in answer.devices[0].cdi_device_ids[0]

    stored_at_write.clear()
    assert preparer.unprepare_now([ref]) == {UID: ""}
    assert kernel.driver(VF) == "igbvf"
    assert stored_at_write and all(stored_at_write), "the VF went back while its claim was still recorded"
    assert preparer.store.read(lambda s: s.claims) == {}


def test_a_vf_that_cannot_go_back_keeps_its_claim_until_a_retry_can(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    preparer = _preparer(api, tmp_path, kernel, paths)
    ref = _claim(api)
    assert preparer.prepare_now([ref])[UID].error == ""
    kernel.refuse["drivers/igbvf/bind"] = errno.ENODEV
    answer = preparer.unprepare_now([ref])[UID]
    assert answer.startswith("not unprepared: device pci-0000-44-10-0: PCI function 0000:44:10.0: bind to igbvf")
    assert UID in preparer.store.read(lambda s: s.claims), "kept: the kubelet asks again"
    del kernel.refuse["drivers/igbvf/bind"]
    assert preparer.unprepare_now([ref]) == {UID: ""}
    assert kernel.driver(VF) == "igbvf" and preparer.store.read(lambda s: s.claims) == {}


def test_a_failed_bind_takes_the_claim_back_whole(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    preparer = _preparer(api, tmp_path, kernel, paths)
    ref = _claim(api)
    kernel.refuse["drivers_probe"] = errno.EINVAL
    answer = preparer.prepare_now([ref])[UID]
    assert "device pci-0000-44-10-0: PCI function 0000:44:10.0: drivers_probe" in answer.error
    assert preparer.store.read(lambda s: s.claims) == {}, "not recorded"
    assert kernel.driver(VF) == "igbvf", "on its own driver again (it had been unbound)"
    assert list(Path(paths.cdi_dir).iterdir()) == [], "its CDI spec removed"
    del kernel.refuse["drivers_probe"]
    assert preparer.prepare_now([ref])[UID].error == "" and kernel.driver(VF) == "vfio-pci"


def test_a_retry_after_a_crash_between_the_record_and_the_bind_binds(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    """The record is durable, the VF still on its driver (the process died before the bind): the
    kubelet's retried prepare, answered from the checkpoint, binds it; so does a start."""
    preparer = _preparer(api, tmp_path, kernel, paths)
    ref = _claim(api)
    assert preparer.prepare_now([ref])[UID].error == ""
    preparer.vfio.give_back(VF, "igbvf")  # as before the bind
    assert preparer.prepare_now([ref])[UID].error == ""
    assert kernel.driver(VF) == "vfio-pci"
    preparer.vfio.give_back(VF, "igbvf")  # a reboot: every VF on its own driver again
    assert preparer.restore_vfio() == []
    assert kernel.driver(VF) == "vfio-pci"


@pytest.mark.parametrize(
    ("device", "params", "metadata", "expected"),
    [
        (NIC_DEVICE, VFIO, True, "sriov.driver: device pci-0000-8a-00-0 is not an SR-IOV VF"),
        (VF_DEVICE, VFIO, False, "the VFIO devices reach the containers through the device metadata's CDI specs"),
        (
            VF_DEVICE,
            {"sriov": {"driver": "vfio-pci", "vlan": 100}, "interface": {"name": "net1"}},
            True,
            "sriov.driver: sriov.driver vfio-pci hands the VF to the pod through its VFIO group, without a netdev: "
            "interface cannot apply",
        ),
        (VF_DEVICE, {"sriov": {"driver": "igb_uio"}}, True, "sriov.driver: 'igb_uio' is not one of vfio-pci"),
    ],
)
def test_refusals_name_the_field(
    api: FakeAPIServer,
    tmp_path: Path,
    kernel: PciKernel,
    paths: MetadataPaths,
    device: str,
    params: dict[str, Any],
    metadata: bool,
    expected: str,
) -> None:
    preparer = _preparer(api, tmp_path, kernel, paths if metadata else None)
    answer = preparer.prepare_now([_claim(api, device, params)])[UID]
    assert expected in answer.error
    assert kernel.driver(VF) == "igbvf" and kernel.driver(NIC) == "igb", "nothing bound"
    assert preparer.store.read(lambda s: s.claims) == {}


def test_a_vf_an_admin_put_on_vfio_pci_goes_only_to_a_vfio_claim_and_stays_there(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    preparer = _preparer(api, tmp_path, kernel, paths)
    preparer.vfio.bind(VF)  # the admin's (driverctl, a boot unit)
    override = kernel.root / "bus/pci/devices" / VF / "driver_override"
    answer = preparer.prepare_now([_claim(api, params={"interface": {"name": "net1"}})])[UID]
    assert "device pci-0000-44-10-0 is a VF on vfio-pci (no netdev): only a claim with sriov.driver vfio-pci" in (
        answer.error
    )
    ref = _claim(api)
    assert preparer.prepare_now([ref])[UID].error == ""
    assert preparer.store.read(lambda s: s.claims[UID].devices[0].host_driver) == "vfio-pci"
    writes = len(kernel.writes)
    assert preparer.unprepare_now([ref]) == {UID: ""}
    assert kernel.driver(VF) == "vfio-pci" and override.read_text().strip() == "vfio-pci", "left as the admin had it"
    assert len(kernel.writes) == writes, "nothing written"


PF_SETTINGS = {"sriov": {"driver": "vfio-pci", "vlan": 100, "mac": "52:54:00:00:00:07"}}


@pytest.fixture
def pf(kernel: PciKernel) -> FakePf:
    """The VF's PF (``virtfn1`` of it, netdev ifindex ``PF_INDEX``) answering rtnetlink as the kernel."""
    kernel.function(PF, "igb", 21)
    devices = kernel.root / "bus/pci/devices"
    (devices / PF / "virtfn1").symlink_to(devices / VF)
    (devices / VF / "physfn").symlink_to(devices / PF)
    (devices / PF / "net/eth5").mkdir(parents=True)
    (devices / PF / "net/eth5/ifindex").write_text(f"{PF_INDEX}\n")
    return FakePf()


def _with_pf(preparer: Preparer, kernel: PciKernel, pf: FakePf, events: list[tuple[str, str | None]]) -> Preparer:
    """``preparer`` reaching ``pf``; ``events`` gets each PF setting and sysfs write with the VF's driver then."""
    set_one, write = pf._set, kernel.write

    def setting(attrs: bytes) -> tuple[int, str]:
        events.append(("pf", kernel.driver(VF)))
        return set_one(attrs)

    def sysfs(path: str, value: str) -> None:
        events.append(("sysfs", kernel.driver(VF)))
        write(path, value)

    pf._set = setting  # type: ignore[method-assign]
    preparer.vfio = VfioBinder(str(kernel.root), timeout_s=0.2, write=sysfs)
    preparer.vf_settings = VfioVfSettings(str(kernel.root), channel=lambda: NetlinkChannel(pf, ext_ack=True))  # type: ignore[arg-type]
    return preparer


def test_a_vf_on_vfio_pci_gets_its_pfs_settings_once_bound_and_back_before_it_leaves(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths, pf: FakePf
) -> None:
    """A KubeVirt VM's VF: its MAC and VLAN through the PF. What the PF reported before is in the
    durable record; the settings go once the VF is on vfio-pci and come back while it still is."""
    events: list[tuple[str, str | None]] = []
    preparer = _with_pf(_preparer(api, tmp_path, kernel, paths), kernel, pf, events)
    before = pf.state[1]
    ref = _claim(api, params=PF_SETTINGS)
    assert preparer.prepare_now([ref])[UID].error == ""
    assert (pf.state[1].vlan, pf.state[1].mac) == (100, "52:54:00:00:00:07")
    assert pf.sets == ["mac", "vlan"] and pf.state[0].mac == "02:00:00:00:00:00", "VF 0 untouched"
    assert [e for e in events if e[0] == "pf"] == [("pf", "vfio-pci")] * 2, "set once the VF is on vfio-pci"
    record = CheckpointStore(preparer.store.directory).read(lambda s: s.claims[UID].devices[0].vf_settings)
    assert record == {"pf": PF, "vf": 1, "host": before.to_dict(), "pod": pf.state[1].to_dict()}
    events.clear()
    assert preparer.unprepare_now([ref]) == {UID: ""}
    assert pf.state[1] == before and kernel.driver(VF) == "igbvf"
    assert events[:2] == [("pf", "vfio-pci")] * 2 and events[2][0] == "sysfs", "settings back before the VF leaves"


def test_a_setting_the_pf_refuses_takes_the_vfio_claim_back_whole(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths, pf: FakePf
) -> None:
    preparer = _with_pf(_preparer(api, tmp_path, kernel, paths), kernel, pf, [])
    pf.refuse["vlan"] = (errno.EOPNOTSUPP, "VLAN not supported in switchdev mode")
    before = pf.state[1]
    answer = preparer.prepare_now([_claim(api, params=PF_SETTINGS)])[UID]
    assert "device pci-0000-44-10-0: sriov.vlan: the PF eth5 refused it for VF 1" in answer.error, answer.error
    assert "VLAN not supported in switchdev mode" in answer.error
    assert pf.state[1] == before, "the MAC set before the refusal put back"
    assert kernel.driver(VF) == "igbvf" and preparer.store.read(lambda s: s.claims) == {}


def test_a_vfs_pf_settings_come_back_after_a_reboot_and_a_mac_of_none_is_restored(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths, pf: FakePf
) -> None:
    """A reboot resets the PF's VF settings and the VF's driver: a start binds and sets them again.
    A PF that held no MAC for the VF holds none again after (the VF's driver takes its own at probe)."""
    preparer = _with_pf(_preparer(api, tmp_path, kernel, paths), kernel, pf, [])
    pf.state[1] = before = replace(pf.state[1], mac="00:00:00:00:00:00")
    ref = _claim(api, params=PF_SETTINGS)
    assert preparer.prepare_now([ref])[UID].error == ""
    preparer.vfio.give_back(VF, "igbvf")
    pf.state[1] = before
    assert preparer.restore_vfio() == []
    assert kernel.driver(VF) == "vfio-pci" and (pf.state[1].vlan, pf.state[1].mac) == (100, "52:54:00:00:00:07")
    assert preparer.unprepare_now([ref]) == {UID: ""}
    assert pf.state[1] == before


def test_a_vf_whose_pf_cannot_be_read_is_refused_before_anything_changes(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths, pf: FakePf
) -> None:
    preparer = _with_pf(_preparer(api, tmp_path, kernel, paths), kernel, pf, [])
    (kernel.root / "bus/pci/devices" / PF / "net/eth5/ifindex").unlink()
    (kernel.root / "bus/pci/devices" / PF / "net/eth5").rmdir()
    answer = preparer.prepare_now([_claim(api, params=PF_SETTINGS)])[UID]
    assert answer.error == (
        "ResourceClaim ns/dpdk: sriov: device pci-0000-44-10-0: the PF 0000:44:00.0 has no netdev on the host"
    )
    assert kernel.writes == [] and pf.sets == [] and preparer.store.read(lambda s: s.claims) == {}


class Sink:
    def __init__(self) -> None:
        self.ready: list[tuple[str, list[DeviceResult]]] = []

    def pod_network_ready(self, pod_uid: str, claim: object, results: list[DeviceResult]) -> None:
        self.ready.append((pod_uid, list(results)))


def test_the_pod_of_a_vf_on_vfio_pci_is_told_ready_as_it_starts(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths, pf: FakePf
) -> None:
    """Nothing moves at RunPodSandbox for a VF on vfio-pci; its claim's status still says Ready (reason
    ``VfioReady``, the VF's PCI function and group, the MAC its PF gives it)."""
    preparer = _with_pf(_preparer(api, tmp_path, kernel, paths), kernel, pf, [])
    ref = _claim(api, params=PF_SETTINGS)
    assert preparer.prepare_now([ref])[UID].error == ""
    sink = Sink()
    hooks = NRIHooks(preparer.store, host_netns="/proc/self/ns/net", status=sink)  # type: ignore[arg-type]
    try:
        hooks.run_pod_sandbox(json_format.ParseDict(pod_json("pod-1", ""), nri.PodSandbox()))
    finally:
        hooks.close()
    [(pod_uid, [result])] = sink.ready
    assert pod_uid == "pod-1" and result.device == VF_DEVICE and result.hardware_address == "52:54:00:00:00:07"
    claim = preparer.store.read(lambda s: s.claims[UID])
    body = status_body(StatusUpdate("pod-1", claim, ready={VF_DEVICE: result}), {}, "dra.net", None)
    [entry] = body["status"]["devices"]
    [ready] = entry["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "VfioReady")
    assert ready["message"] == f"VF {VF} (/dev/vfio/22) on vfio-pci for pod pod-1"
    assert entry["networkData"] == {"hardwareAddress": "52:54:00:00:00:07"}


def test_a_container_gets_the_vfio_devices_the_nodes_kernel_has(
    api: FakeAPIServer, tmp_path: Path, kernel: PciKernel, paths: MetadataPaths
) -> None:
    """A kernel without the VFIO container API (``CONFIG_VFIO_CONTAINER=n``) has no /dev/vfio/vfio: a
    CDI spec naming it would keep the container from starting. The group is attached to iommufd
    (/dev/iommu) there instead; the nodes are read at prepare and kept in the record."""
    (kernel.root / "class/misc/vfio").rmdir()
    (kernel.root / "class/misc/iommu").mkdir(parents=True)
    preparer = _preparer(api, tmp_path, kernel, paths)
    assert preparer.prepare_now([_claim(api)])[UID].error == ""
    [spec_path] = Path(paths.cdi_dir).iterdir()
    [cdi_device] = json.loads(spec_path.read_text())["devices"]
    assert cdi_device["containerEdits"]["deviceNodes"] == [{"path": "/dev/vfio/22"}, {"path": "/dev/iommu"}]
    record = CheckpointStore(preparer.store.directory).read(lambda s: s.claims[UID].devices[0])
    assert record.vfio_nodes == ("/dev/vfio/22", "/dev/iommu")
