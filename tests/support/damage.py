"""Ways a file the driver owns gets damaged on a node: the tests of its mending share them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def empty(path: Path) -> None:
    """Truncated to nothing (``> file``)."""
    path.write_bytes(b"")


def zero(path: Path) -> None:
    """Its bytes overwritten with zeros, its size kept (``dd if=/dev/zero conv=notrunc``)."""
    path.write_bytes(bytes(path.stat().st_size))


def half(path: Path) -> None:
    """Cut in the middle (a write that did not finish)."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE: dict[str, Callable[[Path], None]] = {
    "deleted": Path.unlink,
    "emptied": empty,
    "zeroed": zero,
    "half-written": half,
}
"""Each kind of damage, by the name the tests give it."""
