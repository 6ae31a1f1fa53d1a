"""Why the driver state cannot be used or saved: the errors every layer of the checkpoint raises."""

from __future__ import annotations

import errno
from pathlib import Path


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be used (unreadable, or written by a newer driver)."""


class CheckpointWriteError(CheckpointError):
    """A state file could not be saved; the previous file is intact and the change was not applied.

    The message names the file and the errno, e.g. ``cannot save state to
    /var/lib/dranet/checkpoint.json: No space left on device (ENOSPC)``: it is returned to the kubelet
    (or the runtime) as the error of every call that needed the write.
    """

    def __init__(self, path: Path, error: OSError, replaced: bool = False) -> None:
        self.path = path
        self.errno = error.errno
        self.replaced = replaced  # the file holds the new state, its durability is unknown
        name = errno.errorcode.get(error.errno or 0, "unknown errno")
        reason = error.strerror or str(error)
        kept = "the new state is in the file, not known to be durable" if replaced else "the previous state is kept"
        super().__init__(f"cannot save state to {path}: {reason} ({name}); {kept}")
