"""The claims journal: one sync per change, torn and stale records, two writers, failures, compaction.

Every store here journals (``journal=True``, what the daemon does while it holds the node lease)
unless a test says otherwise; the state read back always comes from a new store on the same
directory (a restarted driver).
"""

from __future__ import annotations

import errno
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.errors import CheckpointError, CheckpointWriteError
from driver.checkpoint.files import FileOps
from driver.checkpoint.journal import Parsed, Position, base_of, parse, record, saved_claims
from driver.checkpoint.schema import SCHEMA_VERSION, encode
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


def _parsed(directory: Path) -> Parsed:
    """The journal's records that apply to the snapshot, read as a restarted driver does."""
    snapshot = (directory / "checkpoint.json").read_bytes()
    at = Position.from_json(json.loads(snapshot).get("journal"))
    return parse((directory / "checkpoint.journal").read_bytes(), base_of(snapshot), at)


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


def _open_for_writing(directory: Path) -> list[str]:
    """Files under ``directory`` this process holds open for writing."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError):
            continue
        if target.startswith(str(directory)) and flags & (os.O_WRONLY | os.O_RDWR):
            out.append(target)
    return out


def test_a_change_is_one_data_sync_and_no_rename(tmp_path: Path) -> None:
    ops = CountingOps()
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    _put(store, "u1")  # the journal is created: its directory entry is synced once
    assert ops.calls["fdatasync"] == 1 and ops.calls["fsync"] == 1 and ops.calls["replace"] == 0
    ops.calls.clear()
    _put(store, "u2", "u3")  # a batch of two claims
    _drop(store, "u1")
    # One record and one sync per batch; the journal is opened for each write and closed after it.
    assert ops.calls == Counter({"open": 2, "pwrite": 2, "fdatasync": 2, "close": 2})
    assert not _open_for_writing(tmp_path)  # a read-only remount of the state disk is never EBUSY
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
    parsed = _parsed(tmp_path)
    assert len(parsed.payloads) == 1 and parsed.tail is not None and parsed.tail.end == len(raw)  # restarted
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


def test_a_flipped_byte_in_the_last_record_drops_it_and_asks_for_a_rebuild(tmp_path: Path) -> None:
    """A whole last record that fails its checksum: torn by a crash (never acknowledged), or damaged
    after its sync (acknowledged): the store cannot tell, keeps the others and says the claims must
    be rebuilt from the API server."""
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1")
    first = (tmp_path / "checkpoint.journal").stat().st_size
    _put(store, "u2")
    data = bytearray((tmp_path / "checkpoint.journal").read_bytes())
    data[first + 60] ^= 0x01  # inside the second record's payload: its crc no longer matches
    (tmp_path / "checkpoint.journal").write_bytes(bytes(data))
    restarted = CheckpointStore(tmp_path)
    assert restarted.read(lambda s: sorted(s.claims)) == ["u1"]
    assert restarted.claims_quarantined and "fails its checksum" in (restarted.claims_suspect or "")


FIELDS = {"magic": 0, "length": 5, "crc": 9, "epoch": 13, "sequence": 21, "base": 28, "payload": 60}
"""A byte of each part of a record (offsets into it: the header is magic, length, crc, epoch,
sequence, base; the payload follows)."""


def _record_offsets(data: bytes) -> list[int]:
    offsets, at = [], 0
    while at < len(data):
        offsets.append(at)
        at += 40 + int.from_bytes(data[at + 4 : at + 8], "little")
    return offsets


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("position", range(4))
def test_damage_to_any_byte_of_any_record_loses_no_other_claim_and_nothing_silently(
    tmp_path: Path, position: int, field: str
) -> None:
    """One byte of one acknowledged record damaged, anywhere: every other claim is still there after
    a restart, and durably (a snapshot of them is written at once); the damaged record's claim is
    either still read (a damaged magic or length: its checksum covers the rest) or the store says
    the claims must be rebuilt from the API server. Damage followed by valid records is not a tear:
    the journal is moved aside for a human, as a corrupt checkpoint.json is."""
    store = CheckpointStore(tmp_path, journal=True)
    for i in range(4):
        _put(store, f"u{i}")
    journal = tmp_path / "checkpoint.journal"
    data = bytearray(journal.read_bytes())
    data[_record_offsets(bytes(data))[position] + FIELDS[field]] ^= 0x40
    journal.write_bytes(bytes(data))
    restarted = CheckpointStore(tmp_path, journal=True)
    held = set(restarted.read(lambda s: list(s.claims)))
    others = {f"u{i}" for i in range(4) if i != position}
    assert others <= held, f"lost {sorted(others - held)}"
    if f"u{position}" not in held:
        assert restarted.claims_quarantined, "a claim dropped without a word"
    if position < 3 and field not in ("magic",):
        assert [q.path.name for q in restarted.quarantined] == ["checkpoint.journal"]
        assert list(tmp_path.glob("checkpoint.journal.corrupt-*")), "kept aside for a human"
    assert set(CheckpointStore(tmp_path).read(lambda s: list(s.claims))) == held, "not durable"
    _put(restarted, "u9")  # and it goes on journaling
    assert set(CheckpointStore(tmp_path).read(lambda s: list(s.claims))) == held | {"u9"}


JUNK = bytes(range(0xA0, 0xA0 + 37))
"""Bytes inserted into a journal (no record's magic in them)."""


def _run_of(count: int) -> tuple[list[bytes], bytes, list[range]]:
    """A run of ``count`` records on no snapshot, payloads of different lengths: the payloads, the
    journal's bytes and each record's extent in them."""
    payloads = [
        json.dumps({"version": SCHEMA_VERSION, "put": {f"u{i}": {"pad": "x" * (i * 7 % 23)}}, "delete": []}).encode()
        for i in range(count)
    ]
    data, extents = b"", []
    for seq, payload in enumerate(payloads):
        one = record(0x5EED, seq, base_of(None), payload)
        extents.append(range(len(data), len(data) + len(one)))
        data += one
    return payloads, data, extents


def _kept(payloads: list[bytes], data: bytes) -> list[int]:
    """The records of ``payloads`` a reader of ``data`` applies: each once, in order, no other."""
    got = parse(data, base_of(None), None).payloads
    kept = [i for i, payload in enumerate(payloads) if payload in got]
    assert got == [payloads[i] for i in kept], "a payload read twice, out of order, or not one written"
    return kept


@pytest.mark.parametrize("change", ["inserted", "cut out"])
@pytest.mark.parametrize("field", ["magic", "payload"])
@pytest.mark.parametrize("position", range(4))
def test_bytes_inserted_or_cut_out_anywhere_lose_no_claim_of_an_intact_record(
    tmp_path: Path, position: int, field: str, change: str
) -> None:
    """37 bytes inserted or cut out at the start of a record or inside its payload: every claim whose
    record is intact is still there after a restart, durably; the damage is said (the journal moved
    aside) wherever a valid record follows it."""
    store = CheckpointStore(tmp_path, journal=True)
    for i in range(4):
        _put(store, f"u{i}")
    journal = tmp_path / "checkpoint.journal"
    data = journal.read_bytes()
    at = _record_offsets(data)[position] + FIELDS[field]
    journal.write_bytes(data[:at] + JUNK + data[at:] if change == "inserted" else data[:at] + data[at + len(JUNK) :])
    restarted = CheckpointStore(tmp_path, journal=True)
    held = set(restarted.read(lambda s: list(s.claims)))
    intact = {f"u{i}" for i in range(4) if i != position or (change, field) == ("inserted", "magic")}
    assert intact <= held, f"lost {sorted(intact - held)}"
    if position < 3 or intact == {f"u{i}" for i in range(4)}:
        assert [q.path.name for q in restarted.quarantined] == ["checkpoint.journal"]
    assert set(CheckpointStore(tmp_path).read(lambda s: list(s.claims))) == held, "not durable"


def test_bytes_inserted_before_a_record_lose_none_of_the_records_after_them() -> None:
    """The record after the inserted bytes is the one the run expects next: found again, not skipped."""
    payloads, data, extents = _run_of(8)
    at = extents[4].start
    damaged = data[:at] + JUNK + data[at:]
    assert _kept(payloads, damaged) == list(range(8))
    assert f"bytes {at}-{at + len(JUNK)} (from record 4)" in (parse(damaged, base_of(None), None).damage or "")


@pytest.mark.parametrize("byte", range(4, 8))
@pytest.mark.parametrize("position", [0, 3, 6])
def test_a_middle_record_whose_length_alone_is_smashed_is_read_by_its_checksum(position: int, byte: int) -> None:
    """Its checksum holds over the payload ending where the next record begins: it is read, and said."""
    payloads, data, extents = _run_of(8)
    damaged = bytearray(data)
    damaged[extents[position].start + byte] ^= 0x40
    assert _kept(payloads, bytes(damaged)) == list(range(8))
    parsed = parse(bytes(damaged), base_of(None), None)
    assert f"length field of the record at byte {extents[position].start}" in (parsed.damage or "")
    assert parsed.tail is not None and parsed.tail.end == len(data)


def test_a_record_cut_out_whole_loses_none_of_the_records_after_it() -> None:
    """The run's sequence skips ahead between two valid records of its epoch (random per run): the
    records in between are gone, not the run's end."""
    payloads, data, extents = _run_of(8)
    cut = data[: extents[4].start] + data[extents[4].stop :]
    assert _kept(payloads, cut) == [0, 1, 2, 3, 5, 6, 7]
    parsed = parse(cut, base_of(None), None)
    assert "records 4-4 (missing" in (parsed.damage or "") and parsed.tail is not None and parsed.tail.seq == 8


def _damages(data: bytes, extents: list[range]) -> Iterator[tuple[str, bytes, set[int], set[int]]]:
    """(kind, damaged bytes, intact records, mendable records) for a flip of every byte, 1 and 37
    bytes inserted and cut out at every offset, every middle record cut out whole and a truncation
    at every length. Intact: its own bytes (header, payload) untouched; mendable: only its magic or
    length flipped (the checksum covers neither). A first record cut out whole is not here: the next
    then starts the file, and a run not starting at 0 is not one started on the snapshot
    (``test_files_of_a_driver_from_before_journal_positions_are_read``)."""

    def untouched(begin: int, end: int) -> set[int]:
        return {i for i, e in enumerate(extents) if e.stop <= begin or e.start >= end}

    for at in range(len(data)):
        flipped = bytearray(data)
        flipped[at] ^= 0x40
        yield "flips", bytes(flipped), untouched(at, at + 1), {i for i, e in enumerate(extents) if at in e[:8]}
    for size in (1, len(JUNK)):
        for at in range(len(data) + 1):
            junk = random.Random(at * 64 + size).randbytes(size)
            yield "insertions", data[:at] + junk + data[at:], untouched(at, at), set()
            if at + size <= len(data):
                yield "deletions", data[:at] + data[at + size :], untouched(at, at + size), set()
    for e in extents[1:]:
        yield "deletions", data[: e.start] + data[e.stop :], untouched(e.start, e.stop), set()
    for length in range(len(data)):
        yield "truncations", data[:length], untouched(length, len(data) + 1), set()


def test_every_intact_record_is_kept_under_insertions_deletions_flips_and_truncations_anywhere(capsys) -> None:
    """Every kind of damage at every byte of a run of 8 records: each intact record is read, and so
    is one whose magic or length alone is damaged; a record lost before a kept one is said in
    :attr:`Parsed.damage`, never dropped silently."""
    payloads, data, extents = _run_of(8)
    counts: dict[str, Counter[str]] = {}
    for kind, damaged, intact, mendable in _damages(data, extents):
        kept = set(_kept(payloads, damaged))
        count = counts.setdefault(kind, Counter())
        count.update(cases=1, intact=len(intact), kept=len(intact & kept), mendable=len(mendable))
        count.update(mended=len(mendable & kept))
        assert intact | mendable <= kept, f"{kind}: lost {sorted((intact | mendable) - kept)}"
        if kept and any(i not in kept for i in range(max(kept))):
            assert parse(damaged, base_of(None), None).damage, f"{kind}: a record lost without a word"
    with capsys.disabled():
        print("\njournal resync: " + ", ".join(f"{k} {dict(+c)}" for k, c in counts.items()))
    assert set(counts) == {"flips", "insertions", "deletions", "truncations"}
    assert all(c["kept"] == c["intact"] > 0 and c["mended"] == c["mendable"] for c in counts.values()), counts
    assert counts["flips"]["mendable"] == 8 * 8  # the magic and length bytes of every record


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


def test_a_whole_file_with_the_same_claims_as_an_older_snapshot_is_not_taken_for_it(tmp_path: Path) -> None:
    """The standby unprepares the claim the holder journaled on a snapshot, which gives that snapshot's
    claims again. The holder's record must not be replayed on the standby's file: the unprepare
    was acknowledged. (Each snapshot names the journal position it was written at, so two
    snapshots of the same claims differ when the journal moved between them.)"""
    holder, standby = CheckpointStore(tmp_path, journal=True), CheckpointStore(tmp_path, journal=False)
    _put(holder, "u2")
    holder.compact()  # a snapshot of {u2}
    _put(holder, "u1")  # journaled on it
    _drop(standby, "u1")  # a whole file of {u2}, again
    assert _claims(tmp_path) == ["u2"]
    assert holder.read(lambda s: sorted(s.claims)) == ["u2"]


def test_files_of_a_driver_from_before_journal_positions_are_read(tmp_path: Path) -> None:
    """Its snapshot names no position: the records that apply are those of the run started on it
    (naming its hash, from sequence 0). The first compaction writes a position."""
    snapshot = encode({"claims": {"u1": _claim("u1").to_dict()}})
    (tmp_path / "checkpoint.json").write_bytes(snapshot)
    put = {"version": 2, "put": {"u2": _claim("u2").to_dict()}, "delete": ["u1"]}
    (tmp_path / "checkpoint.journal").write_bytes(record(7, 0, base_of(snapshot), json.dumps(put).encode()))
    store = CheckpointStore(tmp_path, journal=True)
    assert not store.quarantined and store.read(lambda s: sorted(s.claims)) == ["u2"]
    _put(store, "u3")  # continues that run
    assert _claims(tmp_path) == ["u2", "u3"]
    assert store.compact()
    assert json.loads((tmp_path / "checkpoint.json").read_bytes())["journal"] == {"epoch": 7, "seq": 2}
    assert _claims(tmp_path) == ["u2", "u3"]
    # A run that does not start at sequence 0 is not one started on that snapshot.
    (tmp_path / "checkpoint.json").write_bytes(snapshot)
    (tmp_path / "checkpoint.journal").write_bytes(record(7, 1, base_of(snapshot), json.dumps(put).encode()))
    assert _claims(tmp_path) == ["u1"]


def test_a_driver_from_before_journal_positions_reads_the_records_after_a_quiet_compaction(tmp_path: Path) -> None:
    """It reads only runs started on its snapshot (from sequence 0), as a rolling update's other
    instance may: once the journal is cut, this driver's next records start such a run."""
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1", "u2")
    assert store.compact()  # quiet: every record folded, the journal cut
    _put(store, "u3")
    _drop(store, "u1")
    snapshot = (tmp_path / "checkpoint.json").read_bytes()
    older = parse((tmp_path / "checkpoint.journal").read_bytes(), base_of(snapshot), None)  # its reading
    assert [sorted(json.loads(p)["put"]) + json.loads(p)["delete"] for p in older.payloads] == [["u3"], ["u1"]]


@pytest.mark.parametrize("position", [{"epoch": -1, "seq": 0}, {"epoch": 1}, {"epoch": 1, "seq": "2"}, [1, 2]])
def test_a_snapshot_with_a_damaged_journal_position_is_moved_aside(tmp_path: Path, position: Any) -> None:
    """Read as another position, it would replay records the snapshot holds, or skip some it does not."""
    (tmp_path / "checkpoint.json").write_bytes(encode({"claims": {}, "journal": position}))
    store = CheckpointStore(tmp_path)
    assert [q.path.name for q in store.quarantined] == ["checkpoint.json"] and store.claims_quarantined


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


def test_a_failing_compaction_stays_reported_while_appends_work(tmp_path: Path) -> None:
    ops = FailingOps("fsync", errno.EIO)  # the snapshot's syncs fail; the journal's fdatasync works
    store = CheckpointStore(tmp_path, ops=ops, journal=True)
    _put(store, "u1")
    ops.armed = True
    with pytest.raises(CheckpointWriteError, match="checkpoint.json"):
        store.compact()  # the snapshot's fsync fails; the journal still holds u1
    assert store.journal_size and _claims(tmp_path) == ["u1"]
    _put(store, "u2")  # the journal works (fdatasync): its append succeeds, the snapshot still fails
    assert [p.name for p in store.write_errors] == ["checkpoint.json"]
    assert _claims(tmp_path) == ["u1", "u2"]
    ops.armed = False
    assert store.retry_write() and not store.write_errors
    assert not store.journal_size  # the retry wrote the snapshot: the journal is folded in
    assert sorted(json.loads((tmp_path / "checkpoint.json").read_bytes())["claims"]) == ["u1", "u2"]


def test_records_whose_journal_vanished_are_written_whole_before_journaling_again(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, journal=True)
    _put(store, "u1")
    # Moved aside behind the store's back (no refresh sees it: the store's own journal object).
    os.rename(tmp_path / "checkpoint.journal", tmp_path / "aside")
    with pytest.raises(OSError, match="vanished"):
        store._journal.append(store._base, b"{}")
    assert not (tmp_path / "checkpoint.journal").stat().st_size  # no record after a hole
    _put(store, "u2")  # the store writes the snapshot, which holds u1 again
    assert json.loads((tmp_path / "checkpoint.json").read_bytes())["claims"].keys() == {"u1", "u2"}
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
    snapshot = (tmp_path / "checkpoint.json").read_bytes()
    at = Position.from_json(json.loads(snapshot)["journal"])
    assert at is not None
    (tmp_path / "checkpoint.journal").write_bytes(record(at.epoch, at.seq, base_of(snapshot), b'{"put": not json'))
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


def test_saved_claims_reads_what_a_restarted_driver_would(tmp_path: Path) -> None:
    """The plain reader tools and tests use (``journal.saved_claims``): the snapshot with the journal's
    records for it applied, across a compaction and records appended after it."""
    store = CheckpointStore(tmp_path, journal=True)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    store.update(lambda s: s.claims.__setitem__("u2", _claim("u2")))
    assert store.compact()
    store.update(lambda s: s.claims.__setitem__("u3", _claim("u3")))
    store.update(lambda s: s.claims.pop("u1"))
    snapshot = (tmp_path / "checkpoint.json").read_bytes()
    claims = saved_claims(snapshot, (tmp_path / "checkpoint.journal").read_bytes())
    assert sorted(claims) == ["u2", "u3"] == sorted(CheckpointStore(tmp_path).read(lambda s: s.claims))
    assert claims["u3"] == _claim("u3").to_dict()
    assert sorted(saved_claims(None, b"")) == []
