"""Checked, durable file writes for the state files, and the repairs a crash or a bad disk calls for.

A state file is replaced atomically (write a temporary file in full, fsync it, rename it over the
old one, fsync the directory), so a driver killed at any instant leaves the old or the new file,
never a torn one. The steps are also given apart (:func:`write_synced`, :func:`rename_into_place`,
:func:`sync_directory`), so the claims file's compaction can write and sync its temporary file
without holding the store's locks. Every system call goes through :class:`FileOps`, the seam
tests use to inject the faults a real disk gives rarely. Also here: removing the temporary file an interrupted write
left, and moving a corrupt file aside (kept for a human, never deleted).

Nothing in the state directories is trusted to be what its name says: a state file is read only
if it is a regular file (never through a symlink, never blocking on a FIFO) and at most
:data:`MAX_STATE_BYTES` long (:func:`read_state`); the temporary file is created afresh
(``O_EXCL``, never through a symlink) after a stale one is removed, so a link planted under its
name is never written through.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileOps:
    """The system calls a state write makes. The default is the real thing; tests pass a
    replacement to inject the faults a real disk gives rarely (EIO) or to count the steps."""

    open: Callable[[str, int, int], int] = os.open
    write: Callable[[int, bytes | memoryview], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    close: Callable[[int], None] = os.close
    replace: Callable[[str, str], None] = os.replace
    unlink: Callable[[str], None] = os.unlink
    # The journal's (driver.checkpoint.journal): records written at an offset, one data sync each.
    pwrite: Callable[[int, bytes | memoryview, int], int] = os.pwrite
    fdatasync: Callable[[int], None] = os.fdatasync
    ftruncate: Callable[[int, int], None] = os.ftruncate


MAX_STATE_BYTES = 128 << 20
"""Largest state file read (a node's claims take a few megabytes): a bigger one is not ours."""
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotAStateFile(Exception):
    """The path holds something a state file never is (a symlink, a FIFO, a device, an oversized
    file): moved aside like a corrupt file, never read through."""


def read_state(path: Path, limit: int = MAX_STATE_BYTES) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``path`` (at most ``limit``) and its ``fstat``. Raises
    ``FileNotFoundError``, :class:`NotAStateFile`, or the ``OSError`` of an unreadable file."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink
            raise NotAStateFile(f"{path} is a symbolic link, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(st.st_mode):
            raise NotAStateFile(f"{path} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > limit:
            raise NotAStateFile(f"{path} is {st.st_size} bytes, more than a state file can be ({limit})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while read
            raise NotAStateFile(f"{path} is more than {limit} bytes")
        return b"".join(chunks), st
    finally:
        os.close(fd)


def temporary_path(path: Path) -> Path:
    """Where :func:`atomic_write` writes ``path``'s next content before renaming it into place."""
    return path.with_suffix(".tmp")


def remove_leftover(tmp: Path) -> None:
    """Remove the temporary file ``tmp`` of a write that was interrupted (kill -9, power loss)."""
    try:
        tmp.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning(
            "cannot remove a leftover temporary state file", extra={"kv": {"path": str(tmp), "error": str(exc)}}
        )
        return
    log.info("removed the temporary file of an interrupted state write", extra={"kv": {"path": str(tmp)}})


def move_aside(path: Path) -> Path:
    """Rename a damaged ``path`` to ``<name>.corrupt-<UTC time>`` (``-2``, ``-3``... if taken) and
    return the new path; the ``OSError`` of a failed rename propagates."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while moved.exists():
        n += 1
        moved = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, moved)
    return moved


class ReplacedNotSynced(OSError):
    """The new file replaced the old one, but fsyncing the directory failed: the file holds the
    new bytes now, and whether the rename survives a power loss is unknown."""


def write_synced(tmp: Path, data: bytes, ops: FileOps) -> None:
    """Create ``tmp`` afresh holding ``data`` and fsync it: a complete file to rename into place.

    Every byte is written (a short write on a nearly full disk is continued, and fails with ENOSPC
    when nothing more fits). Whatever sat under the name (a write's leftover, a planted link) is
    removed first, and a link planted again in between makes the create fail. On a failure the
    file is removed and the ``OSError`` propagates.
    """
    try:
        try:
            ops.unlink(str(tmp))
        except OSError:
            pass  # none there (or a read-only disk: the create below says so)
        fd = ops.open(str(tmp), _CREATE_FLAGS, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = ops.write(fd, view)
                if written <= 0:  # no progress and no error: treat as a full disk, never spin
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
            ops.fsync(fd)
        finally:
            ops.close(fd)
    except OSError:
        discard(tmp, ops)
        raise


def discard(tmp: Path, ops: FileOps) -> None:
    """Remove a temporary file that will not be renamed into place (best effort)."""
    try:
        ops.unlink(str(tmp))
    except OSError:
        pass  # never created, or the disk is gone: the start-up cleanup retries


def rename_into_place(tmp: Path, path: Path, ops: FileOps) -> None:
    """Rename the complete ``tmp`` over ``path`` (not yet durable: see :func:`sync_directory`); on a
    failure ``tmp`` is removed, ``path`` is untouched and the ``OSError`` propagates."""
    try:
        ops.replace(str(tmp), str(path))
    except OSError:
        discard(tmp, ops)
        raise


def sync_directory(directory: Path, ops: FileOps) -> None:
    """fsync ``directory``: the renames and creations in it survive a power loss."""
    dir_fd = ops.open(str(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
    try:
        ops.fsync(dir_fd)
    finally:
        ops.close(dir_fd)


def atomic_write(path: Path, data: bytes, ops: FileOps) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, never a mix.

    The temporary file is written in full and fsynced (:func:`write_synced`), renamed over the old
    one, and the directory is fsynced. On a failure before the rename the temporary file is
    removed and the old file is untouched; the ``OSError`` propagates. A failure after it (the
    directory's fsync) raises :class:`ReplacedNotSynced`: the file already holds ``data``.
    """
    tmp = temporary_path(path)
    write_synced(tmp, data, ops)
    rename_into_place(tmp, path, ops)
    try:
        sync_directory(path.parent, ops)
    except OSError as exc:
        raise ReplacedNotSynced(exc.errno, exc.strerror) from exc
