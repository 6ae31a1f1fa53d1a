"""The journal folded into checkpoint.json while the claims keep changing.

A compaction copies the claims under the store's locks, writes and syncs the new file without
them, and takes them again only to rename it into place. These tests hold a compaction inside its
slowest step (the sync of its new file) and change the claims meanwhile, from this instance and
from another one; they kill the process after every write step of a sequence of changes and
compactions (changes made during the compactions included) and check what a restarted driver
finds; and they make the compaction's own steps fail.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.errors import CheckpointWriteError
from driver.checkpoint.files import FileOps
from driver.checkpoint.store import CheckpointStore
from tests.checkpoint.test_journal import FailingOps, _claims, _drop, _put
from tests.plugins.tmpfs import TmpfsFactory, fill

KILLED = 137


def _is_temporary_file(fd: int) -> bool:
    """Whether ``fd`` is a state file's temporary file (a compaction's new snapshot, before its rename)."""
    return os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp")


class GatedOps(FileOps):
    """Real file operations; the first fsync of a temporary file (the compaction's new snapshot)
    waits until :attr:`release` is set, after setting :attr:`entered`."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self._armed = True

        def fsync(fd: int) -> None:
            if self._armed and _is_temporary_file(fd):
                self._armed = False
                self.entered.set()
                self.release.wait(60)
            os.fsync(fd)

        super().__init__(fsync=fsync)


class Background:
    """``fn`` run in a thread; :meth:`result` waits for it and returns its value or raises its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._out: list[Any] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._out.append(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def done_within(self, seconds: float) -> bool:
        self._thread.join(seconds)
        return not self._thread.is_alive()

    def result(self, seconds: float = 60) -> Any:
        assert self.done_within(seconds), "still running"
        if self._error:
            raise self._error[0]
        return self._out[0]


def _while_compacting(gate: GatedOps, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` while the compaction waits in its file's sync; it must not wait for the compaction."""
    call = Background(fn)
    if not call.done_within(5):
        gate.release.set()
        call.result()
        pytest.fail("the change waited for the compaction's sync")
    return call.result()


def _snapshot(directory: Path) -> list[str]:
    """The claims of checkpoint.json alone (what a driver reading only that file finds)."""
    return sorted(json.loads((directory / "checkpoint.json").read_bytes())["claims"])


def test_changes_are_saved_while_a_compaction_syncs_its_file(tmp_path: Path) -> None:
    """A prepare (and another instance's unprepare) during the compaction's slowest step is saved at
    once; the compaction then installs the claims it copied, and the journal keeps the records
    appended meanwhile (re-read on the new snapshot by a restarted driver)."""
    gate = GatedOps()
    store = CheckpointStore(tmp_path, ops=gate, journal=True)
    _put(store, "u1", "u2")
    compaction = Background(store.compact)
    assert gate.entered.wait(10)
    _while_compacting(gate, lambda: _put(store, "u3"))
    assert _while_compacting(gate, lambda: store.read(lambda s: sorted(s.claims))) == ["u1", "u2", "u3"]
    other = _while_compacting(gate, lambda: CheckpointStore(tmp_path, journal=True))  # a rolling update's
    _while_compacting(gate, lambda: _drop(other, "u1"))
    assert _claims(tmp_path) == ["u2", "u3"]  # durable before the compaction is done
    gate.release.set()
    assert compaction.result() is True
    assert _snapshot(tmp_path) == ["u1", "u2"]  # what it copied
    assert _claims(tmp_path) == ["u2", "u3"]  # with the records appended meanwhile
    assert store.read(lambda s: sorted(s.claims)) == other.read(lambda s: sorted(s.claims)) == ["u2", "u3"]
    assert store.journal_size > 0  # those records are not in the snapshot yet
    assert store.compact() and store.journal_size == 0
    assert (tmp_path / "checkpoint.journal").stat().st_size == 0  # quiet: every record folded, cut
    assert _snapshot(tmp_path) == _claims(tmp_path) == ["u2", "u3"]
    _put(other, "u4")  # the journal goes on from the new snapshot
    assert _claims(tmp_path) == store.read(lambda s: sorted(s.claims)) == ["u2", "u3", "u4"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_snapshot_written_during_a_compaction_is_kept(tmp_path: Path) -> None:
    """Another instance writes the whole file (it does not journal) while the compaction syncs its
    copy: that file holds everything the copy would, and more; the copy is thrown away."""
    gate = GatedOps()
    store = CheckpointStore(tmp_path, ops=gate, journal=True)
    _put(store, "u1", "u2")
    compaction = Background(store.compact)
    assert gate.entered.wait(10)
    standby = _while_compacting(gate, lambda: CheckpointStore(tmp_path, journal=False))
    _while_compacting(gate, lambda: _drop(standby, "u1"))
    gate.release.set()
    assert compaction.result() is False
    assert not list(tmp_path.glob("*.tmp"))
    assert _snapshot(tmp_path) == _claims(tmp_path) == ["u2"]
    assert store.read(lambda s: sorted(s.claims)) == ["u2"] and store.journal_size == 0
    _put(store, "u3")
    assert _claims(tmp_path) == standby.read(lambda s: sorted(s.claims)) == ["u2", "u3"]


def test_a_failed_directory_sync_keeps_the_journal_until_a_write_works(tmp_path: Path) -> None:
    """The compaction's rename happened but its directory sync failed: the old or the new snapshot
    may be the one a power loss leaves, so the journal keeps the records both need."""
    ops = FailingOps("fsync", errno.EIO, nth=2)  # 1: the new file, 2: the directory after the rename
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    _put(store, "u1")
    _put(store, "u2")
    journal = (tmp_path / "checkpoint.journal").read_bytes()
    ops.armed = True
    with pytest.raises(CheckpointWriteError, match="checkpoint.json") as failed:
        store.compact()
    assert failed.value.replaced and _snapshot(tmp_path) == ["u1", "u2"]
    assert (tmp_path / "checkpoint.journal").read_bytes() == journal  # nothing cut
    (tmp_path / "checkpoint.json").unlink()  # as if the rename were lost: the journal alone holds them
    assert _claims(tmp_path) == ["u1", "u2"]
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    ops.armed = False
    _put(store, "u3")
    assert store.compact()
    ops.armed = True
    _put(store, "u4")
    with pytest.raises(CheckpointWriteError):
        store.compact()  # the new file's sync fails now: nothing renamed
    _put(store, "u5")  # appends work while the snapshot's syncs fail
    assert [p.name for p in store.write_errors] == ["checkpoint.json"]
    assert _claims(tmp_path) == ["u1", "u2", "u3", "u4", "u5"]
    ops.armed = False
    assert store.retry_write() and not store.write_errors
    assert _snapshot(tmp_path) == _claims(tmp_path) == ["u1", "u2", "u3", "u4", "u5"]


def test_a_full_disk_fails_the_compaction_and_keeps_the_journal(tmpfs_factory: TmpfsFactory, tmp_path: Path) -> None:
    state = tmpfs_factory.mount("state", "256k")
    store = CheckpointStore(state, tmp_path / "run", journal=True)
    _put(store, *(f"u{i}" for i in range(8)))
    filler = fill(state, leave=1024)  # the new file (~8 KB) does not fit
    with pytest.raises(CheckpointWriteError) as failed:
        store.compact()
    assert failed.value.errno == errno.ENOSPC and str(state / "checkpoint.json") in str(failed.value)
    assert not failed.value.replaced and not list(state.glob("*.tmp"))  # its partial file is gone
    assert store.journal_size and [p.name for p in store.write_errors] == ["checkpoint.json"]
    assert _claims(state) == [f"u{i}" for i in range(8)]
    filler.unlink()
    assert store.compact() and not store.write_errors and not store.journal_size
    assert _snapshot(state) == _claims(state) == [f"u{i}" for i in range(8)]


def test_a_killed_compactions_file_is_removed_at_start_unless_another_is_compacting(tmp_path: Path) -> None:
    _put(CheckpointStore(tmp_path, journal=True), "u1")
    leftover = tmp_path / CheckpointStore.FOLD_FILENAME
    leftover.write_bytes(b'{"claims":{"u1":')  # killed half-way through its write
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another instance's compaction: the file is its new snapshot
        assert CheckpointStore(tmp_path).read(lambda s: sorted(s.claims)) == ["u1"]
        assert leftover.exists()
    finally:
        os.close(fd)
    assert CheckpointStore(tmp_path).read(lambda s: sorted(s.claims)) == ["u1"]
    assert not leftover.exists()


# -- killed after every write step --------------------------------------------------------------

CHANGES = [("+", "u1"), ("+", "u2"), ("-", "u1"), ("+", "u3"), ("-", "u2"), ("+", "u4"), ("+", "u5"), ("-", "u3")]
"""The claims prepared (+) and unprepared (-), in the order :func:`_changes_and_compactions` makes them."""


class KillingOps(FileOps):
    """Real file operations that end the process (``os._exit``: nothing cleaned up, like kill -9)
    right after the ``kill_at``-th write step; when a compaction syncs its new file, they first
    run :attr:`during_compaction` in another thread and wait for it (its steps count too)."""

    STEPS = ("write", "fsync", "replace", "pwrite", "fdatasync", "ftruncate")

    def __init__(self, kill_at: int | None) -> None:
        self.steps = 0
        self.during_compaction: Callable[[], None] = lambda: None

        def step(name: str) -> Callable[..., Any]:
            real = getattr(os, name)

            def call(*args: Any) -> Any:
                if name == "fsync" and _is_temporary_file(args[0]):
                    Background(self.during_compaction).result()
                out = real(*args)
                self.steps += 1
                if self.steps == kill_at:
                    os._exit(KILLED)
                return out

            return call

        super().__init__(**{name: step(name) for name in self.STEPS})


def _changes_and_compactions(directory: Path, ops: KillingOps, told: Callable[[str], None]) -> None:
    """:data:`CHANGES`, each told (``told``) once saved, with three compactions: the first two while
    changes are made (they continue the journal: the second folds what the first left), the last
    quiet (it cuts the journal, which the last changes then start again)."""
    store = CheckpointStore(directory, ops=ops, journal=True)
    changes = iter(CHANGES)

    def change() -> None:
        verb, uid = next(changes)
        (_put if verb == "+" else _drop)(store, uid)
        told(verb + uid)

    change(), change(), change()
    ops.during_compaction = lambda: (change(), change())
    assert store.compact()
    ops.during_compaction = change
    assert store.compact()
    ops.during_compaction = lambda: None
    assert store.compact() and not store.journal_size
    change(), change()


def _run_killed(directory: Path, kill_at: int | None) -> tuple[int, list[str]]:
    """:func:`_changes_and_compactions` in a forked child killed after step ``kill_at``: its exit code,
    and what it was told saved (the last line: how many steps it made, when it was not killed)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            ops = KillingOps(kill_at)
            _changes_and_compactions(directory, ops, lambda line: os.write(write_fd, f"{line}\n".encode()))
            os.write(write_fd, f"steps {ops.steps}\n".encode())
        except BaseException as exc:  # noqa: BLE001 - the parent sees exit code 1
            os.write(2, f"child failed: {type(exc).__name__}: {exc}\n".encode())
            code = 1
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        told = pipe.read().splitlines()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), told


def _after(changes: list[tuple[str, str]]) -> set[str]:
    held: set[str] = set()
    for verb, uid in changes:
        held = held | {uid} if verb == "+" else held - {uid}
    return held


def test_killed_after_any_step_of_changes_and_compactions_a_restart_finds_what_was_told(tmp_path: Path) -> None:
    """Every claim told prepared is found, every claim told unprepared is not (the change in flight
    at the kill may or may not be), nothing is quarantined nor left behind, and the kubelet's
    retries then bring the node to the end state."""
    code, told = _run_killed(tmp_path / "dry", None)
    assert code == 0 and told[-1].startswith("steps "), told
    steps = int(told[-1].split()[1])
    assert steps >= 25, steps  # the appends, and each compaction's write, syncs, rename and cut
    for k in range(1, steps + 1):
        directory = tmp_path / f"k{k}"
        code, told = _run_killed(directory, k)
        assert code == KILLED, (k, code)
        done = len(told)
        assert [verb + uid for verb, uid in CHANGES[:done]] == told
        restarted = CheckpointStore(directory, journal=True)
        assert not restarted.quarantined and not list(directory.glob("*.tmp")), k
        found = set(restarted.read(lambda s: list(s.claims)))
        allowed = [_after(CHANGES[:done]), _after(CHANGES[: done + 1])]
        assert found in allowed, f"killed after step {k} ({told[-1:]} told last): found {sorted(found)}"
        for verb, uid in CHANGES[done:]:  # the kubelet retries what it was not answered, and goes on
            _put(restarted, uid) if verb == "+" else restarted.update(lambda s, u=uid: s.claims.pop(u, None))
        assert restarted.compact() or not restarted.journal_size
        assert set(CheckpointStore(directory).read(lambda s: list(s.claims))) == _after(CHANGES), k
