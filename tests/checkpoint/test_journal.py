"""The claims journal: one sync per change, torn and stale records, two writers, failures, compaction.

Every store here journals (``journal=True``, what the daemon does while it holds the node lease)
unless a test says otherwise; the state read back always comes from a new store on the same
directory (a restarted driver).
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.errors import CheckpointError, CheckpointWriteError
from driver.checkpoint.files import FileOps
from driver.checkpoint.journal import base_of, parse, record
from driver.checkpoint.schema import SCHEMA_VERSION
from driver.checkpoint.state import PodNetState
from driver.checkpoint.store import CheckpointStore
from tests.checkpoint.test_store import _claim
from tests.plugins.tmpfs import TmpfsFactory, fill


def _put(store: CheckpointStore, *uids: str) -> None:
    def put(s) -> None:
        for uid in uids:
            s.claims[uid] = _claim(uid)

    store.update(put, claims_only=True)


def _drop(store: CheckpointStore, *uids: str) -> None:
    store.update(lambda s: [s.claims.pop(u) for u in uids], claims_only=True)


def _claims(directory: Path) -> list[str]:
    """What a restarted driver finds."""
    store = CheckpointStore(directory)
    assert not store.quarantined
    return store.read(lambda s: sorted(s.claims))


class CountingOps(FileOps):
    """Real file operations, counted by name."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

        def counted(name: str) -> Any:
            real = getattr(os, name)

            def call(*args: Any) -> Any:
                self.calls[name] += 1
                return real(*args)

            return call

        names = ("open", "write", "fsync", "close", "replace", "unlink", "pwrite", "fdatasync", "ftruncate")
        super().__init__(**{n: counted(n) for n in names})


def test_a_change_is_one_data_sync_and_no_rename(tmp_path: Path) -> None:
    ops = CountingOps()
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    _put(store, "u1")  # the journal is created: its directory entry is synced once
    assert ops.calls["fdatasync"] == 1 and ops.calls["fsync"] == 1 and ops.calls["replace"] == 0
    ops.calls.clear()
    _put(store, "u2", "u3")  # a batch of two claims
    _drop(store, "u1")
    assert ops.calls == Counter({"pwrite": 2, "fdatasync": 2})  # one record and one sync per batch
    assert not (tmp_path / "checkpoint.json").exists()  # no snapshot written yet
    assert _claims(tmp_path) == ["u2", "u3"]


def test_compaction_folds_the_journal_into_the_snapshot(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1", "u2")
    _drop(store, "u1")
    assert store.journal_size > 0
    assert store.compact()
    assert store.journal_size == 0 and not store.compact()  # nothing left to fold
    assert sorted(json.loads((tmp_path / "checkpoint.json").read_text())["claims"]) == ["u2"]
    assert (tmp_path / "checkpoint.journal").stat().st_size == 0  # the folded records are cut
    assert _claims(tmp_path) == ["u2"]
    _put(store, "u3")
    raw = (tmp_path / "checkpoint.journal").read_bytes()
    payloads, tail = parse(raw, base_of((tmp_path / "checkpoint.json").read_bytes()))
    assert len(payloads) == 1 and tail is not None and tail.end == len(raw)  # restarted, the rest cut
    assert _claims(tmp_path) == ["u2", "u3"]


def test_records_of_an_older_snapshot_are_never_replayed(tmp_path: Path) -> None:
    """A crash between a compaction's rename and the journal's restart: the journal names the old
    snapshot, the new one holds its records already (replaying a put over a later removal would
    bring a claim back)."""
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1", "u2")
    old_journal = (tmp_path / "checkpoint.journal").read_bytes()
    store.update(lambda s: s.claims.pop("u1"), claims_only=True)
    store.compact()
    (tmp_path / "checkpoint.journal").write_bytes(old_journal)  # the restart of the journal never happened
    assert _claims(tmp_path) == ["u2"]


@pytest.mark.parametrize("cut", [1, 20, 60])
def test_a_torn_last_record_is_dropped_and_the_others_kept(tmp_path: Path, cut: int) -> None:
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1")
    _put(store, "u2")
    journal = tmp_path / "checkpoint.journal"
    journal.write_bytes(journal.read_bytes()[:-cut])  # the second record's write was cut short
    assert _claims(tmp_path) == ["u1"]
    again = CheckpointStore(tmp_path, journal=True)
    _put(again, "u3")  # appended after the last whole record, over the torn one
    assert _claims(tmp_path) == ["u1", "u3"]


def test_a_flipped_byte_in_a_record_ends_the_journal_there(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1")
    first = (tmp_path / "checkpoint.journal").stat().st_size
    _put(store, "u2")
    data = bytearray((tmp_path / "checkpoint.journal").read_bytes())
    data[first + 60] ^= 0x01  # inside the second record's payload: its crc no longer matches
    (tmp_path / "checkpoint.journal").write_bytes(bytes(data))
    assert _claims(tmp_path) == ["u1"]


def test_a_snapshot_written_by_an_instance_that_does_not_journal_wins(tmp_path: Path) -> None:
    """The lease holder journals; the standby of a rolling update writes the whole file (an older
    driver would too). The standby's file holds everything it saw, and the holder's earlier
    records must not be replayed over it."""
    holder = CheckpointStore(tmp_path, journal=True)
    standby = CheckpointStore(tmp_path, journal=False)
    _put(holder, "u1", "u2")
    assert standby.read(lambda s: sorted(s.claims)) == ["u1", "u2"]  # it reads the journal
    _drop(standby, "u1")  # the kubelet unprepares u1 through the standby: a whole new file
    assert sorted(json.loads((tmp_path / "checkpoint.json").read_text())["claims"]) == ["u2"]
    assert holder.read(lambda s: sorted(s.claims)) == ["u2"]
    _put(holder, "u3")  # the journal starts again on the standby's file
    assert standby.read(lambda s: sorted(s.claims)) == ["u2", "u3"]
    assert _claims(tmp_path) == ["u2", "u3"]


def test_two_journaling_instances_see_each_others_records(tmp_path: Path) -> None:
    a, b = CheckpointStore(tmp_path, journal=True), CheckpointStore(tmp_path, journal=True)
    _put(a, "u1")
    assert b.read(lambda s: sorted(s.claims)) == ["u1"]
    _put(b, "u2")
    assert a.read(lambda s: sorted(s.claims)) == ["u1", "u2"]
    _drop(a, "u1")
    assert b.read(lambda s: sorted(s.claims)) == ["u2"]
    b.compact()
    _put(a, "u3")
    assert b.read(lambda s: sorted(s.claims)) == ["u2", "u3"]
    assert not b.refresh()  # nothing changed since its last read: no reload
    assert _claims(tmp_path) == ["u2", "u3"]


def test_pods_stay_in_their_own_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "s", tmp_path / "r", journal=True)
    _put(store, "u1")
    store.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1", netns_path="/x")))
    assert "p1" in json.loads((tmp_path / "r" / "pods.json").read_text())["pods"]
    again = CheckpointStore(tmp_path / "s", tmp_path / "r")
    assert again.read(lambda s: (sorted(s.claims), sorted(s.pods))) == (["u1"], ["p1"])


class FailingOps(FileOps):
    """Real file operations, but ``op`` fails with ``err`` from its ``nth`` call on."""

    def __init__(self, op: str, err: int, nth: int = 1) -> None:
        self.armed = False
        calls = {"n": 0}
        real = getattr(os, op)

        def failing(*args: Any) -> Any:
            if self.armed:
                calls["n"] += 1
                if calls["n"] >= nth:
                    raise OSError(err, os.strerror(err))
            return real(*args)

        super().__init__(**{op: failing})


@pytest.mark.parametrize("op", ["pwrite", "fdatasync"])
def test_a_failed_append_is_reported_rolled_back_and_cut_from_the_file(tmp_path: Path, op: str) -> None:
    ops = FailingOps(op, errno.EIO)
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    _put(store, "u1")
    size = (tmp_path / "checkpoint.journal").stat().st_size
    ops.armed = True
    with pytest.raises(CheckpointWriteError, match=r"checkpoint.journal: Input/output error \(EIO\)"):
        _put(store, "u2")
    assert store.read(lambda s: sorted(s.claims)) == ["u1"]  # memory = disk
    assert (tmp_path / "checkpoint.journal").stat().st_size == size  # the record is gone
    assert store.write_error is not None and store.write_failures == {"checkpoint.journal": 1}
    assert _claims(tmp_path) == ["u1"]
    ops.armed = False
    assert store.retry_write() and store.write_error is None  # folds the journal: the disk takes writes
    _put(store, "u2")
    assert _claims(tmp_path) == ["u1", "u2"]


def test_a_full_disk_fails_the_append_and_keeps_every_record_before_it(
    tmpfs_factory: TmpfsFactory, tmp_path: Path
) -> None:
    state = tmpfs_factory.mount("state", "256k")
    store = CheckpointStore(state, tmp_path / "run", journal=True)
    _put(store, *(f"u{i}" for i in range(4)))
    filler = fill(state, leave=1024)
    with pytest.raises(CheckpointWriteError) as caught:
        _put(store, *(f"big{i}" for i in range(20)))  # ~20 KB: a short write, then ENOSPC
    assert caught.value.errno == errno.ENOSPC and str(state / "checkpoint.journal") in str(caught.value)
    assert store.read(lambda s: sorted(s.claims)) == [f"u{i}" for i in range(4)]
    filler.unlink()
    _put(store, "after")
    assert sorted(CheckpointStore(state, tmp_path / "run").read(lambda s: list(s.claims))) == sorted(
        [*(f"u{i}" for i in range(4)), "after"]
    )


def test_a_journal_that_does_not_decode_is_moved_aside(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1")
    store.compact()
    base = base_of((tmp_path / "checkpoint.json").read_bytes())
    (tmp_path / "checkpoint.journal").write_bytes(record(7, 0, base, b'{"put": not json'))
    again = CheckpointStore(tmp_path)
    assert [q.path.name for q in again.quarantined] == ["checkpoint.journal"] and again.claims_quarantined
    assert again.read(lambda s: sorted(s.claims)) == ["u1"]  # the snapshot's
    assert list(tmp_path.glob("checkpoint.journal.corrupt-*"))


def test_a_record_of_a_newer_driver_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.journal").write_bytes(
        record(7, 0, base_of(None), json.dumps({"version": SCHEMA_VERSION + 1, "put": {}, "delete": []}).encode())
    )
    with pytest.raises(CheckpointError, match="newer driver"):
        CheckpointStore(tmp_path)


def test_a_journal_that_is_a_symlink_is_never_read_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(record(7, 0, base_of(None), b"{}"))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "checkpoint.journal").symlink_to(elsewhere)
    store = CheckpointStore(tmp_path / "state", journal=True)
    assert [q.path.name for q in store.quarantined] == ["checkpoint.journal"]
    _put(store, "u1")
    assert elsewhere.read_bytes() == record(7, 0, base_of(None), b"{}")  # never written through
    assert _claims(tmp_path / "state") == ["u1"]


def test_a_store_that_does_not_journal_reads_the_journal_and_writes_whole_files(tmp_path: Path) -> None:
    _put(CheckpointStore(tmp_path, journal=True), "u1")
    plain = CheckpointStore(tmp_path)
    assert plain.read(lambda s: sorted(s.claims)) == ["u1"]
    _put(plain, "u2")
    assert sorted(json.loads((tmp_path / "checkpoint.json").read_text())["claims"]) == ["u1", "u2"]
    (tmp_path / "checkpoint.journal").unlink()
    assert _claims(tmp_path) == ["u1", "u2"]  # the file alone is whole
