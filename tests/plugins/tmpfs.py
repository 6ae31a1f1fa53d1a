"""Small real tmpfs mounts for tests that need a full (or nearly full) filesystem.

Every mount is made on a fresh directory under the test's tmp_path and unmounted at fixture
teardown, also when the test fails (lazily if something still holds it open).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class TmpfsFactory:
    """Mounts small tmpfs filesystems and unmounts them all on :meth:`cleanup`."""

    base: Path
    mounts: list[Path] = field(default_factory=list)

    def mount(self, where: str | Path, size: str = "256k") -> Path:
        """A new tmpfs of ``size`` (``mount -o size=``) at ``<base>/<where>``, or at ``where``
        itself when it is a path (created; it must not exist yet)."""
        target = where if isinstance(where, Path) else self.base / where
        target.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(target)], check=True)
        self.mounts.append(target)
        return target

    def cleanup(self) -> None:
        """Unmount everything this factory mounted (lazily when busy)."""
        for target in reversed(self.mounts):
            if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(target)], capture_output=True)
        self.mounts.clear()


def fill(directory: Path, leave: int = 0, name: str = "filler") -> Path:
    """Fill the filesystem of ``directory`` with one file until it is full, then shrink that file
    by ``leave`` bytes. tmpfs counts whole pages: ``leave=0`` leaves no free page at all, and any
    write that needs a new page fails with ENOSPC. Returns the filler (delete it to free space)."""
    path = directory / name
    chunk = b"\0" * 4096
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    break
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return path


@pytest.fixture
def tmpfs_factory(tmp_path: Path) -> Iterator[TmpfsFactory]:
    """A :class:`TmpfsFactory`; skips the test when not root (mount needs CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount tmpfs")
    factory = TmpfsFactory(tmp_path / "mnt")
    try:
        yield factory
    finally:
        factory.cleanup()
