"""The claims journal: changes to the prepared-claims file appended as records, one sync each.

Replacing a file durably takes two syncs (the new file, then its directory after the rename).
Appending to a file that already exists takes one: the record is written at the end and
``fdatasync`` makes its bytes and the file's new size durable together; the directory entry was
made durable once, when the journal was created. So a batch of prepares or unprepares costs one
sync, and the full file (the *snapshot*) is rewritten only now and then (compaction), off the
kubelet's path.

A record is a header and a payload (the store's JSON of the claims put and removed)::

    magic "DNJ1" | payload length u32 | crc32 u32 | epoch u64 | sequence u32 | base 16 bytes | payload

- ``epoch`` (random) names a *run* of records and ``sequence`` numbers them within it from 0
  (consecutive, never reused for another change): a record of this run is told from the rest of an
  older run left beyond the file's end. ``base`` names the snapshot the run was started on (a hash
  of its bytes); a run started on a snapshot applies to it whole.
- Every snapshot this driver writes also names the :class:`Position` it was written at
  (``"journal": {"epoch": E, "seq": N}``): it holds run E's records before N, and run E's records
  from N on apply to it. A compaction writes the new snapshot while records are still appended, so
  it names where its copy of the claims stopped; the records appended meanwhile continue the same
  run and apply to the old snapshot (the run's base) and to the new one (from its position) alike:
  a crash at any step of the compaction finds them, and the journal is never rewritten to keep
  them. Records before a snapshot's position (folded, not yet cut off the file) are skipped, never
  replayed. Once a snapshot holding every record is durable the journal is cut, and the next
  append starts a new run on it. The position also makes the bytes of every snapshot differ from
  those of an older one with the same claims that the journal moved on from, so a run started on
  the older is never taken for one started on the newer.
- A driver from before positions reads only runs started on its snapshot: it misses the records
  appended while a compaction ran until the next quiet compaction cuts them, as a driver from
  before the journal misses every record until one.
- ``crc32`` covers everything after it. The journal is read from the start up to the first record
  that is not whole and valid: a record torn by a crash was never acknowledged (its sync had not
  returned), so dropping it loses nothing anyone was told was saved. A crash tears only the last
  record, so bytes that fail their check *followed by a valid record of the same run* are damage
  (a flipped bit, a bad sector, bytes inserted or cut out), not a tear: reading resumes at the
  run's next valid record (the one due next included), the records after them are kept and
  applied, and :attr:`Parsed.damage` says what was lost (the store then moves the file aside and
  rebuilds from the API server what it cannot read). The checksum covers neither the magic nor the
  length, so a record whose magic or length alone is damaged is still read: its checksum finds its
  end (where its length says, where a later record begins, or the file's end). A run's sequence
  skipping ahead from one valid record to the next is damage too (records cut out whole). A last
  record that is whole but fails its checksum is either a tear or damage to an acknowledged
  record: :attr:`Parsed.suspect` says so, and the store rebuilds from the API server to be sure.

Every system call of a write goes through :class:`~driver.checkpoint.files.FileOps`, like the
snapshot's (the fault tests kill the process after each one).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.checkpoint.files import MAX_STATE_BYTES, FileOps, read_state, sync_directory

log = logging.getLogger(__name__)

MAGIC = b"DNJ1"
_HEADER = struct.Struct("<4sIIQI16s")  # magic, payload length, crc32, epoch, sequence, base
_CRC_FROM = 12  # the crc covers the header after its own field, then the payload
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_EPOCH = (1 << 64) - 1
_MAX_SEQ = (1 << 32) - 1  # a record's u32; a run never nears it (the store bounds a run's bytes)


def base_of(snapshot: bytes | None) -> bytes:
    """The name of a snapshot in the records: a hash of its bytes (``None``: no snapshot on disk)."""
    return hashlib.blake2b(b"\0" if snapshot is None else b"\1" + snapshot, digest_size=16).digest()


def record(epoch: int, seq: int, base: bytes, payload: bytes) -> bytes:
    """One record's bytes."""
    head = _HEADER.pack(MAGIC, len(payload), 0, epoch, seq, base)
    crc = zlib.crc32(payload, zlib.crc32(head[_CRC_FROM:]))
    return head[:8] + crc.to_bytes(4, "little") + head[_CRC_FROM:] + payload


def _header(data: bytes | memoryview, at: int) -> tuple[int, int, int, int, bytes] | None:
    """(payload length, crc, epoch, sequence, base) of the header at ``at``, or None."""
    if len(data) - at < _HEADER.size:
        return None
    magic, length, crc, epoch, seq, base = _HEADER.unpack_from(data, at)
    if magic != MAGIC:
        return None
    return length, crc, epoch, seq, base


@dataclass(frozen=True)
class Position:
    """A place in the journal: record ``seq`` of run ``epoch``. A snapshot names the position it was
    written at: it holds the run's records before it, and those from it on apply to it."""

    epoch: int
    seq: int

    @classmethod
    def new_run(cls) -> Position:
        """The start of a new run (a random epoch)."""
        return cls(int.from_bytes(os.urandom(8), "little"), 0)

    def reached_by(self, later: Position) -> bool:
        """Whether ``later`` is this position or one after it in the same run."""
        return later.epoch == self.epoch and later.seq >= self.seq

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "seq": self.seq}

    @classmethod
    def from_json(cls, value: Any) -> Position | None:
        """The position a snapshot names (None: it names none). Raises ``ValueError`` for anything but
        ``{"epoch": u64, "seq": u32}``: a damaged snapshot, never read as another position."""
        if value is None:
            return None
        fields = value if isinstance(value, dict) else {}
        epoch, seq = fields.get("epoch"), fields.get("seq")
        if set(fields) != {"epoch", "seq"} or type(epoch) is not int or type(seq) is not int:
            raise ValueError(f"journal position {value!r} is not {{'epoch': int, 'seq': int}}")
        if not (0 <= epoch <= _MAX_EPOCH and 0 <= seq <= _MAX_SEQ):
            raise ValueError(f"journal position {value!r} is out of range")
        return cls(epoch, seq)


@dataclass(frozen=True)
class Tail:
    """Where the journal's run ends: its epoch, the next record's sequence number and offset, and the
    base its records name."""

    epoch: int
    seq: int
    end: int
    base: bytes


@dataclass(frozen=True)
class Parsed:
    """What a journal's bytes hold for a snapshot: the payloads to apply, in order; the tail of the
    run (None: no valid record of it); the offset of the first record the snapshot does not hold;
    ``damage``: what could not be read between valid records of the run (None: nothing);
    ``suspect``: a whole last record that fails its checksum (torn, or damaged after its sync)."""

    payloads: list[bytes]
    tail: Tail | None
    start: int
    damage: str | None = None
    suspect: str | None = None


def _valid_at(view: memoryview, at: int) -> tuple[int, int, int, bytes, int] | None:
    """(payload length, epoch, sequence, base, end) of a whole record at ``at`` whose checksum holds."""
    head = _header(view, at)
    if head is None:
        return None
    length, crc, epoch, seq, rec_base = head
    begin = at + _HEADER.size
    if begin + length > len(view):
        return None
    if zlib.crc32(view[begin : begin + length], zlib.crc32(view[at + _CRC_FROM : begin])) != crc:
        return None
    return length, epoch, seq, rec_base, begin + length


def _mended(data: bytes, at: int, expected: Callable[[int, int, bytes], bool]) -> int | None:
    """The payload length of a record at ``at`` whose magic or length field alone is damaged (the
    checksum covers neither), when its header names the run's next record (``expected(epoch, seq,
    base)``) and, with the magic assumed, its checksum holds over the payload up to one of the ends
    it can have: the one its length field names, one where a later record's magic begins (a middle
    record's length smashed: the next record follows it), or the end of the file. None otherwise.
    The nearest end whose checksum holds is taken (another would be a crc32 collision)."""
    view = memoryview(data)
    if len(view) - at < _HEADER.size:
        return None
    _magic, length, crc, epoch, seq, rec_base = _HEADER.unpack_from(view, at)
    if not expected(epoch, seq, rec_base):
        return None
    begin = at + _HEADER.size
    ends, found = {begin + length, len(view)}, begin
    while (found := data.find(MAGIC, found)) != -1:
        ends.add(found)
        found += 1
    running, done = zlib.crc32(view[at + _CRC_FROM : begin]), begin
    for end in sorted(e for e in ends if e <= len(view)):
        running, done = zlib.crc32(view[done:end], running), end  # one pass over the rest of the file
        if running == crc:
            return end - begin
    return None


def _record_at(
    data: bytes, at: int, expected: Callable[[int, int, bytes], bool]
) -> tuple[tuple[int, int, int, bytes, int] | None, bool]:
    """The record at ``at`` as :func:`_valid_at` gives it, else mended (:func:`_mended`), and
    whether it had to be mended."""
    view = memoryview(data)
    found = _valid_at(view, at)
    if found is not None:
        return found, False
    length = _mended(data, at, expected)
    if length is None:
        return None, False
    _magic, _length, _crc, epoch, seq, rec_base = _HEADER.unpack_from(view, at)
    return (length, epoch, seq, rec_base, at + _HEADER.size + length), True


def _resume(data: bytes, after: int, continues: Callable[[int, int, bytes], bool]) -> int | None:
    """The offset of the next whole, valid record after ``after`` that ``continues(epoch, seq,
    base)`` the run being read (None: there is none: the bytes from ``after`` on are a tear, or
    the rest of an older run)."""
    view, at = memoryview(data), after
    while (at := data.find(MAGIC, at + 1)) != -1:
        found = _valid_at(view, at)
        if found is not None and continues(found[1], found[2], found[3]):
            return at
    return None


def _held_below(epoch: int, seq: int, rec_base: bytes, base: bytes, at: Position | None) -> int | None:
    """For the file's first record: the sequence number from which its run applies to the snapshot
    (the snapshot's position in the run it names, which the file may hold from before it; 0 for a
    run started on the snapshot), or None when the run does not apply to it."""
    if at is not None and epoch == at.epoch:
        return at.seq if seq <= at.seq else None
    return 0 if rec_base == base and seq == 0 else None


def parse(data: bytes, base: bytes, at: Position | None) -> Parsed:
    """The payloads of the valid records of ``data`` that apply to the snapshot named ``base`` at
    position ``at`` (None: it names none), in order; records the snapshot holds are skipped. Bytes
    that fail their check before a later valid record of the run are skipped and named in
    :attr:`Parsed.damage`."""
    return _Reader(data, base, at).read()


class _Reader:
    """One pass over a journal's bytes for one snapshot (:func:`parse`)."""

    def __init__(self, data: bytes, base: bytes, at: Position | None) -> None:
        self.data, self.view, self.base, self.at = data, memoryview(data), base, at
        self.payloads: list[bytes] = []
        self.tail: Tail | None = None
        self.start: int | None = None
        self.held_below = 0
        self.damaged: list[str] = []
        self.suspect: str | None = None
        self.gap = False  # the run's next record follows damage: its sequence may skip the lost ones

    def continues(self, epoch: int, seq: int, rec_base: bytes) -> bool:
        """Whether a valid record found past damage belongs to the run being read."""
        if self.tail is not None:
            # ``tail.seq`` is already the sequence of the record due next: past bytes inserted before
            # it, or the remains of a record before it, that record is found again, never skipped.
            return (epoch, rec_base) == (self.tail.epoch, self.tail.base) and seq >= self.tail.seq
        # The run's first records are damaged: one of the snapshot's run, or of a run started on it.
        return (self.at is not None and epoch == self.at.epoch) or rec_base == self.base

    def expected(self, epoch: int, seq: int, rec_base: bytes) -> bool:
        """Whether a header names the run's next record."""
        if self.tail is not None:
            return (epoch, seq, rec_base) == (self.tail.epoch, self.tail.seq, self.tail.base)
        return _held_below(epoch, seq, rec_base, self.base, self.at) is not None

    def read(self) -> Parsed:
        offset = 0
        while offset < len(self.data):
            found, mended = _record_at(self.data, offset, self.expected)
            if mended:
                self.damaged.append(f"the magic or length field of the record at byte {offset} (its payload checks)")
            if found is None:
                resume = _resume(self.data, offset, self.continues)
                if resume is None:  # a tear, or an older run's rest: where the journal ends
                    self.suspect = _whole_but_bad(self.view, offset, self.tail)
                    break
                where = f" (from record {self.tail.seq})" if self.tail else ""
                self.damaged.append(f"bytes {offset}-{resume}{where}")
                self.gap = True
                offset = resume
                continue
            if not self.take(offset, *found):
                break
            offset = found[4]
        tail = self.tail
        if tail is not None and tail.seq < self.held_below:
            tail = None  # the run ends before the snapshot's position: nothing of it is left to apply
        damage = "; ".join(self.damaged) + " unreadable; the valid records after them kept" if self.damaged else None
        start = (tail.end if tail else 0) if self.start is None else self.start
        return Parsed(self.payloads, tail, start, damage, self.suspect)

    def take(self, offset: int, length: int, epoch: int, seq: int, rec_base: bytes, end: int) -> bool:
        """Apply a valid record; False where the run ends (an older run's rest, or one not for us)."""
        if self.tail is None:
            first = _held_below(epoch, seq, rec_base, self.base, self.at)
            if first is None and not self.damaged:
                return False  # a run that does not apply to this snapshot
            if first is None:  # the run's first records were damaged: this one continues it
                first = self.at.seq if self.at is not None and epoch == self.at.epoch else 0
            self.held_below = first
        elif (epoch, rec_base) != (self.tail.epoch, self.tail.base) or seq < self.tail.seq:
            return False  # the rest of an older run, beyond this one's end
        elif seq > self.tail.seq and not self.gap:
            # The run's own epoch (random per run) skipping ahead with nothing unreadable between:
            # its records in between were cut out whole, not a run's end.
            self.damaged.append(f"records {self.tail.seq}-{seq - 1} (missing: byte {offset} holds record {seq})")
        if seq >= self.held_below:
            self.start = offset if self.start is None else self.start
            self.payloads.append(bytes(self.view[end - length : end]))
        self.tail = Tail(epoch, seq + 1, end, rec_base)
        self.gap = False
        return True


def _whole_but_bad(view: memoryview, offset: int, tail: Tail | None) -> str | None:
    """Why the run's next record, whole but failing its checksum, may have been acknowledged
    (None: it is not whole, or not the run's next: a tear or an older run's rest)."""
    head = _header(view, offset)
    if head is None:
        return None
    length, _crc, _epoch, _seq, _base = head
    if offset + _HEADER.size + length > len(view) or (tail is None and offset > 0):
        return None
    # Where the run's next record goes, a whole record fails its checksum (its epoch, sequence or
    # base may be what is damaged): an older run's rest would be a valid record, or no record here.
    return f"the record at byte {offset} is whole but fails its checksum (torn by a crash, or damaged after its sync)"


def saved_claims(snapshot: bytes | None, data: bytes) -> dict[str, Any]:
    """The claims ``checkpoint.json``'s bytes (None: no file) and the journal's bytes hold together,
    plain JSON by UID: what a driver reads at start, without its repairs or locks (for tools and
    tests looking at a live driver's state)."""
    doc = json.loads(snapshot) if snapshot else {}
    claims: dict[str, Any] = dict(doc.get("claims", {}))
    for payload in parse(data, base_of(snapshot), Position.from_json(doc.get("journal"))).payloads:
        change = json.loads(payload)
        claims.update(change["put"])
        for uid in change["delete"]:
            claims.pop(uid, None)
    return claims


class Journal:
    """The journal file: read at load, appended to by updates (under the store's locks)."""

    def __init__(self, path: Path, ops: FileOps) -> None:
        self.path = path
        self.ops = ops
        self._tail: Tail | None = None  # None: no valid record of the run in the file
        self._start = 0  # offset of the first record the current snapshot does not hold
        # Without a run in the file: the new run the next append starts (chosen once asked for, so
        # a snapshot written meanwhile names it).
        self._next: Position | None = None
        self._seen: tuple[int, int] | None = None  # (inode, size) as last read or written by us
        # The journal's directory entry is synced by this process's first append, whoever created
        # it (a process that crashed right after creating it may not have), and again after
        # an append had to create the file.
        self._entry_synced = False
        # The file vanished under records of the current snapshot (moved aside by another process):
        # they are no longer on disk, so the store writes the snapshot whole before journaling again.
        self.lost = False
        # What the last load found wrong (:class:`Parsed`): records lost between valid ones, or a
        # whole last record failing its checksum.
        self.damage: str | None = None
        self.suspect: str | None = None

    @property
    def size(self) -> int:
        """Bytes of valid records the snapshot does not hold (0: nothing to compact)."""
        return 0 if self._tail is None else self._tail.end - self._start

    @property
    def length(self) -> int:
        """Bytes of the run in the file, folded records included: what a start reads through."""
        return 0 if self._tail is None else self._tail.end

    def position(self) -> Position:
        """Where the next record goes: the position a snapshot of the state as it is now names."""
        if self._tail is not None:
            return Position(self._tail.epoch, self._tail.seq)
        if self._next is None:
            self._next = Position.new_run()
        return self._next

    def load(self, base: bytes, at: Position | None) -> list[bytes]:
        """The payloads to apply to the snapshot named ``base`` at position ``at``, and the tail set
        after them. A file that is not a regular file raises
        :class:`~driver.checkpoint.files.NotAStateFile` (moved aside by the store); an unreadable one
        its ``OSError``."""
        self._tail, self._start, self._next, self._seen = None, 0, None, None
        self.damage = self.suspect = None
        try:
            raw, st = read_state(self.path)
        except FileNotFoundError:
            return []
        self._seen = (st.st_ino, len(raw))
        parsed = parse(raw, base, at)
        self._tail, self._start = parsed.tail, parsed.start
        self.damage, self.suspect = parsed.damage, parsed.suspect
        if parsed.damage or parsed.suspect:
            return parsed.payloads  # the store says so and acts on it
        if len(raw) > self.length:
            log.info(
                "journal: bytes after the last valid record ignored (an interrupted write, or records "
                "a newer snapshot holds)",
                extra={"kv": {"path": str(self.path), "valid_bytes": self.length, "bytes": len(raw)}},
            )
        return parsed.payloads

    def folded(self, at: Position, end: int) -> None:
        """A snapshot naming ``at`` (a :meth:`position` of this run) is now current; the run's records
        before it end at offset ``end``. Nothing is cut yet (see :meth:`cut`): until that snapshot
        is durable the old one may be the one a crash leaves, and it still needs them."""
        if self._tail is not None and self._tail.epoch == at.epoch:
            self._start = end

    def forget(self) -> None:
        """The file's records are gone (moved aside): the next append starts a new run at its start."""
        self._tail, self._start, self._next = None, 0, None
        self.lost = False

    def cut(self) -> None:
        """Once the current snapshot is durable and holds every record: cut them off the file; the next
        append starts a new run on that snapshot. Not synced: records before the snapshot's position
        are never replayed, whether or not the cut survives a crash."""
        if self.size:
            return  # records the snapshot does not hold: they stay until a later compaction
        self.forget()
        if not self._seen or not self._seen[1]:
            return
        try:
            fd, _ = self._open()
        except OSError as exc:
            log.info("journal: cannot cut folded records (the next append does)", extra={"kv": {"error": str(exc)}})
            return
        try:
            self.ops.ftruncate(fd, 0)
            self._seen = (os.fstat(fd).st_ino, 0)
        except OSError as exc:
            log.info("journal: cannot cut folded records (the next append does)", extra={"kv": {"error": str(exc)}})
        finally:
            self.ops.close(fd)

    def changed(self) -> bool:
        """Whether another process wrote the journal since we last read or wrote it (one ``lstat``:
        every append grows the file, a cut empties it)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return self._seen is not None
        except OSError:
            return False
        return (st.st_ino, st.st_size) != self._seen

    def append(self, base: bytes, payload: bytes) -> None:
        """Append a record (a new run is started on the current snapshot, named ``base``) and make it
        durable: one ``fdatasync`` (and the directory's ``fsync`` at this process's first append).

        On failure the journal is cut back to where it ended (a torn record is removed) and the
        ``OSError`` propagates; the records before it stay valid.
        """
        tail = self._tail
        fresh = tail is None
        if tail is None:
            at = self.position()
            tail = Tail(at.epoch, at.seq, 0, base)
        data = record(tail.epoch, tail.seq, tail.base, payload)
        end = tail.end + len(data)
        if end > MAX_STATE_BYTES:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        fd, created = self._open()
        try:
            if created and tail.end:
                # Appending to the new, empty file would leave a hole where our records were.
                self.lost = True
                raise OSError(errno.ENOENT, f"{self.path} vanished under its records")
            view, offset = memoryview(data), tail.end
            while view:
                written = self.ops.pwrite(fd, view, offset)
                if written <= 0:  # no progress and no error: treat as a full disk, never spin
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view, offset = view[written:], offset + written
            st = os.fstat(fd)
            inode, size = st.st_ino, max(end, st.st_size)
            if fresh and size > end:
                self.ops.ftruncate(fd, end)  # the stale rest of an older run goes
                size = end
            self.ops.fdatasync(fd)
            if not self._entry_synced:
                sync_directory(self.path.parent, self.ops)
                self._entry_synced = True
        except OSError:
            try:
                if not created or not tail.end:
                    self.ops.ftruncate(fd, tail.end)  # the torn or unsynced record goes
                self._seen = (os.fstat(fd).st_ino, os.fstat(fd).st_size)
            except OSError:
                self._seen = None  # unknown: the next refresh reloads
            self._tail = None if fresh else tail
            raise
        finally:
            self.ops.close(fd)
        self._tail, self._next = Tail(tail.epoch, tail.seq + 1, end, tail.base), None
        self._seen = (inode, size)

    def _open(self) -> tuple[int, bool]:
        """The journal opened for writing, created if missing. Each write opens it and closes it
        after: no file of the state disk stays open for writing between writes (an administrator's
        read-only remount would fail with EBUSY), and a file another process replaced or moved
        aside is never written through an old descriptor. Also whether it was created."""
        try:
            return self.ops.open(str(self.path), _OPEN_FLAGS, 0o600), False
        except FileNotFoundError:
            fd = self.ops.open(str(self.path), _OPEN_FLAGS | os.O_CREAT, 0o600)
            self._entry_synced = False  # a new directory entry: the append syncs the directory
            return fd, True

    def close(self) -> None:
        """Nothing stays open between writes (kept for the store's shutdown path)."""
