"""The device metadata files of unprepared claims: removed after the kubelet's answer, and strays swept.

NodeUnprepareResources answers once the claim is durably forgotten and its NICs are home or known
lost; the claim's metadata file and CDI specs play no part in that (no container of the claim is
left, the kubelet created none since it asked to unprepare), so they are not removed on the
kubelet's call. :class:`LeavingClaims` keeps each unprepared claim until its files go, which is:

- at the next check of the files (every few seconds, :meth:`DeviceMetadataWriter.remove_leaving`);
- or at once, before files are written for a claim of the same namespace and name (a claim
  deleted and made again, or the same claim prepared again for a later pod): the metadata
  directory is named by the claim, not its UID, so a late removal must never take a newer file.

A crash between the claim's forgetting and its files' removal leaves files no claim owns; so does
a driver that stopped between a prepare's files and its commit. :func:`strays` finds them: claim
directories and CDI specs of ours that no stored or leaving claim owns, unchanged for
:data:`STRAY_AFTER` seconds (a prepare writes its files a few milliseconds before its commit, and
another instance of the driver may be in the middle of one).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

from driver.checkpoint.state import PreparedClaim
from driver.claims.metadata_document import METADATA_SUBDIR, MetadataPaths

STRAY_AFTER = 300.0
"""Seconds a file or claim directory no claim owns is left alone before it is swept."""


class LeavingClaims:
    """Unprepared claims whose files are still on the node (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, PreparedClaim] = {}  # claim UID -> the claim as it was unprepared

    def add(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.uid] = claim

    def take(self) -> list[PreparedClaim]:
        """Every leaving claim, no longer kept here (the caller removes their files)."""
        with self._lock:
            taken, self._claims = list(self._claims.values()), {}
        return taken

    def take_named(self, namespace: str, name: str) -> list[PreparedClaim]:
        """The leaving claims of this namespace and name (whatever their UID), no longer kept here."""
        with self._lock:
            if not self._claims:
                return []
            taken = [c for c in self._claims.values() if c.namespace == namespace and c.name == name]
            for claim in taken:
                del self._claims[claim.uid]
        return taken

    def claims(self) -> list[PreparedClaim]:
        with self._lock:
            return list(self._claims.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._claims)


def strays(paths: MetadataPaths, owners: Iterable[PreparedClaim], now: float) -> list[Path]:
    """Our claim directories and CDI specs that none of ``owners`` (the stored and leaving claims)
    owns and that have not changed for :data:`STRAY_AFTER` seconds at ``now`` (wall clock)."""
    dirs, uids = set(), set()
    for claim in owners:
        dirs.add(paths.claim_dir(claim.namespace, claim.name).name)
        uids.add(claim.uid)
    found: list[Path] = []
    root = Path(paths.directory, METADATA_SUBDIR)
    prefix = f"{paths.driver_name}_metadata_"
    for folder, keep in ((root, lambda n: n in dirs), (Path(paths.cdi_dir), lambda n: _spec_owned(n, prefix, uids))):
        try:
            entries = list(os.scandir(folder))
        except OSError:  # no such directory yet: nothing of ours there
            continue
        for entry in entries:
            if folder is not root and not entry.name.startswith(prefix):
                continue  # another driver's CDI spec
            if keep(entry.name):
                continue
            try:
                changed = entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if now - changed >= STRAY_AFTER:
                found.append(Path(entry.path))
    return found


def _spec_owned(name: str, prefix: str, uids: set[str]) -> bool:
    """Whether the CDI spec ``name`` (``<driver>_metadata_<claim uid>_<request>.json``) is one of ``uids``'s.
    A UID has no underscore (a UUID), so it ends at the first one after the prefix."""
    return name[len(prefix) :].split("_", 1)[0] in uids
