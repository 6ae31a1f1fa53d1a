"""Discovery on fixture sysfs trees shaped like real nodes: exact devices and attributes."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.config import DEFAULT_FILTER
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner, merge_allocated
from driver.model.device import CharDevice, Device

K = "resource.kubernetes.io/"
D = "dra.net/"

# (nic BDF, mlx5, ib, numa, uverbs N) straight from topologies.md's ND H100 v5 table.
ND_ROWS = [
    ("0101:00:00.0", 0, 0),
    ("0102:00:00.0", 1, 0),
    ("0103:00:00.0", 2, 0),
    ("0104:00:00.0", 3, 0),
    ("0105:00:00.0", 4, 1),
    ("0106:00:00.0", 5, 1),
    ("0107:00:00.0", 6, 1),
    ("0108:00:00.0", 7, 1),
]


def scan(root: Path, **kw: object) -> list[Device]:
    return Scanner(str(root), pci_ids_paths=(), **kw).scan()  # type: ignore[arg-type]


def test_nd_h100_v5_exact(nd_h100_sysfs: Path) -> None:
    devices = scan(nd_h100_sysfs, exclude_interfaces=["eth0"])
    assert [d.name for d in devices] == [
        "pci-0101-00-00-0",
        "pci-0102-00-00-0",
        "pci-0103-00-00-0",
        "pci-0104-00-00-0",
        "pci-0105-00-00-0",
        "pci-0106-00-00-0",
        "pci-0107-00-00-0",
        "pci-0108-00-00-0",
    ]
    for dev, (bdf, n, numa) in zip(devices, ND_ROWS, strict=True):
        assert dev.attributes == {
            D + "ifName": f"ib{n}",
            D + "mac": f"00:00:01:49:fe:80:00:00:00:00:00:00:00:15:5d:ff:fd:33:ff:{n:02x}",
            D + "mtu": 2044,
            D + "state": "up",
            D + "type": "ipoib",
            D + "virtual": False,
            D + "encapsulation": "infiniband",
            D + "pciAddress": bdf,
            D + "pciVendor": "15b3",
            D + "pciDevice": "1021",
            D + "pciSubsystem": "0041",
            D + "numaNode": numa,
            D + "sriov": False,
            D + "rdma": True,
            D + "rdmaDevice": f"mlx5_{n}",
            D + "linkLayer": "InfiniBand",
            D + "rateGbps": 400,
            K + "pciBusID": bdf,
            K + "pcieRoot": f"pci{bdf[:4]}:00",
            K + "numaNode": numa,
        }, dev.name
        assert dev.host.pci_address == bdf and dev.host.ifname == f"ib{n}"
        assert dev.host.rdma_device == f"mlx5_{n}" and dev.host.numa_node == numa
        assert dev.host.sriov_pf is None and dev.host.virtual is False
        assert dev.host.char_devices == [
            CharDevice(f"/dev/infiniband/uverbs{n}", 231, 192 + n),
            CharDevice(f"/dev/infiniband/issm{n}", 231, 64 + n),
            CharDevice(f"/dev/infiniband/umad{n}", 231, n),
            CharDevice("/dev/infiniband/rdma_cm", 10, 58),
        ]
    # GPUs (class 0x0302) are never devices; nothing from the uplink (eth0, its VF, mlx5_an0) leaks.
    assert not any(d.host.rdma_device == "mlx5_an0" for d in devices)


def test_nd_h100_v5_without_exclusion_shows_uplink(nd_h100_sysfs: Path) -> None:
    """Sysfs alone cannot see the default route: the uplink and its VF are only dropped when named."""
    names = [d.name for d in scan(nd_h100_sysfs)]
    assert "eth0" in names and "pci-a3c5-00-02-0" in names and len(names) == 10


def test_sriov_roce(sriov_sysfs: Path) -> None:
    devices = scan(sriov_sysfs)
    by_name = {d.name: d for d in devices}
    assert len(devices) == 2 + 2 * 64  # the 4 VFs of each PF on vfio-pci too, without a netdev
    assert "pci-0000-3b-00-2" in by_name  # VF 0 of PF0
    assert "pci-0000-3b-07-5" in by_name  # VF 59
    on_vfio = by_name["pci-0000-3b-07-6"]  # VF 60 (vfio-pci): for vfio claims only (tainted when published)
    assert on_vfio.attributes[D + "pciDriver"] == "vfio-pci" and on_vfio.attributes[D + "vfIndex"] == 60
    assert D + "ifName" not in on_vfio.attributes and on_vfio.host.ifname is None
    assert D + "pciDriver" not in by_name["pci-0000-3b-07-5"].attributes
    assert "pci-0000-3a-00-0" not in by_name  # the bridge
    assert by_name["pci-0000-3b-00-0"].attributes == {
        D + "ifName": "ens1f0np0",
        D + "mac": "0c:42:a1:00:00:01",
        D + "mtu": 9000,
        D + "state": "up",
        D + "type": "device",
        D + "virtual": False,
        D + "encapsulation": "ether",
        D + "pciAddress": "0000:3b:00.0",
        D + "pciVendor": "15b3",
        D + "pciDevice": "101d",
        D + "pciSubsystem": "0016",
        D + "numaNode": 0,
        D + "sriov": True,
        D + "sriovVfs": 64,
        D + "rdma": True,
        D + "rdmaDevice": "mlx5_0",
        D + "linkLayer": "Ethernet",
        D + "rateGbps": 100,
        K + "pciBusID": "0000:3b:00.0",
        K + "pcieRoot": "pci0000:3a",
        K + "numaNode": 0,
    }
    vf = by_name["pci-0000-86-00-3"]  # VF 1 of PF1
    assert vf.attributes == {
        D + "ifName": "ens2f0v1",
        D + "mac": "0c:42:a1:00:20:01",
        D + "mtu": 9000,
        D + "state": "up",
        D + "type": "device",
        D + "virtual": False,
        D + "encapsulation": "ether",
        D + "pciAddress": "0000:86:00.3",
        D + "pciVendor": "15b3",
        D + "pciDevice": "101e",
        D + "pciSubsystem": "0016",
        D + "numaNode": 1,
        D + "sriov": False,
        D + "isSriovVf": True,
        D + "pfPciAddress": "0000:86:00.0",
        D + "pfName": "ens2f0np0",
        D + "pfDeviceID": "101d",
        D + "vfIndex": 1,
        D + "rdma": True,
        D + "rdmaDevice": "mlx5_67",
        D + "linkLayer": "Ethernet",
        D + "rateGbps": 100,
        K + "pciBusID": "0000:86:00.3",
        K + "pcieRoot": "pci0000:85",
        K + "numaNode": 1,
    }
    assert vf.host.sriov_pf == "0000:86:00.0"
    vfs = [d for d in devices if d.attributes.get(D + "isSriovVf")]
    assert len(vfs) == 128
    # Each PF's published VFs, by index: 0..63 (60..63 on vfio-pci), each index once.
    for pf in ("0000:3b:00.0", "0000:86:00.0"):
        indexes = sorted(d.attributes[D + "vfIndex"] for d in vfs if d.attributes[D + "pfPciAddress"] == pf)
        assert indexes == list(range(64)), (pf, indexes)


def test_single_socket(single_socket_sysfs: Path) -> None:
    devices = scan(single_socket_sysfs)
    assert [d.name for d in devices] == [
        "br0",
        "net-mjxw4zc7on2g64tbm5sta",
        "pci-0000-17-00-0",
        "pci-0000-17-00-1",
        "pci-0000-31-00-0",
        "pci-0000-5e-00-0",
    ]  # lo, the VGA, the bridge and the unbound NIC are gone
    by_name = {d.name: d for d in devices}
    assert by_name["br0"].attributes == {
        D + "ifName": "br0",
        D + "mac": "b4:96:91:00:00:10",
        D + "mtu": 1500,
        D + "state": "up",
        D + "type": "bridge",
        D + "virtual": True,
        D + "encapsulation": "ether",
        D + "rdma": False,
    }
    assert by_name["net-mjxw4zc7on2g64tbm5sta"].attributes[D + "type"] == "bond"
    # Single socket: NUMA 0 is published (sysfs says 0), never omitted and never guessed.
    for d in devices[2:]:
        assert d.attributes[K + "numaNode"] == 0 and d.attributes[D + "numaNode"] == 0
        assert d.attributes[K + "pcieRoot"] in ("pci0000:00", "pci0000:31", "pci0000:5e")
    assert by_name["pci-0000-17-00-0"].attributes[K + "pcieRoot"] == "pci0000:00"
    assert by_name["pci-0000-17-00-0"].attributes[D + "rateGbps"] == 25  # from netdev speed
    alias = by_name["pci-0000-17-00-1"].attributes[D + "alias"]
    assert alias == "storage network, rack 12 top-of-rack switch port 17, do not use "
    assert len(alias.encode()) == 64
    assert D + "rateGbps" not in by_name["pci-0000-17-00-1"].attributes  # no speed file (link down)
    # eRDMA: PCI class 0x00ff, no netdev, found from class/infiniband.
    assert by_name["pci-0000-5e-00-0"].attributes == {
        D + "pciAddress": "0000:5e:00.0",
        D + "pciVendor": "1ded",
        D + "pciDevice": "107f",
        D + "pciSubsystem": "5007",
        D + "numaNode": 0,
        D + "sriov": False,
        D + "rdma": True,
        D + "rdmaDevice": "erdma_0",
        D + "linkLayer": "Ethernet",
        D + "rateGbps": 25,
        K + "pciBusID": "0000:5e:00.0",
        K + "pcieRoot": "pci0000:5e",
        K + "numaNode": 0,
    }


def test_vm_without_numa(vm_no_numa_sysfs: Path) -> None:
    devices = scan(vm_no_numa_sysfs)
    assert [d.name for d in devices] == ["pci-0000-00-04-0", "pci-0000-00-05-0", "pci-0000-00-06-0"]
    for d in devices:
        assert D + "numaNode" not in d.attributes and K + "numaNode" not in d.attributes
        assert d.host.numa_node is None
    # virtio-net: the netdev sits under virtio0/ below the PCI function.
    assert devices[0].attributes[D + "ifName"] == "eth0"
    assert devices[0].attributes[D + "pciVendor"] == "1af4"
    assert devices[0].attributes[D + "rdma"] is False
    assert devices[1].attributes[D + "rdmaDevice"] == "mlx5_0"


def test_many_devices(many_devices_sysfs: Path) -> None:
    devices = scan(many_devices_sysfs)
    assert len(devices) == 141
    names = [d.name for d in devices]
    assert names == sorted(names) and len(set(names)) == 141
    assert names[0] == "pci-0000-c1-00-0" and names[-1] == "pci-0000-c1-11-5"  # rid 0xc100 + 2 + 139 = 0xc18d


def test_scan_is_deterministic(sriov_sysfs: Path) -> None:
    first = [d.to_dict() for d in scan(sriov_sysfs)]
    assert first == [d.to_dict() for d in scan(sriov_sysfs)]


def test_netdev_moved_to_pod_keeps_pci_device(build_topology) -> None:
    """A NIC whose netdev is in a pod's netns still appears from the PCI scan, without netdev attributes."""
    root = build_topology("vm-no-numa")
    (root / "class/net/eth1").unlink()
    import shutil

    shutil.rmtree(root / "devices/pci0000:00/0000:00:05.0/net/eth1")
    dev = {d.name: d for d in scan(root)}["pci-0000-00-05-0"]
    assert D + "ifName" not in dev.attributes and D + "mac" not in dev.attributes
    assert dev.attributes[D + "rdmaDevice"] == "mlx5_0"


def test_merge_allocated_keeps_last_known(build_topology) -> None:
    root = build_topology("single-socket")
    before = {d.name: d for d in scan(root)}
    allocated = {"pci-0000-31-00-0": before["pci-0000-31-00-0"], "br0": before["br0"]}
    (root / "class/net/ens2f0np0").unlink()
    (root / "class/net/br0").unlink()
    (root / "devices/pci0000:31/0000:31:00.0/numa_node").write_text("1\n")  # a live value changes
    after = scan(root)
    assert "br0" not in {d.name for d in after}
    merged = {d.name: d for d in merge_allocated(after, allocated)}
    assert merged["br0"].attributes == before["br0"].attributes
    nic = merged["pci-0000-31-00-0"]
    assert nic.attributes[D + "ifName"] == "ens2f0np0" and nic.host.ifname == "ens2f0np0"
    assert nic.attributes[K + "numaNode"] == 1  # live wins
    assert [d.name for d in merge_allocated(after, allocated)] == sorted(merged)


def test_default_filter_on_fixture(single_socket_sysfs: Path) -> None:
    devices = scan(single_socket_sysfs)
    assert DeviceFilter(DEFAULT_FILTER).apply(devices) == devices  # no veth, and missing type is safe
    only_rdma = DeviceFilter('device.attributes["dra.net"].rdma == true').apply(devices)
    assert [d.name for d in only_rdma] == ["pci-0000-31-00-0", "pci-0000-5e-00-0"]


def test_pci_ids_names(single_socket_sysfs: Path, tmp_path: Path) -> None:
    ids = tmp_path / "pci.ids"
    ids.write_text(
        "# comment\n15b3  Mellanox Technologies\n\t101d  MT2892 Family [ConnectX-6 Dx]\n"
        "\t\t15b3 0016  sub\n8086  Intel Corporation\nC 02  Network controller\n"
    )
    devs = {d.name: d for d in Scanner(str(single_socket_sysfs), pci_ids_paths=[str(ids)]).scan()}
    assert devs["pci-0000-31-00-0"].attributes[D + "pciVendor"] == "Mellanox Technologies"
    assert devs["pci-0000-31-00-0"].attributes[D + "pciDevice"] == "MT2892 Family [ConnectX-6 Dx]"
    assert devs["pci-0000-17-00-0"].attributes[D + "pciDevice"] == "159b"  # unknown device: hex


@pytest.mark.parametrize(
    "topology", ["nd-h100-v5", "sriov-roce", "single-socket", "vm-no-numa", "many-devices", "dgx-h100", "gb200"]
)
def test_fixture_shape(sysfs_trees, topology: str) -> None:
    """The trees look like the kernel's: relative links, bus/pci/devices into devices/pci<dom>:<bus>."""
    root = sysfs_trees.get(topology)
    for link in (root / "bus/pci/devices").iterdir():
        assert link.is_symlink() and not Path(link.readlink()).is_absolute()
        real = link.resolve().relative_to(root.resolve())
        assert real.parts[0] == "devices" and real.parts[1].startswith("pci") and real.name == link.name
    for link in (root / "class/net").iterdir():
        assert link.is_symlink() and (link / "address").is_file()


def test_rescans_with_one_scanner_match_fresh_scans(sriov_sysfs: Path) -> None:
    """The daemon keeps one Scanner: rescans (which reuse the per-function identity cache) give
    exactly what a fresh scanner reads."""
    scanner = Scanner(str(sriov_sysfs), pci_ids_paths=())
    first = [d.to_dict() for d in scanner.scan()]
    assert [d.to_dict() for d in scanner.scan()] == first == [d.to_dict() for d in scan(sriov_sysfs)]
    assert [d.to_dict() for d in scanner.scan()] == first


def test_rescan_sees_replaced_function_and_runtime_changes(tmp_path: Path) -> None:
    """Identity facts are cached per function *object*: a function removed and re-created (hotplug)
    is read afresh, and run-time files (numa_node, driver binding) are read on every scan."""
    import shutil

    from devcluster.doubles.sysfs_fixture import build

    root = build("single-socket", tmp_path / "sys")
    scanner = Scanner(str(root), pci_ids_paths=())
    name = "pci-0000-31-00-0"
    before = {d.name: d for d in scanner.scan()}[name]
    assert before.attributes[D + "pciVendor"] == "15b3" and before.attributes[D + "numaNode"] == 0

    real = (root / "bus/pci/devices/0000:31:00.0").resolve()
    (real / "numa_node").write_text("1\n")  # in place: same function object
    after = {d.name: d for d in scanner.scan()}[name]
    assert after.attributes[D + "numaNode"] == 1 and after.attributes[D + "pciVendor"] == "15b3"

    replacement = tmp_path / "replacement"
    shutil.copytree(real, replacement, symlinks=True)
    (replacement / "vendor").write_text("0x8086\n")
    (replacement / "device").write_text("0x1592\n")
    shutil.rmtree(real)
    replacement.rename(real)  # a new directory object at the same bus address
    replaced = {d.name: d for d in scanner.scan()}[name]
    assert replaced.attributes[D + "pciVendor"] == "8086" and replaced.attributes[D + "pciDevice"] == "1592"
    assert [d.to_dict() for d in scanner.scan()] == [d.to_dict() for d in scan(root)]

    (real / "driver").unlink()  # unbound: no longer a device, although its identity is cached
    assert name not in {d.name for d in scanner.scan()}


def test_rescan_rdma_identity(tmp_path: Path) -> None:
    """RDMA char device numbers are cached per uverbs object; a re-created one is read afresh, and
    the ``ibdev`` name (an RDMA device can be renamed) is read on every scan."""
    import shutil

    from devcluster.doubles.sysfs_fixture import build

    root = build("nd-h100-v5", tmp_path / "sys")
    scanner = Scanner(str(root), exclude_interfaces=["eth0"], pci_ids_paths=())
    first = {d.name: d for d in scanner.scan()}
    assert first["pci-0101-00-00-0"].host.char_devices[0] == CharDevice("/dev/infiniband/uverbs0", 231, 192)

    real = (root / "class/infiniband_verbs/uverbs0").resolve()
    replacement = tmp_path / "uverbs0"
    shutil.copytree(real, replacement, symlinks=True)
    (replacement / "dev").write_text("231:200\n")
    shutil.rmtree(real)
    replacement.rename(real)
    (root / "class/infiniband_verbs/uverbs1/ibdev").write_text("mlx5_0\n")  # now also mlx5_0's
    again = {d.name: d for d in scanner.scan()}
    assert again["pci-0101-00-00-0"].host.char_devices[:2] == [
        CharDevice("/dev/infiniband/uverbs0", 231, 200),
        CharDevice("/dev/infiniband/uverbs1", 231, 193),
    ]
    assert not any(c.path == "/dev/infiniband/uverbs1" for c in again["pci-0102-00-00-0"].host.char_devices)
    assert [d.to_dict() for d in again.values()] == [d.to_dict() for d in scan(root, exclude_interfaces=["eth0"])]


def test_soft_rdma_devices_are_published_with_their_netdevs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """rxe and siw have no bus device (the kernel puts them under devices/virtual/infiniband): each
    is published with the netdev the kernel ties it to; one whose netdev is not here is skipped with
    the reason, never silently."""
    from devcluster.doubles.sysfs_fixture import build, load_topology

    topo = load_topology("vm-no-numa")
    topo["netdevs"] += [
        {"name": "rxv0", "address": "02:00:00:00:00:10", "ifindex": 20},
        {"name": "siv0", "address": "02:00:00:00:00:11", "ifindex": 21},
    ]
    topo["soft_rdma"] = [
        {"name": "rxe0", "netdev": "rxv0", "rate": "10 Gb/sec (1X QDR)"},
        {"name": "siw0", "netdev": "siv0", "kind": "siw"},
        {"name": "rxe_gone", "netdev": "elsewhere0"},
        {"name": "rxe_eth0", "netdev": "eth0"},  # on a PCI NIC without an RDMA device of its own
    ]
    root = build(topo, tmp_path / "sys")
    with caplog.at_level("WARNING"):
        devices = {d.name: d for d in scan(root)}
    rxv0 = devices["rxv0"]
    assert rxv0.attributes[D + "rdma"] is True and rxv0.attributes[D + "rdmaDevice"] == "rxe0"
    assert rxv0.attributes[D + "linkLayer"] == "Ethernet" and rxv0.attributes[D + "rateGbps"] == 10
    assert rxv0.host.rdma_device == "rxe0"
    (uverbs, rdma_cm) = rxv0.host.char_devices
    assert uverbs.path.startswith("/dev/infiniband/uverbs") and rdma_cm.path == "/dev/infiniband/rdma_cm"
    assert devices["siv0"].attributes[D + "rdmaDevice"] == "siw0"
    eth0 = devices["pci-0000-00-04-0"]
    assert eth0.attributes[D + "ifName"] == "eth0" and eth0.attributes[D + "rdmaDevice"] == "rxe_eth0"
    assert devices["pci-0000-00-05-0"].attributes[D + "rdmaDevice"] == "mlx5_0"  # the PCI pairing wins
    assert not any("rxe_gone" in str(d.attributes) for d in devices.values())
    skipped = [r.kv for r in caplog.records if hasattr(r, "kv")]  # type: ignore[attr-defined]
    reason = "its netdev b'elsewhere0' is not in this network namespace"
    assert {"device": "RDMA device b'rxe_gone'", "reason": reason} in [
        {k: kv.get(k) for k in ("device", "reason")} for kv in skipped
    ], skipped
