"""Where the prepared claims live: tmpfs, or the older drivers' disk directory while it describes
this boot; and how a start tells a node where a driver ran from a new one."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from driver.checkpoint.location import (
    DRIVER_STARTED_FILES,
    boot_time,
    choose_state_dir,
    ran_before,
    resolve,
)
from driver.checkpoint.state import PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.node_lease import NodeLease

BOOTED = 1_700_000_000.0


def _legacy(tmp_path: Path, mtime: float, names: tuple[str, ...] = ("checkpoint.json",)) -> Path:
    legacy = tmp_path / "var-lib-dranet"
    legacy.mkdir()
    for name in names:
        (legacy / name).write_text('{"version": 2, "claims": {}}')
        os.utime(legacy / name, (mtime, mtime))
    return legacy


def _runtime(tmp_path: Path, started: float | None = BOOTED + 30) -> str:
    """The runtime dir (tmpfs): a driver's node lease files written at ``started`` (None: none yet)."""
    run = tmp_path / "run-dranet"
    run.mkdir(exist_ok=True)
    if started is not None:
        for name in DRIVER_STARTED_FILES:
            (run / name).write_text("1")
            os.utime(run / name, (started, started))
    return str(run)


def _tmpfs_claims(tmp_path: Path) -> Path:
    """The tmpfs claims dir as a driver of this version leaves it: a store opened there, a claim saved."""
    claims = tmp_path / "run-claims"
    store = CheckpointStore(claims, tmp_path / "run-dranet")
    store.update(lambda s: s.claims.__setitem__("uid-live", PreparedClaim("uid-live", "ns", "live")))
    store.close()
    return claims


def test_without_legacy_files_the_claims_go_to_the_state_dir(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for legacy in ("", str(tmp_path / "missing"), str(tmp_path / "empty")):
        where = choose_state_dir(str(tmp_path / "run"), legacy, BOOTED, _runtime(tmp_path))
        assert where.directory == str(tmp_path / "run") and not where.legacy_in_use and not where.retired


def test_legacy_files_written_during_this_boot_stay_in_use(tmp_path: Path) -> None:
    # An update in place: the older instance of the rolling update started this boot and still writes them.
    legacy = _legacy(tmp_path, BOOTED + 60, ("checkpoint.json", "checkpoint.journal"))
    where = choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED, _runtime(tmp_path))
    assert where.directory == str(legacy) and where.legacy_in_use
    assert sorted(p.name for p in legacy.iterdir()) == ["checkpoint.journal", "checkpoint.json"]
    # The new driver restarts in the same boot: it writes the legacy dir, the tmpfs stays empty.
    assert choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED, _runtime(tmp_path)).legacy_in_use


def test_a_journal_appended_this_boot_keeps_an_older_snapshot_in_use(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600)
    (legacy / "checkpoint.journal").write_bytes(b"")
    os.utime(legacy / "checkpoint.journal", (BOOTED + 1, BOOTED + 1))
    assert choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED, _runtime(tmp_path)).legacy_in_use


def test_legacy_files_from_before_the_boot_are_retired_and_kept(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600, ("checkpoint.json", "checkpoint.journal"))
    where = choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED, _runtime(tmp_path))
    assert where.directory == str(tmp_path / "run") and not where.legacy_in_use
    names = sorted(p.name for p in legacy.iterdir())
    assert len(names) == 2 and all(".before-boot-" in n for n in names), names
    assert sorted(Path(r).name.split(".before-boot-")[0] for r in where.retired) == [
        "checkpoint.journal",
        "checkpoint.json",
    ]
    # The next start finds nothing left to decide.
    assert not choose_state_dir(str(tmp_path / "run"), str(legacy), BOOTED, _runtime(tmp_path)).retired


def test_the_same_directory_is_never_legacy(tmp_path: Path) -> None:
    legacy = _legacy(tmp_path, BOOTED - 3600)
    where = choose_state_dir(str(legacy), str(legacy) + "/", BOOTED, _runtime(tmp_path))
    assert where.directory == str(legacy) and not where.retired and (legacy / "checkpoint.json").exists()


def test_a_tmpfs_dir_with_claims_of_its_own_always_wins(tmp_path: Path) -> None:
    """Legacy files dated after the boot beside a tmpfs dir a driver of this version wrote: stale
    copies (whatever their mtime says), retired; the tmpfs claims are the ones loaded."""
    claims = _tmpfs_claims(tmp_path)
    legacy = _legacy(tmp_path, BOOTED + 3600, ("checkpoint.json", "checkpoint.journal"))
    where = choose_state_dir(str(claims), str(legacy), BOOTED, _runtime(tmp_path))
    assert where.directory == str(claims) and not where.legacy_in_use and len(where.retired) == 2
    assert "claims of its own" in where.why
    assert not any((legacy / n).exists() for n in ("checkpoint.json", "checkpoint.journal"))
    assert set(CheckpointStore(claims).read(lambda s: list(s.claims))) == {"uid-live"}


def test_touch_in_the_legacy_dir_never_brings_stale_claims_back(tmp_path: Path) -> None:
    """The driver runs on tmpfs; someone runs `touch /var/lib/dranet/checkpoint.json` (an old file
    left there); the next start keeps the tmpfs claims. Real files, real `touch`, real boot time."""
    claims = _tmpfs_claims(tmp_path)
    legacy = _legacy(tmp_path, boot_time() - 3600)
    subprocess.run(["touch", str(legacy / "checkpoint.json")], check=True)
    assert (legacy / "checkpoint.json").stat().st_mtime >= boot_time()
    where = choose_state_dir(str(claims), str(legacy), boot_time(), _runtime(tmp_path, started=time.time()))
    assert where.directory == str(claims) and not where.legacy_in_use
    assert [Path(r).name.split(".before-boot-")[0] for r in where.retired] == ["checkpoint.json"]


def test_cp_without_p_into_the_legacy_dir_never_brings_stale_claims_back(tmp_path: Path) -> None:
    """A backup restored with `cp` (no -p: the copy is dated now) while the driver runs on tmpfs."""
    claims = _tmpfs_claims(tmp_path)
    backup = tmp_path / "backup.json"
    backup.write_text('{"version": 2, "claims": {"uid-stale": {}}}')
    os.utime(backup, (boot_time() - 86400, boot_time() - 86400))
    legacy = tmp_path / "var-lib-dranet"
    legacy.mkdir()
    subprocess.run(["cp", str(backup), str(legacy / "checkpoint.json")], check=True)
    assert (legacy / "checkpoint.json").stat().st_mtime >= boot_time()
    where = choose_state_dir(str(claims), str(legacy), boot_time(), _runtime(tmp_path, started=time.time()))
    assert where.directory == str(claims) and not where.legacy_in_use and len(where.retired) == 1


def test_touch_or_cp_after_a_reboot_before_any_driver_start_is_retired(tmp_path: Path) -> None:
    """After a reboot the tmpfs is empty: legacy files dated since the boot are not an older driver's
    writes when no driver has started during this boot (no lease of it in the runtime dir)."""
    legacy = _legacy(tmp_path, BOOTED + 5)  # a stale snapshot touched after the boot
    (legacy / "checkpoint.journal").write_text("")  # and a journal copied in without -p
    os.utime(legacy / "checkpoint.journal", (BOOTED + 6, BOOTED + 6))
    where = choose_state_dir(str(tmp_path / "claims"), str(legacy), BOOTED, _runtime(tmp_path, started=None))
    assert not where.legacy_in_use and len(where.retired) == 2 and "no driver started" in where.why


def test_a_lease_from_before_the_boot_is_no_driver_of_this_boot(tmp_path: Path) -> None:
    """A runtime dir kept on disk: its lease files dated before the boot tell of no start since."""
    legacy = _legacy(tmp_path, BOOTED + 5)
    where = choose_state_dir(str(tmp_path / "claims"), str(legacy), BOOTED, _runtime(tmp_path, started=BOOTED - 60))
    assert not where.legacy_in_use and len(where.retired) == 1


def test_a_driver_start_leaves_what_the_rule_reads_in_the_runtime_dir(tmp_path: Path) -> None:
    """The names the rule looks for are the node lease's (which the checkpoint may not import)."""
    run = tmp_path / "run"
    NodeLease(run, "instance-a").close()
    assert all((run / name).exists() for name in DRIVER_STARTED_FILES)
    assert all((run / name).stat().st_mtime >= time.time() - 60 for name in DRIVER_STARTED_FILES)


def test_resolve_reads_the_runtime_dir_it_is_given(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(f"btime {int(BOOTED)}\n")
    legacy = _legacy(tmp_path, BOOTED + 60)
    claims = str(tmp_path / "claims")
    assert resolve(claims, str(legacy), str(proc), runtime_dir=_runtime(tmp_path)) == str(legacy)
    assert resolve(claims, str(legacy), str(proc), runtime_dir=str(tmp_path / "no-driver-ran")) == claims


def test_a_node_where_a_driver_ran_is_told_from_a_new_one(tmp_path: Path) -> None:
    marker = tmp_path / "plugins" / "dra.net" / "ran-here"
    assert ran_before(marker) is False and marker.exists()  # the node's first start
    assert ran_before(marker) is True  # every later one


def test_boot_time_is_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000123\nprocesses 5\n")
    assert boot_time(str(tmp_path)) == 1700000123.0
    assert 0 < boot_time() <= os.stat("/proc/self").st_mtime + 1
