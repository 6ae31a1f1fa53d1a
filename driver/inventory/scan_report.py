"""What a discovery scan had to leave out, and the warnings that tell the admin.

One bad device must never hide the others: a device whose name, links or files make no sense
is skipped (:meth:`ScanReport.skip`), every other device is still published. Each skipped
device gets one warning naming it (non-UTF-8 names by their bytes), and each published device
with files that exist but could not be read (EACCES, EIO, a FIFO or a directory where a file
belongs) one warning listing them. The same problem seen again by the next scans (every link
event, every resync) is logged at debug level only; a problem that went away and comes back is
warned about again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_ANCHOR_DEPTH = {"bus": 4, "class": 3}
"""Path components naming one sysfs object: ``bus/pci/devices/<BDF>``, ``class/<cls>/<name>``."""


def anchor_of(rel: str) -> str:
    """The sysfs object a relative path belongs to (``bus/pci/devices/0000:17:00.0``)."""
    parts = rel.split("/")
    depth = _ANCHOR_DEPTH.get(parts[0], len(parts) - 1)
    return "/".join(parts[:depth]) or rel


@dataclass
class ScanReport:
    """Per scan: devices skipped (by label) and the PCI functions they take with them."""

    skipped: dict[str, str] = field(default_factory=dict)  # device label -> reason
    skipped_pci: set[str] = field(default_factory=set)

    def skip(self, what: str, reason: str, pci: str | None = None) -> None:
        """Leave ``what`` (e.g. ``netdev b'bad\\xff'``) out of this scan; ``pci``: its function too."""
        self.skipped.setdefault(what, reason)
        if pci:
            self.skipped_pci.add(pci)


class ScanWarnings:
    """Turns each scan's report into warnings, once per distinct problem (kept across scans)."""

    def __init__(self) -> None:
        self._last: set[str] = set()

    def emit(self, report: ScanReport, problems: dict[str, str]) -> None:
        """Log the skipped devices and, per sysfs object, the files that could not be read."""
        current: set[str] = set()
        for what, reason in sorted(report.skipped.items()):
            key = f"skip {what}: {reason}"
            current.add(key)
            self._log(key, "device skipped, every other device is still published", {"device": what, "reason": reason})
        by_anchor: dict[str, dict[str, str]] = {}
        for rel, reason in problems.items():
            by_anchor.setdefault(anchor_of(rel), {})[rel] = reason
        for anchor, files in sorted(by_anchor.items()):
            key = f"unreadable {anchor}: {sorted(files.items())}"
            current.add(key)
            self._log(
                key, "sysfs files unreadable: what they hold is not published", {"object": anchor, "files": files}
            )
        self._last = current

    def _log(self, key: str, message: str, kv: dict[str, object]) -> None:
        level = logging.DEBUG if key in self._last else logging.WARNING
        log.log(level, message, extra={"kv": kv})
