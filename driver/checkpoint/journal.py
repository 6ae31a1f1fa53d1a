"""The claims journal: changes to the prepared-claims file appended as records, one sync each.

Replacing a file durably takes two syncs (the new file, then its directory after the rename).
Appending to a file that already exists takes one: the record is written at the end and
``fdatasync`` makes its bytes and the file's new size durable together; the directory entry was
made durable once, when the journal was created. So a batch of prepares or unprepares costs one
sync, and the full file (the *snapshot*) is rewritten only now and then (compaction), off the
kubelet's path.

A record is a header and a payload (the store's JSON of the claims put and removed)::

    magic "DNJ1" | payload length u32 | crc32 u32 | epoch u64 | sequence u32 | base 16 bytes | payload

- ``base`` names the snapshot the records apply to (a hash of its bytes). A snapshot written
  after the records (a compaction, or a write by an instance that does not journal) has another
  hash, and the journal is then stale: it is ignored, and the next append starts it again at
  offset 0. The records' effect is in that snapshot (it was written from a state that held them),
  and records written on top of a newer state are never replayed over it.
- ``epoch`` (random per start of the journal) and ``sequence`` (0, 1, 2... within it) tell a
  record of this journal from the rest of an older, longer one left beyond its end.
- ``crc32`` covers everything after it. The journal is read from the start up to the first record
  that is not whole and valid: a record torn by a crash was never acknowledged (its sync had not
  returned), so dropping it loses nothing anyone was told was saved.

Every system call of a write goes through :class:`~driver.checkpoint.files.FileOps`, like the
snapshot's (the fault tests kill the process after each one).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from driver.checkpoint.files import MAX_STATE_BYTES, FileOps, read_state

log = logging.getLogger(__name__)

MAGIC = b"DNJ1"
_HEADER = struct.Struct("<4sIIQI16s")  # magic, payload length, crc32, epoch, sequence, base
_CRC_FROM = 12  # the crc covers the header after its own field, then the payload
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


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
class Tail:
    """Where the journal ends: its epoch, the next record's sequence number and offset."""

    epoch: int
    seq: int
    end: int


def parse(data: bytes, base: bytes) -> tuple[list[bytes], Tail | None]:
    """The payloads of the valid records of ``data`` that apply to snapshot ``base``, in order, and
    the tail after the last one; ``([], None)`` when there is no valid first record for ``base``
    (an empty, stale or torn journal: the next append starts it again)."""
    payloads: list[bytes] = []
    tail: Tail | None = None
    at, view = 0, memoryview(data)
    while True:
        head = _header(view, at)
        if head is None:
            break
        length, crc, epoch, seq, rec_base = head
        start = at + _HEADER.size
        if start + length > len(data) or rec_base != base:
            break
        if tail is not None and (epoch != tail.epoch or seq != tail.seq):
            break  # the rest of an older journal, beyond this one's end
        if tail is None and seq != 0:
            break
        if zlib.crc32(view[start : start + length], zlib.crc32(view[at + _CRC_FROM : start])) != crc:
            break
        payloads.append(bytes(view[start : start + length]))
        tail = Tail(epoch, seq + 1, start + length)
        at = start + length
    return payloads, tail


class Journal:
    """The journal file of one snapshot: read at load, appended to by updates (under the store's locks)."""

    def __init__(self, path: Path, ops: FileOps) -> None:
        self.path = path
        self.ops = ops
        self._fd = -1  # opened for writing at the first append
        self._tail: Tail | None = None  # None: no valid record for the current snapshot
        self._seen: tuple[int, int] | None = None  # (inode, size) as last read or written by us
        # The journal's directory entry is synced by this process's first append, whoever created
        # it: a process that crashed right after creating it may not have.
        self._entry_synced = False

    @property
    def size(self) -> int:
        """Bytes of valid records (0: nothing a snapshot does not already hold)."""
        return 0 if self._tail is None else self._tail.end

    def load(self, base: bytes) -> list[bytes]:
        """The payloads to apply to snapshot ``base``, and the tail set after them. A file that is not a
        regular file raises :class:`~driver.checkpoint.files.NotAStateFile` (moved aside by the
        store); an unreadable one its ``OSError``."""
        self.close()  # another process may have replaced the file: write to the one read here
        self._tail, self._seen = None, None
        try:
            raw, st = read_state(self.path)
        except FileNotFoundError:
            return []
        self._seen = (st.st_ino, len(raw))
        payloads, self._tail = parse(raw, base)
        if len(raw) > self.size:
            log.info(
                "journal: bytes after the last valid record ignored (an interrupted write, or records "
                "a newer snapshot holds)",
                extra={"kv": {"path": str(self.path), "valid_bytes": self.size, "bytes": len(raw)}},
            )
        return payloads

    def forget(self) -> None:
        """The snapshot now holds every record: the next append starts the journal again."""
        self._tail = None

    def empty(self) -> None:
        """After :meth:`forget`, cut the stale records off the file (not synced: stale records are never
        replayed, whether or not the cut survives a crash), so the next append has nothing to cut."""
        if self._tail is not None or not self._seen or not self._seen[1]:
            return
        try:
            fd = self._open()
            self.ops.ftruncate(fd, 0)
            self._seen = (os.fstat(fd).st_ino, 0)
        except OSError as exc:
            log.info("journal: cannot cut stale records (the next append does)", extra={"kv": {"error": str(exc)}})

    def changed(self) -> bool:
        """Whether another process wrote the journal since we last read or wrote it (one ``lstat``:
        every append grows the file, a restart of the journal follows a new snapshot)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return self._seen is not None
        except OSError:
            return False
        return (st.st_ino, st.st_size) != self._seen

    def append(self, base: bytes, payload: bytes) -> None:
        """Append a record for snapshot ``base`` and make it durable: one ``fdatasync`` (and the
        directory's ``fsync`` at this process's first append).

        On failure the journal is cut back to where it ended (a torn record is removed) and the
        ``OSError`` propagates; the records before it stay valid.
        """
        tail = self._tail
        fresh = tail is None
        if tail is None:
            tail = Tail(int.from_bytes(os.urandom(8), "little"), 0, 0)
        data = record(tail.epoch, tail.seq, base, payload)
        end = tail.end + len(data)
        if end > MAX_STATE_BYTES:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        fd = self._open()
        try:
            view, offset = memoryview(data), tail.end
            while view:
                written = self.ops.pwrite(fd, view, offset)
                if written <= 0:  # no progress and no error: treat as a full disk, never spin
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view, offset = view[written:], offset + written
            size = max(end, self._seen[1] if self._seen else 0)
            if fresh and size > end:
                self.ops.ftruncate(fd, end)  # the stale rest of an older journal goes
                size = end
            self.ops.fdatasync(fd)
            if not self._entry_synced:
                self._sync_directory()
        except OSError:
            try:
                self.ops.ftruncate(fd, tail.end)  # the torn or unsynced record goes
                self._seen = (os.fstat(fd).st_ino, tail.end)
            except OSError:
                self._seen = None  # unknown: the next refresh reloads
            self._tail = None if fresh else tail
            raise
        self._tail = Tail(tail.epoch, tail.seq + 1, end)
        self._seen = (os.fstat(fd).st_ino, size) if self._seen is None else (self._seen[0], size)

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = self.ops.open(str(self.path), _OPEN_FLAGS, 0o600)
        return self._fd

    def _sync_directory(self) -> None:
        dir_fd = self.ops.open(str(self.path.parent), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
        try:
            self.ops.fsync(dir_fd)
        finally:
            self.ops.close(dir_fd)
        self._entry_synced = True

    def close(self) -> None:
        """Close the journal file (reopened by the next append)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:
                pass
