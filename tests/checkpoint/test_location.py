"""Where the prepared claims live: tmpfs, or the older drivers' disk directory while it describes
this boot; and how a start tells a node where a driver ran from a new one."""

from __future__ import annotations

import os
from pathlib import Path

from driver.checkpoint.location import boot_time, choose_state_dir, ran_before

BOOTED = 1_700_000_000.0


def _legacy(tmp_path: Path, mtime: float, names: tuple[str, ...] = ("checkpoint.json",)) -> Path:
    legacy = tmp_path / "var-lib-dranet"
    legacy.mkdir()
    for name in names:
        (legacy / name).write_text('{"version": 2, "claims": {}}')
        os.utime(legacy / name, (mtime, mtime))
    return legacy


def test_without_legacy_files_the_claims_go_to_the_state_dir(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for legacy in ("", str(tmp_path / "missing"), str(tmp_path / "empty")):
        where = choose_state_dir(str(tmp_path / "run"), legacy, BOOTED)
        assert where.directory == str(tmp_path / "run") and not where.legacy_in_use and not where.retired


def test_legacy_files_written_during_this_boot_stay_in_use(tmp_path: Path) -> None:
    # An update in place: the older instance of the rolling update still writes them.
    legacy = _legacy(tmp_path, BOOTED + 60, ("checkpoint.json", "checkpoint.journal"))
    where = choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED)
    assert where.directory == str(legacy) and where.legacy_in_use
    assert sorted(p.name for p in legacy.iterdir()) == ["checkpoint.journal", "checkpoint.json"]


def test_a_journal_appended_this_boot_keeps_an_older_snapshot_in_use(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600)
    (legacy / "checkpoint.journal").write_bytes(b"")
    os.utime(legacy / "checkpoint.journal", (BOOTED + 1, BOOTED + 1))
    assert choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED).legacy_in_use


def test_legacy_files_from_before_the_boot_are_retired_and_kept(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600, ("checkpoint.json", "checkpoint.journal"))
    where = choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED)
    assert where.directory == str(tmp_path / "run") and not where.legacy_in_use
    names = sorted(p.name for p in legacy.iterdir())
    assert len(names) == 2 and all(".before-boot-" in n for n in names), names
    assert sorted(Path(r).name.split(".before-boot-")[0] for r in where.retired) == [
        "checkpoint.journal",
        "checkpoint.json",
    ]
    # The next start finds nothing left to decide.
    assert not choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED).retired


def test_the_same_directory_is_never_legacy(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600)
    where = choose_state_dir(str(legacy), str(legacy) + "/", BOOTED)
    assert where.directory == str(legacy) and not where.retired and (legacy / "checkpoint.json").exists()


def test_a_node_where_a_driver_ran_is_told_from_a_new_one(tmp_path: Path) -> None:
    marker = tmp_path / "plugins" / "dra.net" / "ran-here"
    assert ran_before(marker) is False and marker.exists()  # the node's first start
    assert ran_before(marker) is True  # every later one


def test_boot_time_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000123\nprocesses 5\n")
    assert boot_time(str(tmp_path)) == 1700000123.0
    assert 0 < boot_time() <= os.stat("/proc/self").st_mtime + 1
