"""Where the prepared claims live: tmpfs by default, the older drivers' disk directory while it
still describes this boot.

A prepared claim describes kernel objects (NICs moved into pod namespaces, sub-interfaces, RDMA
devices) that a reboot destroys or returns, so its record must outlive a driver crash, not a
reboot: tmpfs (``/run/dranet/claims``) has exactly that lifetime, and a sync there costs nothing.
After a reboot the kubelet (1.37) prepares each claim again as it restarts the claim's pods: a
claim it reads back from its own checkpoint is not marked prepared. The driver does not depend on
that (a kubelet that keeps running while the tmpfs is emptied prepares nothing): finding its
claims directory new (no lock file) on a node where a driver ran before (a marker on disk, in its
kubelet plugin directory), the daemon records every claim the API server allocates to this node
and reserves for a pod before it serves (:mod:`driver.claims.recovery`), with the NICs as this
boot names them; the kubelet's prepares are then answered from them.

Drivers before this one kept the claims on disk (``/var/lib/dranet``). Updated in place, the
node's running pods are in that directory, and the older instance of a rolling update still
writes it: so a start uses it only while it is the directory every driver of this boot used.
That is decided from facts a ``touch`` or a ``cp`` without ``-p`` in it cannot fake:

1. The tmpfs claims directory has files of its own (a snapshot, a journal, the store's lock): a
   driver of this version chose it during this boot (a reboot empties it), so it wins, always;
   legacy files found beside it are stale copies and are retired.
2. Else the legacy directory is in use only if a driver started on this node during this boot (its
   node lease files in the runtime directory, tmpfs too, changed since the boot: every driver
   since rolling updates with surge writes them at start) and its claim files were written since
   the boot. At the first start after a reboot nothing has run yet, so files touched or copied
   there since are retired too.

Retired files are renamed ``<file>.before-boot-<UTC time>`` and kept; the claims they described
are recorded from the API server instead.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from driver.checkpoint.store import CheckpointStore
from driver.config import default

log = logging.getLogger(__name__)

RAN_MARKER = "ran-here"
"""The file in the driver's kubelet plugin directory (on disk): a driver has started on this node."""

CLAIM_FILES = ("checkpoint.json", "checkpoint.journal")
"""The files that hold prepared claims (the store's snapshot and journal)."""

OWN_STATE_FILES = (*CLAIM_FILES, CheckpointStore.LOCK_FILENAME)
"""What a store leaves in its directory from its first start on: the tmpfs directory has state of its own."""

DRIVER_STARTED_FILES = ("lease.lock", "instances.seq")
"""The node lease's files in the runtime directory (:mod:`driver.node_lease`, which this package
may not import): a driver opens the first and rewrites the second at every start."""


@dataclass(frozen=True)
class StateLocation:
    directory: str  # where the claims are read and written
    retired: tuple[str, ...] = ()  # legacy files renamed aside (they do not describe this boot)
    legacy_in_use: bool = False
    why: str = ""  # why the legacy files were retired or used (logged)


def boot_time(proc_root: str = "/proc") -> float:
    """The time this kernel booted (``btime`` in ``/proc/stat``, seconds since the epoch)."""
    with open(os.path.join(proc_root, "stat"), encoding="ascii") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    raise ValueError(f"no btime in {proc_root}/stat")


def ran_before(marker: Path) -> bool:
    """Whether a driver started on this node before: ``marker`` (on disk, created now if missing)."""
    if marker.exists():
        return True
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("a dranet driver has run on this node: empty claims at start mean a reboot\n")
    return False


def _mtimes(directory: str, names: tuple[str, ...]) -> list[tuple[Path, float]]:
    """(path, mtime) of each of ``names`` present in ``directory``."""
    found = []
    for name in names:
        path = Path(directory, name)
        try:
            found.append((path, path.lstat().st_mtime))
        except FileNotFoundError:
            continue
    return found


def choose_state_dir(state_dir: str, legacy_dir: str, booted: float, runtime_dir: str) -> StateLocation:
    """``legacy_dir`` while it is the claims directory of every driver of this boot (see the module
    docstring); else ``state_dir``, with any legacy claim files renamed aside."""
    if not legacy_dir or os.path.abspath(legacy_dir) == os.path.abspath(state_dir):
        return StateLocation(state_dir)
    found = _mtimes(legacy_dir, CLAIM_FILES)
    if not found:
        return StateLocation(state_dir)
    if _mtimes(state_dir, OWN_STATE_FILES):
        return _retire(state_dir, found, f"{state_dir} has claims of its own, written during this boot")
    if not any(mtime >= booted for _, mtime in _mtimes(runtime_dir, DRIVER_STARTED_FILES)):
        return _retire(state_dir, found, f"no driver started during this boot ({runtime_dir} has no lease of it)")
    if not any(mtime >= booted for _, mtime in found):
        return _retire(state_dir, found, "written before this boot")
    return StateLocation(legacy_dir, legacy_in_use=True, why="an older driver wrote them during this boot")


def _retire(state_dir: str, found: list[tuple[Path, float]], why: str) -> StateLocation:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    retired = []
    for path, _ in found:
        aside = path.with_name(f"{path.name}.before-boot-{stamp}")
        os.replace(path, aside)
        retired.append(str(aside))
    return StateLocation(state_dir, retired=tuple(retired), why=why)


def resolve(state_dir: str, legacy_dir: str, proc_root: str = "/proc", runtime_dir: str | None = None) -> str:
    """The directory for the claims, logged with the reason when it is not ``state_dir``
    (``runtime_dir``: the driver's, default ``--runtime-dir``'s)."""
    runtime = runtime_dir if runtime_dir is not None else str(default("runtime_dir"))
    where = choose_state_dir(state_dir, legacy_dir, boot_time(proc_root), runtime)
    if where.legacy_in_use:
        log.warning(
            "prepared claims stay in the older drivers' directory until the node reboots",
            extra={"kv": {"state_dir": where.directory, "configured": state_dir, "why": where.why}},
        )
    elif where.retired:
        log.info(
            "older drivers' claims on disk retired: the API server's are recorded instead",
            extra={"kv": {"retired": list(where.retired), "state_dir": state_dir, "why": where.why}},
        )
    return where.directory
