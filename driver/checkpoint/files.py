"""Checked, durable file writes for the state files, and the repairs a crash or a bad disk calls for.

A state file is replaced atomically (write a temporary file in full, fsync it, rename it over the
old one, fsync the directory), so a driver killed at any instant leaves the old or the new file,
never a torn one. Every system call goes through :class:`FileOps`, the seam tests use to inject
the faults a real disk gives rarely. Also here: removing the temporary file an interrupted write
left, and moving a corrupt file aside (kept for a human, never deleted).
"""

from __future__ import annotations

import errno
import logging
import os
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


def _tmp_path(path: Path) -> Path:
    return path.with_suffix(".tmp")


def remove_leftover(path: Path) -> None:
    """Remove the temporary file of a write that was interrupted (kill -9, power loss)."""
    tmp = _tmp_path(path)
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


def atomic_write(path: Path, data: bytes, ops: FileOps) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, never a mix.

    Every byte is written (a short write on a nearly full disk is continued, and fails with
    ENOSPC when nothing more fits), the file and then its directory are fsynced, and only a
    complete temporary file is renamed over the old one. On a failure before the rename the
    temporary file is removed and the old file is untouched; the ``OSError`` propagates. A
    failure after it (the directory's fsync) raises :class:`ReplacedNotSynced`: the file already
    holds ``data``.
    """
    tmp = _tmp_path(path)
    renamed = False
    try:
        fd = ops.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
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
        ops.replace(str(tmp), str(path))
        renamed = True
        dir_fd = ops.open(str(path.parent), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
        try:
            ops.fsync(dir_fd)
        finally:
            ops.close(dir_fd)
    except OSError as exc:
        if renamed:
            raise ReplacedNotSynced(exc.errno, exc.strerror) from exc
        try:
            ops.unlink(str(tmp))
        except OSError:
            pass  # never created, or the disk is gone: the start-up cleanup retries
        raise
