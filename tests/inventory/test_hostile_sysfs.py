"""A bad device never takes the node's other devices down.

Each case damages one device of a kernel-shaped fixture tree (single-socket: E810, ConnectX-6 Dx
with mlx5_0, eRDMA, a bridge and a bond) the way a hostile or broken node can: a name that is
not UTF-8, dangling and looping links, a looped class/infiniband link, a file that cannot be
read, a FIFO where an attribute belongs, integers past the int64 range. The scan must finish
(bounded time), publish every healthy device unchanged, skip or trim only the bad one, and say
so in one warning naming it. The non-UTF-8 name is also tried on a real veth in a namespace
(real sysfs, real netlink), and an unreadable file with a real EACCES.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from driver.inventory.discovery import Scanner
from driver.model.device import INT64_MAX, Device

REPO = str(Path(__file__).resolve().parents[2])
SCAN_TIMEOUT = 10.0
MLX_NIC = "0000:31:00.0"  # ConnectX-6 Dx, ens2f0np0, mlx5_0
E810 = "0000:17:00.0"
ERDMA = "0000:5e:00.0"


def scan(root: Path) -> list[Device]:
    """Scan in a thread with a deadline: a read that blocks must fail the test, not hang it."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["devices"] = Scanner(str(root), pci_ids_paths=()).scan()
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(SCAN_TIMEOUT)
    assert not thread.is_alive(), f"the scan blocked for more than {SCAN_TIMEOUT} s"
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["devices"]  # type: ignore[return-value]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Device]]:
    from devcluster.doubles.sysfs_fixture import build

    root = build("single-socket", tmp_path_factory.mktemp("hostile") / "base")
    return root, {d.name: d for d in Scanner(str(root), pci_ids_paths=()).scan()}


def _replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _bad_name(root: Path) -> None:
    net = os.fsencode(root / "class/net")
    os.symlink(os.readlink(root / "class/net/br0"), os.path.join(net, b"bad\xff\xfe"))


def _loop_infiniband(root: Path) -> None:
    link = root / "class/infiniband/erdma_0"
    link.unlink()
    link.symlink_to("erdma_0")


# case -> (damage, devices expected to be gone, devices whose attributes may change, warned label)
CASES: dict[str, tuple[Callable[[Path], None], set[str], set[str], str]] = {
    "non-utf8-name": (_bad_name, set(), set(), "netdev b'bad\\xff\\xfe'"),
    "dangling-net-link": (
        lambda r: (r / "class/net/ghost").symlink_to("../../devices/virtual/net/ghost"),
        set(),
        set(),
        "netdev b'ghost'",
    ),
    "looping-net-link": (lambda r: (r / "class/net/loop0").symlink_to("loop0"), set(), set(), "netdev b'loop0'"),
    "looped-infiniband-link": (_loop_infiniband, {"pci-0000-5e-00-0"}, set(), "RDMA device b'erdma_0'"),
    "class-unreadable": (
        lambda r: _replace_with_dir(r / f"bus/pci/devices/{E810}/class"),
        {"pci-0000-17-00-0"},
        set(),
        f"PCI function {E810}",
    ),
    "fifo-numa-node": (
        lambda r: _replace_with_fifo(r / f"bus/pci/devices/{MLX_NIC}/numa_node"),
        set(),
        {"pci-0000-31-00-0"},
        f"bus/pci/devices/{MLX_NIC}",
    ),
    "fifo-rate": (
        lambda r: _replace_with_fifo(r / "class/infiniband/mlx5_0/ports/1/rate"),
        set(),
        {"pci-0000-31-00-0"},
        "class/infiniband/mlx5_0",
    ),
    "numa-past-int64": (
        lambda r: (r / f"bus/pci/devices/{MLX_NIC}/numa_node").write_text("99999999999999999999999\n"),
        set(),
        {"pci-0000-31-00-0"},
        "pci-0000-31-00-0",
    ),
    "rate-past-int64": (
        lambda r: (r / "class/infiniband/mlx5_0/ports/1/rate").write_text("99999999999999999999999 Gb/sec (4X)\n"),
        set(),
        {"pci-0000-31-00-0"},
        "pci-0000-31-00-0",
    ),
    "rate-400-digits": (
        lambda r: (r / "class/infiniband/mlx5_0/ports/1/rate").write_text("9" * 400 + " Gb/sec (4X)\n"),
        set(),
        {"pci-0000-31-00-0"},
        "pci-0000-31-00-0",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_bad_device_never_hides_the_others(
    case: str, pristine: tuple[Path, dict[str, Device]], tmp_path: Path, caplog
) -> None:
    base, before = pristine
    damage, gone, changed, label = CASES[case]
    root = tmp_path / "sys"
    shutil.copytree(base, root, symlinks=True)
    damage(root)
    with caplog.at_level(logging.WARNING):
        after = {d.name: d for d in scan(root)}
    assert set(after) == set(before) - gone, "a phantom device appeared or a healthy one vanished"
    for name, device in before.items():
        if name not in gone and name not in changed:
            assert after[name] == device, f"{name} changed although it is healthy"
    for device in after.values():
        for attr, value in device.attributes.items():
            if isinstance(value, int):
                assert -INT64_MAX - 1 <= value <= INT64_MAX, (device.name, attr, value)
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and label in " ".join(map(str, r.kv.values()))
    ]
    assert len(warnings) == 1, [(r.getMessage(), r.kv) for r in caplog.records]


def test_a_problem_is_warned_about_once_not_every_scan(pristine, tmp_path: Path, caplog) -> None:
    root = tmp_path / "sys"
    shutil.copytree(pristine[0], root, symlinks=True)
    _bad_name(root)
    scanner = Scanner(str(root), pci_ids_paths=())
    with caplog.at_level(logging.DEBUG, logger="driver.inventory"):
        for _ in range(3):
            scanner.scan()
    levels = [r.levelno for r in caplog.records if "bad" in " ".join(map(str, getattr(r, "kv", {}).values()))]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


EACCES_SCAN = (
    """
import json, logging, sys
sys.path.insert(0, %r)
logging.basicConfig(level=logging.WARNING, format="%%(message)s %%(kv)s")
from driver.inventory.discovery import Scanner
print(json.dumps(sorted(d.name for d in Scanner(sys.argv[1], pci_ids_paths=()).scan())))
"""
    % REPO
)


def test_a_really_unreadable_file(pristine, tmp_path: Path) -> None:
    """Mode 000 owned by nobody, read by root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (root
    with them reads anything): a real EACCES from the kernel, not a simulation."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop capabilities")
    base, before = pristine
    root = tmp_path / "sys"
    shutil.copytree(base, root, symlinks=True)
    for p in (tmp_path, root):
        p.chmod(0o755)
    target = root / f"bus/pci/devices/{E810}/class"
    target = Path(os.path.realpath(target))
    os.chown(target, 65534, 65534)
    target.chmod(0o000)
    drop = "-dac_override,-dac_read_search"
    out = subprocess.run(
        ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", "--", sys.executable, "-c", EACCES_SCAN, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == sorted(set(before) - {"pci-0000-17-00-0"})
    assert "PCI function 0000:17:00.0" in out.stderr and "Permission denied (EACCES)" in out.stderr


NETNS_SCAN = (
    """
import json, logging, sys
sys.path.insert(0, %r)
logging.basicConfig(level=logging.WARNING, format="%%(message)s %%(kv)s")
from driver.inventory.discovery import Scanner
print(json.dumps(sorted(d.name for d in Scanner(pci_ids_paths=()).scan())))
"""
    % REPO
)


@pytest.mark.root
def test_a_real_veth_with_a_non_utf8_name(netns_factory) -> None:
    """The kernel accepts any byte but NUL, '/' and whitespace: a veth named b'dn\\xff\\xfe' in a
    namespace, scanned there with its real sysfs and netlink (``ip netns exec``)."""
    ns = netns_factory.netns()
    subprocess.run(["ip", "-n", ns, "link", "add", b"dn\xff\xfe", "type", "veth", "peer", "name", "okpeer"], check=True)
    good, good_peer = netns_factory.veth(netns=ns, peer_netns=ns)
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", NETNS_SCAN], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # PCI functions are not namespaced (bus/pci shows the host's): only the netdevs count here.
    assert {n for n in json.loads(out.stdout) if not n.startswith("pci-")} == {"okpeer", good, good_peer}
    assert "netdev b'dn\\\\xff\\\\xfe'" in out.stderr and "not valid UTF-8" in out.stderr
