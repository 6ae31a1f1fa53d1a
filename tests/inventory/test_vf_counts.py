"""driver.inventory.vf_counts on a sysfs tree of files: the chart's ``sriov.vfs`` decoded with
errors naming the field, and applied once per PF (through 0, as the kernel needs), never over a
prepared VF, one PF's trouble never another's. The same on real igb PFs:
tests/inventory/test_sriov_vfs.py, in the stock-kernel tier's SR-IOV guest."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from driver.inventory import vf_counts

PF_A, PF_B = "0000:41:00.0", "0000:81:00.0"


def _pf(root: Path, pci: str, name: str, total: int, current: int, device: str = "0x10c9") -> None:
    dev = root / "bus/pci/devices" / pci
    (dev / "net" / name).mkdir(parents=True)
    for file, value in (("sriov_totalvfs", total), ("sriov_numvfs", current), ("vendor", "0x8086"), ("device", device)):
        (dev / file).write_text(f"{value}\n")
    for i in range(current):
        vf = root / "bus/pci/devices" / f"{pci[:-1]}{i + 1}"
        vf.mkdir()
        (dev / f"virtfn{i}").symlink_to(vf)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    _pf(tmp_path, PF_A, "ens1f0", 7, 2)
    _pf(tmp_path, PF_B, "ens2f0", 7, 0, device="0x1572")
    nic = tmp_path / "bus/pci/devices/0000:01:00.0"  # no SR-IOV: never looked at
    nic.mkdir()
    (nic / "vendor").write_text("0x8086\n")
    return tmp_path


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every write to a sriov_numvfs, in order (then made, as the kernel would)."""
    done: list[tuple[str, int]] = []
    real = vf_counts._write

    def write(path: str, value: str) -> None:
        done.append((path.split("/")[-2], int(value)))
        real(path, value)

    monkeypatch.setattr(vf_counts, "_write", write)
    return done


def _numvfs(root: Path, pci: str) -> int:
    return int((root / "bus/pci/devices" / pci / "sriov_numvfs").read_text())


def test_counts_are_written_through_zero_and_only_where_they_differ(sysfs: Path, writes: list) -> None:
    counts = vf_counts.decode(
        json.dumps(
            [
                {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4},
                {"nicSelector": {"vendor": "0x8086", "deviceID": "1572"}, "numVfs": 3},
            ]
        )
    )
    outcomes = vf_counts.apply(counts, str(sysfs), prepared=())
    assert [(o.pf, o.where, o.before, o.after, o.refused) for o in outcomes] == [
        (PF_A, "sriov.vfs[0]", 2, 4, ""),
        (PF_B, "sriov.vfs[1]", 0, 3, ""),
    ]
    assert writes == [(PF_A, 0), (PF_A, 4), (PF_B, 3)], "a count over another goes through 0"
    writes.clear()
    assert [o.refused for o in vf_counts.apply(counts, str(sysfs), prepared=())] == ["", ""]
    assert writes == [], "at its count a PF is left alone (a restart writes nothing)"


def test_a_pf_whose_vf_is_prepared_keeps_its_count(sysfs: Path, writes: list) -> None:
    counts = vf_counts.decode('[{"nicSelector": {"rootDevices": ["0000:41:00.0"]}, "numVfs": 5}]')
    (outcome,) = vf_counts.apply(counts, str(sysfs), prepared={"0000:41:00.2"})
    assert (outcome.before, outcome.after) == (2, 2) and writes == []
    assert "sriov.vfs[0].numVfs" in outcome.refused and "0000:41:00.2 prepared" in outcome.refused
    assert _numvfs(sysfs, PF_A) == 2


def test_one_pfs_trouble_never_keeps_another_from_its_count(
    sysfs: Path, writes: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = vf_counts.decode(
        json.dumps(
            [
                {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 8},
                {"nicSelector": {"pfNames": ["ens2f0"]}, "numVfs": 1},
            ]
        )
    )
    over, fine = vf_counts.apply(counts, str(sysfs), prepared=())
    assert over.refused == "sriov.vfs[0].numVfs: 8 is above PF 0000:41:00.0's sriov_totalvfs (7)"
    assert (fine.after, fine.refused) == (1, "") and _numvfs(sysfs, PF_B) == 1

    def refuse(path: str, count: str) -> None:
        if int(count):
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        Path(path).write_text("0")

    monkeypatch.setattr(vf_counts, "_write", refuse)
    (kernel,) = vf_counts.apply(
        vf_counts.decode('[{"nicSelector": {"pfNames": ["ens2f0"]}, "numVfs": 2}]'), str(sysfs), ()
    )
    assert kernel.refused == "sriov.vfs[0].numVfs: PF 0000:81:00.0 refused 2 VFs: Cannot allocate memory (it has 0)"
    assert kernel.after == 0, "what the PF has now, not what was asked"


def test_two_entries_selecting_one_pf_differently_are_refused_for_it(sysfs: Path, writes: list) -> None:
    counts = vf_counts.decode(
        json.dumps(
            [{"nicSelector": {"vendor": "8086"}, "numVfs": 2}, {"nicSelector": {"pfNames": ["ens2f0"]}, "numVfs": 4}]
        )
    )
    a, b = vf_counts.apply(counts, str(sysfs), prepared=())
    assert (a.pf, a.refused) == (PF_A, "")
    assert b.refused == "sriov.vfs[0] and sriov.vfs[1] both select PF 0000:81:00.0 with different numVfs"
    assert writes == [], "PF A was at 2 already; PF B left as it was"


def test_no_entries_touch_nothing(sysfs: Path, writes: list) -> None:
    assert vf_counts.decode("") == [] and vf_counts.apply([], str(sysfs), ()) == [] and writes == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "sriov.vfs: not JSON"),
        ('{"numVfs": 1}', "sriov.vfs: must be a list"),
        ("[1]", "sriov.vfs[0]: must be an object"),
        ('[{"nicSelector": {"pfNames": ["a"]}, "numVfs": -1}]', "sriov.vfs[0].numVfs: must be a whole number"),
        ('[{"nicSelector": {"pfNames": ["a"]}, "numVfs": true}]', "sriov.vfs[0].numVfs: must be a whole number"),
        ('[{"nicSelector": {}, "numVfs": 1}]', "sriov.vfs[0].nicSelector: must name at least one"),
        ('[{"numVfs": 1}]', "sriov.vfs[0].nicSelector: must name at least one"),
        ('[{"nicSelector": {"pfName": "a"}, "numVfs": 1}]', "sriov.vfs[0].nicSelector: must name at least one"),
        ('[{"nicSelector": {"pfNames": ["a"], "pfName": "a"}, "numVfs": 1}]', "unknown field 'pfName'"),
        ('[{"nicSelector": {"pfNames": "a"}, "numVfs": 1}]', "sriov.vfs[0].nicSelector.pfNames: must be a list"),
        ('[{"nicSelector": {"rootDevices": ["41:00.0"]}, "numVfs": 1}]', "rootDevices: '41:00.0' is not a PCI address"),
        ('[{"nicSelector": {"vendor": "intel"}, "numVfs": 1}]', "sriov.vfs[0].nicSelector.vendor: 'intel' is not"),
        ('[{"nicSelector": {"pfNames": ["a"]}, "numVfs": 1, "mtu": 9000}]', "sriov.vfs[0]: unknown field 'mtu'"),
    ],
)
def test_bad_entries_name_the_field(text: str, message: str) -> None:
    with pytest.raises(vf_counts.VfCountError, match=None) as raised:
        vf_counts.decode(text)
    assert message in str(raised.value), str(raised.value)
