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

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.errno = error.errno
        name = errno.errorcode.get(error.errno or 0, "unknown errno")
        reason = error.strerror or str(error)
        super().__init__(f"cannot save state to {path}: {reason} ({name}); the previous state is kept")
