"""Two driver instances on one node for a moment: which one acts, and how the other takes over.

A DaemonSet rolling update with surge starts the new driver pod while the old one still runs
(the kubelet >= 1.33 talks to both: per-instance socket names, see ``DriverConfig``). Both serve
the kubelet's NodePrepare/NodeUnprepare calls (the checkpoint is coherent across processes) and
both are connected to the container runtime's NRI socket, which calls every plugin for every
event. Only ONE may move NICs, add devices to containers and write ResourceSlices: the instance
holding the node lease, an exclusive ``flock`` on ``<runtime dir>/lease.lock``.

* The first instance takes the lease at start; a second one finds it held and waits (standby),
  polling every :data:`POLL_INTERVAL` seconds and trying again at each NRI event.
* The holder gives it up only when it stops (after its kubelet sockets are gone), writing a
  handover record (``handover.json``: who, and the key of the last NRI event it handled) first.
  The runtime calls the plugins one after the other for each event, so the taker may still
  receive the very event the giver handled last: it skips that one (never a second move, never
  two adjustments of one container, which the runtime would refuse as a conflict).
* A holder that dies (kill -9, OOM) releases the flock with its last file descriptor: the
  standby takes over; the event in flight failed in the runtime and is retried by the kubelet.

The probe port: with ``hostNetwork`` both instances want the same ``/healthz`` port. The port
belongs to the newest instance: a starting instance that finds it taken drops a request file
(``probe-port-<port>.request``); the older instance closes its listener when it sees a request
from an instance newer than itself, and the new one binds. Probes of either pod then reach the
newest instance. "Newer" is never decided by a clock (a step of the wall clock would make the old
instance keep the port, or a stale request make a new one give it away): each instance takes a
generation number at start, one more than the last one taken on this node (a counter in
``instances.seq``, under ``flock``), and a request carries its sender's.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.2
"""Seconds between a standby instance's attempts to take the lease (and port-request checks)."""
LEASE_FILE = "lease.lock"
HANDOVER_FILE = "handover.json"
GENERATION_FILE = "instances.seq"


@dataclass(frozen=True)
class Handover:
    """What the giving instance wrote before releasing the lease."""

    by: str  # instance id of the giver
    last_event: str  # key of the last NRI event it handled ("" if none)
    at: float  # time.time() of the release (shown, never compared)


def next_generation(directory: Path) -> int:
    """One more than the last generation taken in ``directory`` (which keeps it): the order in which
    instances started on this node, whatever the clocks say."""
    fd = os.open(directory / GENERATION_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 32, 0)
        try:
            last = int(raw.decode().strip() or 0)
        except (UnicodeDecodeError, ValueError):
            log.warning("instance counter unreadable: starting it again", extra={"kv": {"content": raw[:32].hex()}})
            last = 0
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(last + 1).encode(), 0)
        return last + 1
    finally:
        os.close(fd)  # releases the flock


class NodeLease:
    """This instance's view of the node lease (one per daemon; thread-safe)."""

    def __init__(self, runtime_dir: str | os.PathLike[str], instance_id: str) -> None:
        self.dir = Path(runtime_dir)
        self.instance_id = instance_id or f"pid-{os.getpid()}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.generation = next_generation(self.dir)
        self._fd = os.open(self.dir / LEASE_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._mutex = threading.Lock()
        self.held = False
        self.retired = False  # released for good: this instance never takes it again

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it (non-blocking); True while we hold it."""
        with self._mutex:
            if self.held or self.retired:
                return self.held
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self.held = True
        log.info("node lease taken: this instance acts", extra={"kv": {"instance": self.instance_id}})
        return True

    def handover(self) -> Handover | None:
        """The record of the last release, if any."""
        try:
            data = json.loads((self.dir / HANDOVER_FILE).read_text())
            return Handover(str(data["by"]), str(data.get("last_event", "")), float(data.get("at", 0.0)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def release(self, last_event: str = "") -> None:
        """Give the lease up for good (at stop), recording the last event handled first."""
        with self._mutex:
            if self.retired:
                return
            self.retired = True
            if not self.held:
                return
            record = asdict(Handover(self.instance_id, last_event, time.time()))
            tmp = self.dir / (HANDOVER_FILE + ".tmp")
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.dir / HANDOVER_FILE)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False
        log.info("node lease released", extra={"kv": {"instance": self.instance_id, "last_event": last_event}})

    def close(self) -> None:
        """Close the lease file (releases the lease if still held)."""
        with self._mutex:
            self.held = False
            self.retired = True
            with contextlib.suppress(OSError):
                os.close(self._fd)

    # -- the probe port ---------------------------------------------------------------------

    def _port_request(self, port: int) -> Path:
        return self.dir / f"probe-port-{port}.request"

    def request_port(self, port: int) -> None:
        """Ask the instance serving ``port`` to give it to us."""
        path = self._port_request(port)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"by": self.instance_id, "generation": self.generation}))
        os.replace(tmp, path)

    def port_requested(self, port: int) -> str | None:
        """The id of a newer instance asking for ``port`` (None: nobody, or only older instances)."""
        try:
            data: dict[str, Any] = json.loads(self._port_request(port).read_text())
            by, generation = str(data.get("by", "")), data.get("generation")
        except (OSError, ValueError, AttributeError):
            return None
        if by == self.instance_id or not isinstance(generation, int) or generation <= self.generation:
            return None
        return by

    def port_taken(self, port: int) -> None:
        """We bound ``port``: our request (if any) is answered."""
        path = self._port_request(port)
        try:
            if json.loads(path.read_text()).get("by") == self.instance_id:
                path.unlink()
        except (OSError, ValueError):
            pass
