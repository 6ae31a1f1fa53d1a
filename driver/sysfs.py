"""Reading a sysfs tree under a configurable root (``/sys`` on a host, a fixture dir in tests).

A :class:`SysfsReader` is made per scan and memoises every read, so one scan reads each
file and resolves each link at most once, and a file that changes mid-scan cannot give two
different answers to two parts of the same scan. All paths are relative to the root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
"""An extended PCI bus address (``dddd:bb:dd.f``), as sysfs spells it."""

PCIE_ROOT_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
"""A PCI host bridge directory name (``pci0000:00``), the standard ``pcieRoot`` value."""


@dataclass
class SysfsReader:
    """Memoising reader of one sysfs tree; create a new one for each scan."""

    root: str = "/sys"
    _files: dict[str, str | None] = field(default_factory=dict, repr=False)
    _links: dict[str, str | None] = field(default_factory=dict, repr=False)
    _dirs: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.root = os.path.realpath(self.root)

    def path(self, rel: str) -> str:
        """The absolute path of ``rel`` under the root."""
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> str | None:
        """The stripped content of a file, or None when missing or unreadable (e.g. ``speed`` of a down link)."""
        if rel in self._files:
            return self._files[rel]
        try:
            with open(self.path(rel), "rb") as f:
                value: str | None = f.read().decode("utf-8", "replace").strip()
        except OSError:
            value = None
        self._files[rel] = value
        return value

    def read_int(self, rel: str, base: int = 10) -> int | None:
        """A file parsed as an integer (``base`` 16 accepts a ``0x`` prefix), or None."""
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def listdir(self, rel: str) -> list[str]:
        """Sorted entries of a directory, empty when missing."""
        if rel not in self._dirs:
            try:
                self._dirs[rel] = sorted(os.listdir(self.path(rel)))
            except OSError:
                self._dirs[rel] = []
        return self._dirs[rel]

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` exists (following links)."""
        return os.path.exists(self.path(rel))

    def resolve(self, rel: str) -> str | None:
        """The real path of ``rel`` relative to the root (links followed), or None when missing."""
        if rel in self._links:
            return self._links[rel]
        full = self.path(rel)
        result: str | None = None
        if os.path.lexists(full):
            real = os.path.realpath(full)
            if real == self.root or real.startswith(self.root + os.sep):
                result = os.path.relpath(real, self.root)
        self._links[rel] = result
        return result

    def link_name(self, rel: str) -> str | None:
        """The last component of a symlink's target (e.g. the driver name of ``.../driver``)."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except OSError:
            return None


def pci_address_of(real_path: str) -> str | None:
    """The nearest PCI function (BDF) in a resolved ``devices/...`` path, or None when not PCI."""
    for part in reversed(real_path.split("/")):
        if BDF_RE.match(part):
            return part
    return None


def pcie_root_of(real_path: str) -> str | None:
    """The host bridge (``pci<domain>:<bus>``) of a resolved PCI device path.

    The kernel layout puts it right under ``devices/``; on Hyper-V guests it sits deeper
    (under the VMBus device), so take the first component that looks like a host bridge.
    """
    for part in real_path.split("/"):
        if PCIE_ROOT_RE.match(part):
            return part
    return None
