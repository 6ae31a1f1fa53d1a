"""A rescan that reads every input again and builds nothing when nothing changed.

A scan is a deterministic function of what it reads: sysfs files, links, directory listings,
identity stats (and netlink facts, compared by the :class:`~driver.inventory.discovery.Scanner`).
:class:`RecordingIO` records each of those system calls of a full scan with its answer, and
keeps the files open. :meth:`ScanReplay.verify` then repeats every call, in the same order,
and compares: equal answers mean the full scan would build exactly the same devices, so the
scanner returns them without running the pipeline again. The first difference stops the
replay and the scanner does a full scan (which records anew).

Nothing is skipped: every file, link and listing the full scan looked at is looked at again.
What is kept to compare with is small: the length of each file's answer, and one digest of all
the answers of each kind (contents, link targets, identities, listings) instead of the answers
themselves, so a daemon publishing thousands of devices does not hold every sysfs answer twice.
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
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from driver.inventory.sysfs import READ_MAX, IdentityKey, ReadAnswer, SysfsIO, open_read

SYSFS_MAGIC = 0x62656572
READ_FD, READ_PATH, LISTDIR, EXISTS, READLINK, STAT, IS_DIR = range(7)


def fd_budget() -> int:
    """How many files a recording may keep open: up to half the soft ``RLIMIT_NOFILE`` (at most
    32768) counting what the process has open already, so other descriptors always have room."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 65536 if soft == resource.RLIM_INFINITY else soft
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 0
    return max(0, min(32768, limit // 2 - in_use))


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
    """:class:`SysfsIO` that records every call and its answer; files stay open for the replay."""

    def __init__(self, max_fds: int | None = None) -> None:
        self.ops: list[tuple[int, Any, Any]] = []
        self.fds: list[int] = []
        self.max_fds = fd_budget() if max_fds is None else max_fds
        # The descriptors go with the recording even if nobody calls close() (a dropped Scanner).
        self._finalizer = weakref.finalize(self, _close_all, self.fds)

    def read(self, path: str) -> ReadAnswer:
        fd, answer = open_read(path)
        if fd is not None and len(self.fds) < self.max_fds:
            self.fds.append(fd)
            self.ops.append((READ_FD, (fd, path), answer))
        else:
            if fd is not None:
                os.close(fd)
            self.ops.append((READ_PATH, path, answer))
        return answer

    def listdir(self, path: str) -> list[str]:
        names = super().listdir(path)
        self.ops.append((LISTDIR, path, names))
        return names

    def exists(self, path: str) -> bool:
        found = super().exists(path)
        self.ops.append((EXISTS, path, found))
        return found

    def is_dir(self, path: str) -> bool:
        found = super().is_dir(path)
        self.ops.append((IS_DIR, path, found))
        return found

    def readlink(self, path: str) -> str | int:
        target = super().readlink(path)
        self.ops.append((READLINK, path, target))
        return target

    def stat_key(self, path: str) -> IdentityKey | None:
        key = super().stat_key(path)
        self.ops.append((STAT, path, key))
        return key

    def close(self) -> None:
        """Close the files kept open."""
        _close_all(self.fds)


@dataclass
class _GroupedOps:
    """A scan's recorded calls grouped by kind (the lists the replay loops over)."""

    fds: list[int] = field(default_factory=list)
    contents: list[bytes] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    stats: list[str] = field(default_factory=list)
    keys: list[IdentityKey] = field(default_factory=list)
    dirs_checked: list[str] = field(default_factory=list)  # is_dir calls, and their answers
    is_dir: list[bool] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # links that were not there (ENOENT): still not there?
    rest: list[tuple[int, Any, Any]] = field(default_factory=list)  # failed calls, listings, existence checks
    dirs: set[str] = field(default_factory=set)  # directories of the files kept open


def _group_ops(ops: list[Any], skip: set[str] | frozenset[str]) -> _GroupedOps:
    """Group the recorded calls; files in ``skip`` are not read again (their descriptors closed)."""
    g = _GroupedOps()
    for op, target, expected in ops:
        if op == READ_FD and target[1] in skip:
            os.close(target[0])
            continue
        if op in (READ_PATH, READLINK) and target in skip:
            continue
        if op == READ_FD and expected is not None:
            g.fds.append(target[0])
            g.contents.append(expected)
            g.dirs.add(os.path.dirname(target[1]))
        elif op == READLINK and isinstance(expected, str):
            g.links.append(target)
            g.targets.append(expected)
        elif op == STAT and expected is not None:
            g.stats.append(target)
            g.keys.append(expected)
        elif op == IS_DIR:
            g.dirs_checked.append(target)
            g.is_dir.append(expected)
        elif op == READLINK and expected == errno.ENOENT:
            g.missing.append(target)
        elif op == LISTDIR:
            g.rest.append((op, target, _texts_digest(expected)))
        else:
            g.rest.append((op, target[1] if op == READ_FD else target, expected))
    return g


class ScanReplay:
    """The calls of the last full scan and its result; :meth:`verify` checks nothing changed.

    The recorded calls are grouped by kind into flat lists, so the replay runs as a few tight
    loops (the order of the calls does not matter: each answer is compared on its own, and a
    stale descriptor is caught as described in the module docstring).
    """

    def __init__(
        self, io: RecordingIO, result: Any, on_sysfs: bool, skip: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """``skip``: paths of files not to read again (immutable while their object, whose stat
        is replayed, stays the same); their descriptors are closed."""
        self.io = io
        self.result = result
        self.on_sysfs = on_sysfs
        self.replays = 0
        g = _group_ops(io.ops, skip)
        self._fds, self._links, self._stats = g.fds, g.links, g.stats
        self._dirs_checked, self._is_dir, self._missing, self._rest = g.dirs_checked, g.is_dir, g.missing, g.rest
        contents, targets, keys, dirs = g.contents, g.targets, g.keys, g.dirs
        io.ops = []  # everything the replay needs is in the lists above
        io.fds[:] = self._fds  # the finalizer's list object: it closes what the replay kept
        self._fds = io.fds
        # Lengths are small ints (shared objects): a changed length is found without hashing.
        self._lengths = [len(c) for c in contents]
        self._contents = _digest(contents)
        self._targets = _texts_digest(targets)
        self._keys = _keys_digest(keys)
        # Off sysfs, a file replaced under an open descriptor changes its directory's ctime: the
        # directories of the files kept open are stat'ed too (those not stat'ed as objects already).
        # A directory also asked about by is_dir is stat'ed once for both questions.
        self._dirs = [] if on_sysfs else sorted(dirs - set(self._stats))
        self._dir_keys = [_dir_answer(d) for d in self._dirs]
        # So is one whose identity (an object directory) is stat'ed: the same key, the same directory.
        covered = set(self._dirs) | set(self._stats)
        checked = [(p, d) for p, d in zip(self._dirs_checked, self._is_dir, strict=True) if not (d and p in covered)]
        self._dirs_checked, self._is_dir = [p for p, _ in checked], [d for _, d in checked]

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
            if self._dirs and [_dir_answer(d) for d in self._dirs] != self._dir_keys:
                return False
            if [isdir(p) for p in self._dirs_checked] != self._is_dir:
                return False
            # Still missing, without raising an exception per path (os.access answers False).
            if any(access(p, os.F_OK, follow_symlinks=False) for p in self._missing):
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


def _call(op: int, target: Any) -> Any:
    if op in (READ_FD, READ_PATH):
        return PLAIN.read(target)
    if op == IS_DIR:
        return PLAIN.is_dir(target)
    if op == READLINK:
        return PLAIN.readlink(target)
    if op == STAT:
        return PLAIN.stat_key(target)
    if op == LISTDIR:
        return PLAIN.listdir(target)
    return PLAIN.exists(target)


PLAIN = SysfsIO()


def _digest(chunks: Iterable[bytes]) -> bytes:
    """One digest of a sequence of byte strings (each length-prefixed: no two sequences collide by
    moving bytes from one item to the next)."""
    h = hashlib.blake2b(digest_size=16)
    for chunk in chunks:
        h.update(len(chunk).to_bytes(4, "little"))
        h.update(chunk)
    return h.digest()


def _texts_digest(texts: Iterable[str]) -> bytes:
    """The digest of link targets (never holding NUL): joined, then hashed once."""
    return hashlib.blake2b("\0".join(texts).encode("utf-8", "surrogateescape"), digest_size=16).digest()


def _keys_digest(keys: Iterable[IdentityKey]) -> bytes:
    """The digest of identity keys ``(st_dev, st_ino, st_ctime_ns)`` (9 bytes each: any 64-bit value)."""
    packed = b"".join(k.to_bytes(9, "little", signed=True) for key in keys for k in key)
    return hashlib.blake2b(packed, digest_size=16).digest()
