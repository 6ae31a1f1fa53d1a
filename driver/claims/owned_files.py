"""The files the driver owns, kept as written: each checked against what it should hold, mended.

A file the driver owns (a claim's metadata file and CDI spec) is written whole, never half: a
temporary file renamed over the old one, readable by any user (compact JSON on tmpfs, without a
sync). :class:`OwnedFiles` remembers each file's stamp as last written or found right, so a check
costs a stat while nothing touched it; a file missing, unreadable, cut short, unparsable or
different is written again and counted (:class:`Mend`, by the words of :data:`MISSING` and its
kin: the log's, the metric's and the Node event's).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

METADATA, CDI = "metadata", "cdi"
"""The kinds of files the driver owns per request: the metadata file, the CDI spec that mounts it."""
MISSING, UNREADABLE, TRUNCATED, UNPARSABLE, DIFFERS = "missing", "unreadable", "truncated", "unparsable", "differs"
"""What was wrong with an owned file written again (the log's, the metric's and the event's words)."""

_Stamp = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode) of a file as the driver last wrote or checked it: any write,
truncation or replacement since changes one of them."""


@dataclass(frozen=True)
class Mend:
    """One owned file written again: which, what was wrong, whose."""

    kind: str  # METADATA or CDI
    reason: str  # MISSING, UNREADABLE, TRUNCATED, UNPARSABLE, DIFFERS
    path: str
    claim: str  # namespace/name


def _write_atomic(path: Path, data: bytes) -> _Stamp:
    """``data`` at ``path``, never half-written (readable 0644: the container reads it as any user);
    returns the file's stamp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), 0o644)
    os.replace(tmp, path)
    return _stamp(os.stat(path))  # after the rename, which changes the file's ctime


def _stamp(st: os.stat_result) -> _Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _read(path: Path) -> tuple[bytes, _Stamp]:
    """The file's bytes and stamp, from one open (a rename in between cannot mix two files)."""
    with open(path, "rb") as f:
        return f.read(), _stamp(os.fstat(f.fileno()))


def cdi_parses(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except (ValueError, RecursionError):
        return False


def _damage(data: bytes, expected: bytes, parses: bool) -> str:
    """What is wrong with an owned file holding ``data`` where ``expected`` belongs."""
    if expected.startswith(data):
        return TRUNCATED  # empty, or cut short (a write that never finished)
    return DIFFERS if parses else UNPARSABLE


class OwnedFiles:
    """Each owned file as last written or found right, and the files written again (the metric's
    counts, and those not reported yet). The caller serializes writes of one file."""

    def __init__(self) -> None:
        self._written: dict[Path, _Stamp] = {}  # each owned file as last written or found right
        self._mends_lock = threading.Lock()
        self._mends: list[Mend] = []  # not reported yet (the daemon's Node event)
        self.mended: dict[tuple[str, str], int] = {}  # (kind, reason) -> files written again (the metric)

    def put(self, path: Path, data: bytes) -> None:
        """``data`` at ``path``, whole."""
        self._written[path] = _write_atomic(path, data)

    def forget(self, path: Path) -> None:
        """``path`` is no longer ours (its claim was unprepared)."""
        self._written.pop(path, None)

    def unchanged(self, paths: Iterable[Path]) -> bool:
        """Whether each file is the one last written or checked (same size, times and inode)."""
        for path in paths:
            known = self._written.get(path)
            if known is None:
                return False
            try:
                if _stamp(os.stat(path)) != known:
                    return False
            except OSError:
                return False
        return True

    def check(
        self,
        kind: str,
        path: Path,
        expected: bytes,
        claim: str,
        parses: Callable[[bytes], bool],
        accept: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``path`` holds ``expected`` (or what ``accept`` takes), else it is written again, with the
        reason (``parses``: whether bytes are a file of its kind at all); ``claim``: whose (namespace/name)."""
        try:
            data, stamp = _read(path)
        except FileNotFoundError:
            reason = MISSING
        except OSError:
            reason = UNREADABLE
        else:
            if data == expected or (accept is not None and accept(data)):
                self._written[path] = stamp
                return
            reason = _damage(data, expected, parses(data))
        self.put(path, expected)
        self._mended(Mend(kind, reason, str(path), claim))

    def _mended(self, mend: Mend) -> None:
        log.warning(
            "owned file written again",
            extra={"kv": {"file": mend.path, "kind": mend.kind, "reason": mend.reason, "claim": mend.claim}},
        )
        with self._mends_lock:
            self.mended[(mend.kind, mend.reason)] = self.mended.get((mend.kind, mend.reason), 0) + 1
            self._mends.append(mend)

    def mend_counts(self) -> dict[tuple[str, str], int]:
        """(kind, reason) -> files written again since start (the metric, read at scrape)."""
        with self._mends_lock:
            return dict(self.mended)

    def take_mends(self) -> list[Mend]:
        """The files written again since the last call (for the daemon's Node event)."""
        with self._mends_lock:
            out, self._mends = self._mends, []
        return out
