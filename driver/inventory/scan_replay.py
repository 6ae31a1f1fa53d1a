"""A rescan that reads every input again and builds nothing when nothing changed.

A scan is a deterministic function of what it reads: sysfs files, links, directory listings,
identity stats (and netlink facts, compared by the :class:`~driver.inventory.discovery.Scanner`).
:class:`RecordingIO` records each of those system calls of a full scan with its answer, and
keeps the files open. :meth:`ScanReplay.verify` then repeats every call, in the same order,
and compares: equal answers mean the full scan would build exactly the same devices, so the
scanner returns them without running the pipeline again. The first difference stops the
replay and the scanner does a full scan (which records anew).

Nothing that can change is skipped: every file, link and listing the full scan looked at is
looked at again, except the immutable facts the identity cache vouches for (the stat of their
object is repeated instead). What is kept to compare with is small: the length of each file's
answer, and one digest of all the answers of each kind (contents, link targets, identities,
listings) instead of the answers themselves, taken as the full scan reads them, so a daemon
publishing thousands of devices never holds every sysfs answer twice, not even during that scan.
What the replay saves is the rest: path handling, attribute building, and two of the three
system calls per file (``pread`` on the open file at offset 0 re-runs the attribute's ``show``
in sysfs). A file of a removed sysfs object answers ``ENODEV`` on its old descriptor, which is
a difference. On other file systems (fixture trees) a replaced file lives on behind its old
descriptor, so there the directories of the open files are stat'ed too (a replaced entry
changes its directory's ctime; a file rewritten in place is read through the descriptor).
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import resource
import stat
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from driver.inventory.sysfs import READ_MAX, IdentityKey, ReadAnswer, SysfsIO, open_read

SYSFS_MAGIC = 0x62656572
LISTDIR, EXISTS, READLINK, STAT = range(4)
"""Kinds of the calls a replay repeats one by one (the rest are grouped in lists of their own)."""


KEPT_FILES_MAX = 8192
"""The most files a recording keeps open. Each open sysfs attribute holds a page of kernel memory
(its seq_file buffer; 4.5 KiB with the open file, measured on Linux 6.18) charged to the pod's
memory cgroup: 8192 files are 36 MiB, all of a ~1000-device node's. Past it a replay reopens
each file (open, read, close: about five times a pread; docs/performance.md, "What makes it fast")."""


def fd_budget() -> int:
    """How many files a recording may keep open: up to half the soft ``RLIMIT_NOFILE`` (at most
    :data:`KEPT_FILES_MAX`) counting what the process has open already, so other descriptors
    always have room."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 65536 if soft == resource.RLIM_INFINITY else soft
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    return max(0, min(KEPT_FILES_MAX, limit // 2 - in_use))


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def is_sysfs(path: str) -> bool:
    """Whether ``path`` is on sysfs (kernfs: a removed object's open files answer ENODEV)."""
    buf = ctypes.create_string_buffer(120)  # struct statfs; f_type first (os.statvfs lacks it)
    if ctypes.CDLL(None, use_errno=True).statfs(path.encode(), buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], "little") == SYSFS_MAGIC


class RecordingIO(SysfsIO):
    """:class:`SysfsIO` that records every call and its answer for a :class:`ScanReplay`, as the
    replay will use them: files stay open, and answers are kept as digests, not held whole (the
    lists a replay loops over fill up as the scan goes). Calls whose answers the identity cache
    vouches for are not recorded (its stat of their object is).

    ``on_sysfs``: off sysfs the directories of the files kept open are noted (a replay stats them).
    """

    def __init__(self, on_sysfs: bool = True, max_fds: int | None = None) -> None:
        self.on_sysfs = on_sysfs
        self.max_fds = fd_budget() if max_fds is None else max_fds
        self.fds: list[int] = []  # files kept open, and the length of what each gave
        self.lengths: list[int] = []
        self.contents = hashlib.blake2b(digest_size=16)  # of what they gave (see _digest)
        self.dirs: set[str] = set()  # directories of the files kept open (off sysfs only)
        self.reads: list[str] = []  # files read by path (not kept open), and the digest of their answers
        self.answers = hashlib.blake2b(digest_size=16)
        self.links: list[str] = []  # links that resolved, and the digest of their targets
        self.targets = hashlib.blake2b(digest_size=16)
        self.stats: list[str] = []  # objects stat'ed, and the digest of their identities
        self.keys = hashlib.blake2b(digest_size=16)
        self.dirs_checked: list[str] = []  # is_dir calls, and their answers
        self.is_dir_answers: list[bool] = []
        self.missing: list[str] = []  # links that were not there (ENOENT): still not there?
        self.rest: list[tuple[int, str, Any]] = []  # listings, existence checks, failed link reads and stats
        # The descriptors go with the recording even if nobody calls close() (a dropped Scanner).
        self._finalizer = weakref.finalize(self, _close_all, self.fds)

    def read(self, path: str, vouched: bool = False) -> ReadAnswer:
        fd, answer = open_read(path)
        if vouched or fd is None or len(self.fds) >= self.max_fds:
            if fd is not None:
                os.close(fd)
            if not vouched:
                self.reads.append(path)
                _add_answer(self.answers, answer)
            return answer
        assert isinstance(answer, bytes)  # a descriptor is only kept for content
        self.fds.append(fd)
        self.lengths.append(len(answer))
        _add_chunk(self.contents, answer)
        if not self.on_sysfs:
            self.dirs.add(os.path.dirname(path))
        return answer

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        self.rest.append((LISTDIR, path, _texts_digest(names)))
        return names

    def exists(self, path: str) -> bool:
        found = super().exists(path)
        self.rest.append((EXISTS, path, found))
        return found

    def is_dir(self, path: str) -> bool:
        found = super().is_dir(path)
        self.dirs_checked.append(path)
        self.is_dir_answers.append(found)
        return found

    def readlink(self, path: str, vouched: bool = False) -> str | int:
        target = super().readlink(path)
        if vouched:
            return target
        if isinstance(target, str):
            self.links.append(path)
            _add_text(self.targets, target)
        elif target == errno.ENOENT:
            self.missing.append(path)
        else:
            self.rest.append((READLINK, path, target))
        return target

    def stat_key(self, path: str) -> IdentityKey | None:
        key = super().stat_key(path)
        if key is None:
            self.rest.append((STAT, path, key))
        else:
            self.stats.append(path)
            self.keys.update(_packed(key))
        return key

    def close(self) -> None:
        """Close the files kept open."""
        _close_all(self.fds)


class PathList:
    """Paths kept as one string, NUL-separated (no path holds NUL): a list of str costs ~60 bytes
    more per path, and the replay of a 10k-device node keeps ~100k paths. Iterating splits them
    again (in C: ~40 ns a path, against the microsecond of the system call made with each)."""

    __slots__ = ("_joined",)

    def __init__(self, paths: list[str]) -> None:
        self._joined = "\0".join(paths)

    def __iter__(self) -> Iterator[str]:
        return iter(self._joined.split("\0") if self._joined else ())

    def __len__(self) -> int:
        return self._joined.count("\0") + 1 if self._joined else 0

    def __contains__(self, path: object) -> bool:
        return path in list(self)


class ScanReplay:
    """The calls of the last full scan (a :class:`RecordingIO`) and its result; :meth:`verify`
    checks nothing changed.

    The recorded calls are grouped by kind into flat lists, so the replay runs as a few tight
    loops (the order of the calls does not matter: each answer is compared on its own, and a
    stale descriptor is caught as described in the module docstring).
    """

    def __init__(self, io: RecordingIO, result: Any) -> None:
        self.io = io
        self.result = result
        self.replays = 0
        self._fds, self._lengths, self._contents = io.fds, io.lengths, io.contents.digest()
        self._targets, self._keys, self._answers = io.targets.digest(), io.keys.digest(), io.answers.digest()
        self._rest = io.rest
        # Off sysfs, a file replaced under an open descriptor changes its directory's ctime: the
        # directories of the files kept open are stat'ed too (those not stat'ed as objects already).
        # A directory also asked about by is_dir is stat'ed once for both questions.
        dirs = sorted(io.dirs - set(io.stats))
        self._dir_keys = [_dir_answer(d) for d in dirs]
        # So is one whose identity (an object directory) is stat'ed: the same key, the same directory.
        covered = set(dirs) | set(io.stats)
        checked = [(p, d) for p, d in zip(io.dirs_checked, io.is_dir_answers, strict=True) if not (d and p in covered)]
        self._dirs_checked, self._is_dir = PathList([p for p, _ in checked]), [d for _, d in checked]
        self._dirs, self._links, self._stats = PathList(dirs), PathList(io.links), PathList(io.stats)
        self._reads, self._missing = PathList(io.reads), PathList(io.missing)
        # The recording's lists: what the replay needs is above.
        io.dirs, io.dirs_checked, io.is_dir_answers = set(), [], []
        io.links, io.stats, io.reads, io.missing = [], [], [], []

    def close(self) -> None:
        """Close the recorded files."""
        self.io.close()

    def verify(self) -> bool:
        """Repeat every recorded call; True when each answer is the same as recorded."""
        pread, readlink, stat, isdir, access = os.pread, os.readlink, os.stat, os.path.isdir, os.access
        try:
            contents = [pread(fd, READ_MAX, 0) for fd in self._fds]
            if list(map(len, contents)) != self._lengths or _digest(contents) != self._contents:
                return False
            if _texts_digest(map(readlink, self._links)) != self._targets:
                return False
            if _keys_digest((s.st_dev, s.st_ino, s.st_ctime_ns) for s in map(stat, self._stats)) != self._keys:
                return False
            if self._dir_keys and [_dir_answer(d) for d in self._dirs] != self._dir_keys:
                return False
            if [isdir(p) for p in self._dirs_checked] != self._is_dir:
                return False
            # Still missing, without raising an exception per path (os.access answers False).
            if any(access(p, os.F_OK, follow_symlinks=False) for p in self._missing):
                return False
            if self._reads and _answers_digest(map(PLAIN.read, self._reads)) != self._answers:
                return False
        except OSError:  # ENODEV: a sysfs object is gone; ENOENT: a path is; either way, changed
            return False
        for op, target, expected in self._rest:
            answer = _call(op, target)
            if (_texts_digest(answer) if op == LISTDIR else answer) != expected:
                return False
        self.replays += 1
        return True


def _dir_answer(path: str) -> tuple[bool, IdentityKey] | None:
    """A directory's (is a directory, identity key), or None when missing: one stat for both."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return stat.S_ISDIR(st.st_mode), (st.st_dev, st.st_ino, st.st_ctime_ns)


def _call(op: int, target: str) -> Any:
    if op == READLINK:
        return PLAIN.readlink(target)
    if op == STAT:
        return PLAIN.stat_key(target)
    if op == LISTDIR:
        return PLAIN.listdir(target)
    return PLAIN.exists(target)


PLAIN = SysfsIO()


def _add_chunk(h: Any, chunk: bytes) -> None:
    h.update(len(chunk).to_bytes(4, "little"))
    h.update(chunk)


def _digest(chunks: Iterable[bytes]) -> bytes:
    """One digest of a sequence of byte strings (each length-prefixed: no two sequences collide by
    moving bytes from one item to the next); a recording adds them one by one (:func:`_add_chunk`)."""
    h = hashlib.blake2b(digest_size=16)
    update = h.update  # the two updates of _add_chunk, inlined: this loop runs on every rescan
    for chunk in chunks:
        update(len(chunk).to_bytes(4, "little"))
        update(chunk)
    return h.digest()


def _add_answer(h: Any, answer: ReadAnswer) -> None:
    """A file's answer (content, a problem, or none) into a digest: its kind, then what it holds."""
    if answer is None:
        h.update(b"N")
    elif isinstance(answer, bytes):
        h.update(b"C")
        _add_chunk(h, answer)
    else:
        h.update(b"P")
        _add_chunk(h, answer.encode("utf-8", "surrogateescape"))


def _answers_digest(answers: Iterable[ReadAnswer]) -> bytes:
    """The digest of files' answers, as a recording adds them (:func:`_add_answer`)."""
    h = hashlib.blake2b(digest_size=16)
    for answer in answers:
        _add_answer(h, answer)
    return h.digest()


def _add_text(h: Any, text: str) -> None:
    h.update(text.encode("utf-8", "surrogateescape"))
    h.update(b"\0")


def _texts_digest(texts: Iterable[str]) -> bytes:
    """The digest of link targets or names (never holding NUL), each NUL-terminated: joined, then
    hashed once; a recording adds them one by one (:func:`_add_text`), to the same digest."""
    items = list(texts)
    joined = "\0".join(items) + "\0" if items else ""
    return hashlib.blake2b(joined.encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _packed(key: IdentityKey) -> bytes:
    """An identity key ``(st_dev, st_ino, st_ctime_ns)`` in 27 bytes (9 each: any 64-bit value)."""
    return b"".join(k.to_bytes(9, "little", signed=True) for k in key)


def _keys_digest(keys: Iterable[IdentityKey]) -> bytes:
    """The digest of identity keys, as a recording adds them (:func:`_packed`), in one join."""
    packed = b"".join(k.to_bytes(9, "little", signed=True) for key in keys for k in key)
    return hashlib.blake2b(packed, digest_size=16).digest()
