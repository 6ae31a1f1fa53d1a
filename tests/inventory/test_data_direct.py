"""ConnectX-8 "Data Direct": a NIC whose RDMA DMA goes through a separate PCI function (15b3:2100)
publishes that function's ``pcieRoot`` (the GPU's), and never loses its device when the link
between the two cannot be established.

The gb300 fixture is shaped like a GB300 / ConnectX-8 tray: each NIC's own function (netdev, RDMA
device) is alone under a root port of its own domain, its Data Direct function sits in the CX8's
PCIe switch on the GPU's root port, the two tied by the VPD keywords VU (the kernel's key) and V3
(rdma_topo's). Every test reads sysfs only, as the driver does.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from devcluster.doubles.sysfs_fixture import build, load_topology, vpd_image
from driver.inventory.discovery import Scanner
from driver.inventory.sysfs import (
    PLAIN_IO,
    DataDirectIndex,
    ReadAnswer,
    SysfsIO,
    SysfsReader,
    data_direct_for,
    pcie_root_of,
    vpd_keywords,
)
from driver.inventory.topology import PCIE_ROOT, PCIE_SWITCH, PXB, SWITCH_PATHS, pair_templates, read_topology
from driver.model.device import Device

D, S = "dra.net/", "resource.kubernetes.io/"
# gb300.yaml: NIC function -> (its netdev, the domain of its own root, its Data Direct function, the GPU).
GB300 = {
    "0000:01:00.0": ("ibp1s0", "pci0000:00", "0008:03:00.0", "0008:06:00.0"),
    "0002:01:00.0": ("ibP2p1s0", "pci0002:00", "0009:03:00.0", "0009:06:00.0"),
    "0010:01:00.0": ("ibP16p1s0", "pci0010:00", "0018:03:00.0", "0018:06:00.0"),
    "0012:01:00.0": ("ibP18p1s0", "pci0012:00", "0019:03:00.0", "0019:06:00.0"),
}


def scan(root: Path) -> dict[str, Device]:
    return {d.host.pci_address or d.name: d for d in Scanner(str(root), pci_ids_paths=(), replay=False).scan()}


def real(root: Path, bdf: str) -> Path:
    return (root / "bus/pci/devices" / bdf).resolve()


@pytest.fixture
def gb300(tmp_path: Path) -> Path:
    """A private (writable) gb300 tree."""
    return build("gb300", tmp_path / "sys")


# -- VPD -----------------------------------------------------------------------------------------


def test_vpd_keywords_read_the_read_only_section() -> None:
    image = vpd_image(
        "NVIDIA ConnectX-8", {"PN": "900-9X81Q", "SN": "MT0001", "V3": "5a3c0e", "VU": "MT0001MLNXS0D0F0"}
    )
    assert vpd_keywords(image) == {"PN": "900-9X81Q", "SN": "MT0001", "V3": "5a3c0e", "VU": "MT0001MLNXS0D0F0"}
    assert sum(image[: image.index(b"RV") + 4]) % 256 == 0  # RV: the checksum over everything up to it


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 64,
        b"\xff" * 4096,
        b"\x82\xff\xff",  # an identifier longer than the image
        b"\x90\x08\x00VU\x7fabc",  # a keyword longer than its section
        bytes(range(256)) * 200,  # past 32 KiB of noise
    ],
)
def test_vpd_keywords_never_raise_on_damaged_images(data: bytes) -> None:
    assert isinstance(vpd_keywords(data), dict)


def test_vpd_keywords_keep_what_was_whole_before_the_damage() -> None:
    image = vpd_image("x", {"V3": "abc", "VU": "def"})
    cut = image[: image.index(b"VU") + 4]  # VU's value cut short: the section no longer fits
    assert vpd_keywords(image[:-1]) == {"V3": "abc", "VU": "def"}  # only the end tag gone
    assert vpd_keywords(cut) == {}
    binary = image.replace(b"def", b"d\xffe")  # a non-ASCII value is skipped, not decoded
    assert vpd_keywords(binary) == {"V3": "abc"}


# -- the published pcieRoot ------------------------------------------------------------------------


def test_the_published_root_is_the_data_direct_functions_not_the_netdevs(sysfs_trees: Any) -> None:
    root = sysfs_trees.get("gb300")
    devices = scan(root)
    for nic, (ifname, own_root, dma, gpu) in GB300.items():
        attrs = devices[nic].attributes
        netdev_root = pcie_root_of(str(real(root, nic).relative_to(root.resolve())))
        assert netdev_root == own_root, nic  # where the netdev's function is...
        assert attrs[S + "pcieRoot"] != netdev_root  # ...is not what is published
        dma_root = pcie_root_of(str(real(root, dma).relative_to(root.resolve())))
        gpu_root = pcie_root_of(str(real(root, gpu).relative_to(root.resolve())))
        assert attrs[S + "pcieRoot"] == dma_root == gpu_root, nic
        assert attrs[D + "dataDirectPciAddress"] == dma
        assert attrs[D + "ifName"] == ifname and attrs[D + "rdma"] is True
        assert attrs[S + "pciBusID"] == nic  # the device is still the NIC's own function
    # The BlueField-3 front end has no Data Direct function: its own root, no extra attribute.
    bf3 = devices["0006:03:00.0"].attributes
    assert bf3[S + "pcieRoot"] == "pci0006:00" and D + "dataDirectPciAddress" not in bf3


def test_the_data_direct_function_itself_is_no_device(sysfs_trees: Any, caplog: pytest.LogCaptureFixture) -> None:
    """15b3:2100 reports a network class but is a DMA engine: skipped with the reason, never published."""
    with caplog.at_level(logging.WARNING):
        devices = scan(sysfs_trees.get("gb300"))
    dmas = {dma for _, _, dma, _ in GB300.values()}
    assert not dmas & set(devices)
    skipped = [r for r in caplog.records if "device skipped" in r.getMessage()]
    reasons = {r.kv["device"]: r.kv["reason"] for r in skipped}  # type: ignore[attr-defined]
    assert {f"PCI function {d}" for d in dmas} <= set(reasons)
    assert all("Data Direct DMA function" in reasons[f"PCI function {d}"] for d in dmas)


def test_topology_and_pairs_place_the_nic_at_its_data_direct_function(sysfs_trees: Any) -> None:
    topo = read_topology(str(sysfs_trees.get("gb300")))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    for nic, (_, _, dma, gpu) in GB300.items():
        assert by_bus[nic].data_direct == dma and by_bus[nic].pcie_root == by_bus[gpu].pcie_root
        # DMA function one switch port below the CX8's upstream port, the GPU two levels further.
        assert topo.relation(by_bus[gpu], by_bus[nic]) == PXB
    pairs = {p.gpu.pci_bus_id: (p.nic.pci_bus_id, p.path) for p in topo.pairs()}
    assert pairs == {gpu: (nic, PXB) for nic, (_, _, _, gpu) in GB300.items()}
    (root,) = pair_templates(topo, 4, PCIE_ROOT)
    assert {(p.gpu.pci_bus_id, p.nic.pci_bus_id) for p in root.pairs} == {(g, n) for n, (_, _, _, g) in GB300.items()}
    switch = pair_templates(topo, 2, PCIE_SWITCH)
    assert [len(t.pairs) for t in switch] == [2, 2] and all(p.path in SWITCH_PATHS for t in switch for p in t.pairs)


def test_without_data_direct_the_gb300_nics_do_not_pair(gb300: Path) -> None:
    """The netdev's own root would pair nothing: what NVIDIA's network operator warns about."""
    for _, _, dma, _ in GB300.values():
        (real(gb300, dma) / "driver").unlink()  # unbound: mlx5_ib does not use it
    topo = read_topology(str(gb300))
    assert not [p for p in topo.pairs() if p.path in SWITCH_PATHS]
    assert {n.pci_bus_id: n.pcie_root for n in topo.nics if n.pci_bus_id in GB300} == {
        nic: own for nic, (_, own, _, _) in GB300.items()
    }


# -- matching ------------------------------------------------------------------------------------


def _set_vpd(root: Path, bdf: str, read_only: dict[str, str]) -> None:
    (real(root, bdf) / "vpd").write_bytes(vpd_image("NVIDIA ConnectX-8 SuperNIC", read_only))


def test_vu_is_trusted_before_v3(gb300: Path) -> None:
    """The kernel pairs by VU: where VU and V3 disagree, VU wins."""
    nic0, nic1 = "0000:01:00.0", "0002:01:00.0"
    dma0, dma1 = GB300[nic0][2], GB300[nic1][2]
    _set_vpd(gb300, dma0, {"V3": "card-0", "VU": "vuid-1"})
    _set_vpd(gb300, dma1, {"V3": "card-1", "VU": "vuid-0"})
    _set_vpd(gb300, nic0, {"V3": "card-0", "VU": "vuid-0"})
    match = data_direct_for(SysfsReader(str(gb300)), nic0)
    assert match.function is not None and match.function.pci_address == dma1 and match.keyword == "VU"


def test_v3_alone_matches_as_rdma_topo_does(gb300: Path) -> None:
    for nic, (_, _, dma, _) in GB300.items():
        _set_vpd(gb300, dma, {"V3": f"card-{dma}"})
        _set_vpd(gb300, nic, {"V3": f"card-{dma}", "SN": "same-board"})
    sysfs = SysfsReader(str(gb300))
    for nic, (_, _, dma, _) in GB300.items():
        match = data_direct_for(sysfs, nic)
        assert match.function is not None and (match.function.pci_address, match.keyword) == (dma, "V3")


def test_a_vf_uses_its_pfs_vpd(tmp_path: Path) -> None:
    """VFs have no VPD of their own: the card's is their PF's, and so is their Data Direct function."""
    topo = load_topology("gb300")
    nic = next(d for d in topo["pci"] if d["bdf"] == "0000:01:00.0")
    nic["sriov"] = {"total": 4, "num": 2, "offset": 1, "vf_device": "0x101e", "vf_driver": "mlx5_core"}
    root = build(topo, tmp_path / "sys")
    devices = scan(root)
    for vf in ("0000:01:00.1", "0000:01:00.2"):
        assert devices[vf].attributes[S + "pcieRoot"] == "pci0008:00", vf
        assert devices[vf].attributes[D + "dataDirectPciAddress"] == "0008:03:00.0"


# -- falling back --------------------------------------------------------------------------------


def _fallback(root: Path, nic: str, caplog: pytest.LogCaptureFixture) -> str:
    """Scan; the NIC must still be published, with its own root and no Data Direct attribute; the
    reason logged for it."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="driver.inventory.device_builder"):
        devices = scan(root)
    attrs = devices[nic].attributes
    assert attrs[S + "pcieRoot"] == GB300[nic][1] and D + "dataDirectPciAddress" not in attrs
    assert attrs[D + "rdma"] is True and attrs[D + "ifName"] == GB300[nic][0]
    reasons = [r.kv["reason"] for r in caplog.records if getattr(r, "kv", {}).get("pci") == nic]  # type: ignore[attr-defined]
    assert len(reasons) == 1, reasons
    return str(reasons[0])


def test_an_unbound_data_direct_function_is_not_used(gb300: Path, caplog: pytest.LogCaptureFixture) -> None:
    (real(gb300, "0008:03:00.0") / "driver").unlink()
    assert "0008:03:00.0 (VPD VU) is bound to no driver" in _fallback(gb300, "0000:01:00.0", caplog)


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage", "directory", "fifo", "unreadable"])
def test_a_nic_vpd_that_cannot_be_used_falls_back(gb300: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    vpd = real(gb300, "0000:01:00.0") / "vpd"
    vpd.unlink()
    if damage == "empty":
        vpd.write_bytes(b"")
    elif damage == "garbage":
        vpd.write_bytes(os.urandom(512).replace(b"\x90", b"\x91"))  # no read-only section
    elif damage == "directory":
        vpd.mkdir()
    elif damage == "fifo":
        os.mkfifo(vpd)  # must not hang the scan
    elif damage == "unreadable":
        vpd.write_bytes(vpd_image("x", {"V3": "y"}))
        vpd.chmod(0)
        if os.access(vpd, os.R_OK):  # root reads it anyway: make it a dangling link instead
            vpd.unlink()
            vpd.symlink_to("nowhere")
    reason = _fallback(gb300, "0000:01:00.0", caplog)
    assert reason.startswith("Data Direct functions are present but the NIC's VPD"), reason


def test_data_direct_functions_whose_vpd_cannot_be_read_are_named(
    gb300: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (real(gb300, "0008:03:00.0") / "vpd").unlink()
    reason = _fallback(gb300, "0000:01:00.0", caplog)
    assert "no Data Direct function matches its VPD" in reason and "0008:03:00.0: VPD is missing" in reason
    assert scan(gb300)["0002:01:00.0"].attributes[S + "pcieRoot"] == "pci0009:00"  # the others are unaffected


def test_two_data_direct_functions_with_one_key_are_ambiguous(gb300: Path, caplog: pytest.LogCaptureFixture) -> None:
    for bdf in ("0008:03:00.0", "0009:03:00.0", "0000:01:00.0"):
        _set_vpd(gb300, bdf, {"V3": "one-card"})
    assert "0008:03:00.0, 0009:03:00.0 all match its VPD V3: ambiguous" in _fallback(gb300, "0000:01:00.0", caplog)


def test_a_data_direct_function_outside_any_host_bridge_is_not_used(gb300: Path) -> None:
    """A function whose real path names no ``pci<domain>:<bus>`` (an odd tree) gives no root."""
    index = DataDirectIndex.scan(SysfsReader(str(gb300)))
    odd = index.functions[0]
    index.functions[0] = type(odd)(odd.pci_address, None, "devices/platform/x", odd.driver, odd.keywords)
    match = index.match(SysfsReader(str(gb300)), "0000:01:00.0")
    assert match.function is None and match.problem and "under no PCI host bridge" in match.problem


# -- cost ----------------------------------------------------------------------------------------


class _Reads(SysfsIO):
    """Counts the files a scan reads, by name."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def read(self, path: str, vouched: bool = False) -> ReadAnswer:
        self.paths.append(path)
        return PLAIN_IO.read(path, vouched)


@pytest.mark.parametrize("topology", ["dgx-h100", "nd-h100-v5", "gb200", "sriov-roce"])
def test_machines_without_data_direct_never_read_a_vpd(sysfs_trees: Any, topology: str) -> None:
    """ConnectX-7 and older (and non-Mellanox) functions are answered from their IDs: no VPD read,
    no search for Data Direct functions."""
    io = _Reads()
    sysfs = SysfsReader(str(sysfs_trees.get(topology)), io)
    for bdf in sysfs.listdir("bus/pci/devices"):
        assert data_direct_for(sysfs, bdf).function is None
    assert not [p for p in io.paths if p.endswith("/vpd")]
    assert sysfs.data_direct is None or not sysfs.data_direct.functions  # searched at most (SR-IOV VFs: 0x101e)


def test_rescans_see_a_data_direct_function_go_and_come_back(gb300: Path) -> None:
    """The daemon's Scanner replays its last scan: a VPD or driver binding that changed is a
    difference, and the next scan publishes the other root."""
    scanner = Scanner(str(gb300), pci_ids_paths=())
    first = {d.name: d for d in scanner.scan()}
    assert first["pci-0000-01-00-0"].attributes[S + "pcieRoot"] == "pci0008:00"
    driver = real(gb300, "0008:03:00.0") / "driver"
    target = driver.readlink()
    driver.unlink()
    assert {d.name: d for d in scanner.scan()}["pci-0000-01-00-0"].attributes[S + "pcieRoot"] == "pci0000:00"
    driver.symlink_to(target)
    assert {d.name: d for d in scanner.scan()}["pci-0000-01-00-0"].attributes[S + "pcieRoot"] == "pci0008:00"
    shutil.copy(real(gb300, "0009:03:00.0") / "vpd", real(gb300, "0008:03:00.0") / "vpd")  # now card 1's twice
    again = {d.name: d for d in scanner.scan()}
    assert again["pci-0000-01-00-0"].attributes[S + "pcieRoot"] == "pci0000:00"
    assert again["pci-0002-01-00-0"].attributes[S + "pcieRoot"] == "pci0002:00"  # ambiguous: both fall back
