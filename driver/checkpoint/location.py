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
writes it: so a start uses it while its files were written during this boot, and retires it
(renamed ``<file>.before-boot-<UTC time>``, kept) once they are older than the boot, when the
claims they describe are the rebuilt ones.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RAN_MARKER = "ran-here"
"""The file in the driver's kubelet plugin directory (on disk): a driver has started on this node."""

CLAIM_FILES = ("checkpoint.json", "checkpoint.journal")
"""The files that hold prepared claims (the store's snapshot and journal)."""


@dataclass(frozen=True)
class StateLocation:
    directory: str  # where the claims are read and written
    retired: tuple[str, ...] = ()  # legacy files renamed aside (they predate this boot)
    legacy_in_use: bool = False


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


def choose_state_dir(state_dir: str, legacy_dir: str, booted: float) -> StateLocation:
    """``legacy_dir`` while its claim files were written since ``booted``; else ``state_dir``,
    with any older legacy claim files renamed aside."""
    if not legacy_dir or os.path.abspath(legacy_dir) == os.path.abspath(state_dir):
        return StateLocation(state_dir)
    found: list[tuple[Path, float]] = []
    for name in CLAIM_FILES:
        path = Path(legacy_dir, name)
        try:
            found.append((path, path.lstat().st_mtime))
        except FileNotFoundError:
            continue
    if not found:
        return StateLocation(state_dir)
    if any(mtime >= booted for _, mtime in found):
        return StateLocation(legacy_dir, legacy_in_use=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    retired = []
    for path, _ in found:
        aside = path.with_name(f"{path.name}.before-boot-{stamp}")
        os.replace(path, aside)
        retired.append(str(aside))
    return StateLocation(state_dir, retired=tuple(retired))


def resolve(state_dir: str, legacy_dir: str, proc_root: str = "/proc") -> str:
    """The directory for the claims, logged with the reason when it is not ``state_dir``."""
    where = choose_state_dir(state_dir, legacy_dir, boot_time(proc_root))
    if where.legacy_in_use:
        log.warning(
            "prepared claims stay in the older drivers' directory until the node reboots",
            extra={"kv": {"state_dir": where.directory, "configured": state_dir}},
        )
    elif where.retired:
        log.info(
            "claims saved on disk before this boot retired: the API server's are recorded instead",
            extra={"kv": {"retired": list(where.retired), "state_dir": state_dir}},
        )
    return where.directory
