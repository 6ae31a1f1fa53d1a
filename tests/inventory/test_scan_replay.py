"""Rescans that replay the last full scan's reads: same devices when nothing changed, a full
scan as soon as any input differs (a file rewritten in place or replaced, a link, a listing,
a re-created object). Always compared with a fresh scanner's answer."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from devcluster.doubles.sysfs_fixture import build
from driver.inventory.discovery import PCI_IDENTITY, Scanner
from driver.inventory.scan_replay import RecordingIO, ScanReplay, is_sysfs
from driver.inventory.sysfs import IdentityCache, SysfsReader
from driver.model.device import Device


def fresh(root: Path) -> list[dict[str, object]]:
    return [d.to_dict() for d in Scanner(str(root), exclude_interfaces=["eth0"], pci_ids_paths=()).scan()]


@pytest.fixture
def nd(tmp_path: Path) -> Path:
    return build("nd-h100-v5", tmp_path / "sys")


def _netdev_dir(root: Path, ifname: str) -> Path:
    return (root / "class/net" / ifname).resolve()


def _replace_file(path: Path, text: str) -> None:
    """A new file under the old name (rename over it): the old descriptor still reads the old one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def _replace_dir(path: Path, edit: Callable[[Path], None]) -> None:
    copy = path.with_name(path.name + ".copy")
    shutil.copytree(path, copy, symlinks=True)
    edit(copy)
    shutil.rmtree(path)
    copy.rename(path)


def _recreate_function(root: Path, bdf: str, subsystem: str) -> None:
    """The PCI function removed and added again (a new object) with another subsystem ID."""
    _replace_dir((root / "bus/pci/devices" / bdf).resolve(), lambda d: (d / "subsystem_device").write_text(subsystem))


CHANGES: dict[str, Callable[[Path], None]] = {
    "file rewritten in place": lambda r: (_netdev_dir(r, "ib3") / "mtu").write_text("4092\n"),
    "pci function re-created": lambda r: _recreate_function(r, "0103:00:00.0", "0x0042\n"),
    "file replaced": lambda r: _replace_file(_netdev_dir(r, "ib2") / "operstate", "down\n"),
    "netdev dir replaced": lambda r: _replace_dir(_netdev_dir(r, "ib1"), lambda d: (d / "ifalias").write_text("x\n")),
    "driver unbound": lambda r: (r / "bus/pci/devices/0105:00:00.0").resolve().joinpath("driver").unlink(),
    "netdev removed": lambda r: (r / "class/net/ib6").unlink(),
    "numa node moved": lambda r: (r / "bus/pci/devices/0107:00:00.0/numa_node").write_text("0\n"),
    "rdma rate": lambda r: (r / "class/infiniband/mlx5_4/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_changed_input_means_a_full_scan(nd: Path, change: str) -> None:
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    first = scanner.scan()  # a plain full scan, then a recorded one
    replay = scanner._replay
    assert replay is not None
    assert [d.to_dict() for d in scanner.scan()] == [d.to_dict() for d in first] and replay.replays == 1

    CHANGES[change](nd)
    after = [d.to_dict() for d in scanner.scan()]
    assert replay.replays == 1, "a replay accepted a changed input"
    assert after == fresh(nd) != [d.to_dict() for d in first]
    assert [d.to_dict() for d in scanner.scan()] == after  # and a new recording replays that


def test_replay_returns_the_full_scans_devices(tmp_path: Path) -> None:
    root = build("sriov-520", tmp_path / "sys")
    scanner = Scanner(str(root), pci_ids_paths=())
    recorded = scanner.scan()
    replayed = scanner.scan()
    assert scanner._replay is not None and scanner._replay.replays == 1
    assert len(replayed) == 520 and [d.to_dict() for d in replayed] == [d.to_dict() for d in recorded]
    scanner.close()
    assert scanner._replay is None


def test_files_beyond_the_descriptor_budget_are_reopened(nd: Path) -> None:
    io = RecordingIO(on_sysfs=False, max_fds=3)
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    scanner.scan()
    devices: list[Device] = scanner._full_scan(SysfsReader(str(nd), io), None)
    assert len(io.fds) == 3
    replay = ScanReplay(io, (devices, None))
    assert replay.verify()
    (nd / "bus/pci/devices/0108:00:00.0/numa_node").write_text("0\n")  # read by path, not by fd
    assert not replay.verify()
    replay.close()


def test_immutable_facts_are_not_read_again(nd: Path) -> None:
    """What the identity cache vouches for (a PCI function's IDs) is left out of the recording:
    rewritten in place (which sysfs never does to them) it goes unseen; the object's stat is
    what the replay repeats (a re-created function is seen: ``pci function re-created``)."""
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    first = [d.to_dict() for d in scanner.scan()]
    replay = scanner._replay
    assert replay is not None
    function = (nd / "bus/pci/devices/0103:00:00.0").resolve()
    assert str(function) in replay._stats
    (function / "subsystem_device").write_text("0x0042\n")
    assert [d.to_dict() for d in scanner.scan()] == first and replay.replays == 1


def test_an_object_without_identity_is_recorded_like_any_other(tmp_path: Path) -> None:
    """An object whose stat fails (a dangling link) has nothing vouching for it: its link is
    recorded, and a replay sees it when it comes back."""
    root = tmp_path / "sys"
    (root / "bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0", root / "bus/pci/devices/0000:00:01.0")
    io = RecordingIO(on_sysfs=False)
    sysfs = SysfsReader(str(root), io)
    anchor = "bus/pci/devices/0000:00:01.0"
    assert IdentityCache().prime(sysfs, anchor, PCI_IDENTITY) is None
    assert io.links == [str(root / anchor)] and not sysfs.vouched.link(anchor)
    replay = ScanReplay(io, ([], None))
    assert replay.verify()
    (root / "devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    assert not replay.verify()
    replay.close()


def test_sysfs_is_recognised() -> None:
    assert is_sysfs("/sys") and not is_sysfs("/tmp")


@pytest.mark.root
def test_host_sysfs_changes_end_the_replay(netns_factory) -> None:
    """On the real /sys (with netlink): a rewritten attribute and a removed netdev are seen."""
    a, _ = netns_factory.veth()
    scanner = Scanner("/sys", pci_ids_paths=())
    try:
        scanner.scan()
        scanner.scan()  # recorded
        subprocess.run(["ip", "link", "set", a, "mtu", "1400", "alias", "replayed"], check=True)
        devices = {d.name: d for d in scanner.scan()}
        assert devices[a].attributes["dra.net/mtu"] == 1400 and devices[a].attributes["dra.net/alias"] == "replayed"
        subprocess.run(["ip", "link", "del", a], check=True)
        assert a not in {d.name for d in scanner.scan()}
    finally:
        scanner.close()


def test_a_dropped_scanner_closes_the_files_it_kept(nd: Path) -> None:
    import gc

    before = len(os.listdir("/proc/self/fd"))
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    scanner.scan()
    assert len(os.listdir("/proc/self/fd")) > before  # the recording keeps files open
    del scanner
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before
