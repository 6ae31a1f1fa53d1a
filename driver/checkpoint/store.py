"""The store of the driver state: one in-memory copy, every change saved before it returns.

Everything the driver must remember across a restart lives in two JSON files, each replaced
atomically (:mod:`driver.checkpoint.files`), so a driver killed at any instant finds either the
old or the new state, never a torn one:

- ``<state dir>/checkpoint.json``: :class:`~driver.checkpoint.state.PreparedClaim` entries written
  by NodePrepareResources. On tmpfs (``/run/dranet/claims``): a claim describes kernel objects a
  reboot undoes, so it must outlive a driver restart, not a reboot, and a sync there is free; after
  a reboot the daemon records the node's claims from the API server before it serves
  (:mod:`driver.checkpoint.location`).
- ``<runtime dir>/pods.json``: :class:`~driver.checkpoint.state.PodNetState` entries the NRI hooks
  write *before* each netlink step (write-ahead), so a restarted driver knows which NICs may sit in
  which namespace and under which name. This belongs on tmpfs (``/run/dranet``): it survives driver
  restarts, and a reboot (which destroys every pod namespace and returns every NIC) clears it,
  which is exactly right. tmpfs also keeps a disk's fsync out of the RunPodSandbox budget
  (docs/performance.md, "Small costs the code's choices rest on").

An update writes only the file whose content changed; a prepare encodes only its new claims (group
commit: one write per batch). With journaling on (the daemon: while it holds the node lease) a
change of the claims is appended to ``checkpoint.journal`` (:mod:`driver.checkpoint.journal`: one
``fdatasync``, where replacing ``checkpoint.json`` takes two syncs and a rename), and
:meth:`CheckpointStore.compact` folds the journal into ``checkpoint.json`` off the kubelet's path.
An instance that does not journal (the standby of a rolling update, possibly an older driver that
reads only ``checkpoint.json``) writes the whole file, which also makes the journal stale.

A compaction holds the store's locks only to copy the claims (with the journal position they
reach) and, later, to rename its file into place: the new file is written and synced in between,
while prepares go on appending. Those records continue the journal's run, which the old and the
new ``checkpoint.json`` both read from where each stops, so they are kept whichever a crash
leaves; the records the new file holds are cut off the journal only once its rename is durable.

Two driver instances may share the files for a moment (a DaemonSet rolling update with surge: the
kubelet may prepare a claim in one and unprepare it in the other), so the store is coherent across
processes: every read first checks (one ``lstat`` per file) whether another process replaced a
file or appended to the journal and then reloads under the other's lock, and every update holds an
``flock`` on ``checkpoint.lock`` in the state directory around reload, change and write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from driver.checkpoint.errors import CheckpointError, CheckpointWriteError
from driver.checkpoint.files import (
    FileOps,
    NotAStateFile,
    ReplacedNotSynced,
    atomic_write,
    discard,
    move_aside,
    read_state,
    remove_leftover,
    rename_into_place,
    sync_directory,
    temporary_path,
    write_synced,
)
from driver.checkpoint.journal import Journal, Position, base_of
from driver.checkpoint.schema import COMPATIBLE_VERSION, data_version, encode, migrate
from driver.checkpoint.state import DriverState, PodNetState, PreparedClaim, pod_json, pod_version

log = logging.getLogger(__name__)

T = TypeVar("T")

_Stamp = tuple[int, int, int]
_UNSEEN: Any = object()  # never equal to a stamp: a file we have not looked at yet is "changed"


def _stamp_of(st: os.stat_result) -> _Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _stamp(path: Path) -> _Stamp | None:
    try:
        return _stamp_of(os.lstat(path))  # the name's own entry: a planted link is a change
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class _Fold:
    """A compaction's copy, taken under the store's locks: the snapshot it replaces, the position
    the claims reach (the journal's run ends at offset ``end`` there), and the new snapshot's bytes."""

    previous: bytes
    at: Position
    end: int
    data: bytes


@dataclass(frozen=True)
class QuarantinedFile:
    """A state file that could not be parsed at start, moved aside (never deleted) for a human."""

    path: Path
    moved_to: Path
    reason: str


JOURNAL_LIMIT = 8 << 20
"""Journal bytes beyond which a change rewrites ``checkpoint.json`` instead (compaction normally runs
long before: this bounds what a start has to replay)."""

_CORRUPT = (ValueError, AttributeError, KeyError, TypeError)
"""What parsing a damaged file raises (``json.JSONDecodeError`` is a ``ValueError``)."""


class CheckpointStore:
    """Owns the checkpoint files; every mutation is persisted before it returns.

    Use :meth:`update` for read-modify-write: it runs ``fn`` on the in-memory
    state under a lock and writes the changed part(s) atomically. Readers use
    :meth:`read`, which gives the function a consistent view. ``runtime_directory``
    holds the pod network state (default: ``directory``, e.g. in tests). ``journal``
    (a flag, or a function asked at each write) makes a change of the claims an append to
    :attr:`journal_path` instead of a new ``checkpoint.json``; the journal is read at load either way.

    At start a temporary file left by an interrupted write is removed, and a state file that
    cannot be parsed is moved aside (``<name>.corrupt-<UTC time>``, kept) and :attr:`quarantined`
    lists it, so the daemon can rebuild what it can instead of crash-looping. A file written by a
    newer driver is still refused (:class:`CheckpointError`): it is valid, only not ours to read.
    A failed write raises :class:`CheckpointWriteError` and leaves it in :attr:`write_errors` (one
    per file) until a write of that file succeeds (``/healthz`` reports each).
    """

    FILENAME = "checkpoint.json"
    JOURNAL_FILENAME = "checkpoint.journal"
    PODS_FILENAME = "pods.json"
    LOCK_FILENAME = "checkpoint.lock"
    FOLD_FILENAME = "checkpoint.fold.tmp"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        runtime_directory: str | os.PathLike[str] | None = None,
        *,
        ops: FileOps | None = None,
        journal: bool | Callable[[], bool] = False,
    ) -> None:
        self.directory = Path(directory)
        self.runtime_directory = Path(runtime_directory) if runtime_directory else self.directory
        self.path = self.directory / self.FILENAME
        self.journal_path = self.directory / self.JOURNAL_FILENAME
        self.pods_path = self.runtime_directory / self.PODS_FILENAME
        self.ops = ops or FileOps()
        self.journaling: Callable[[], bool] = journal if callable(journal) else (lambda: bool(journal))
        self.quarantined: list[QuarantinedFile] = []
        self.claims_suspect: str | None = None  # the journal's last record, whole but unreadable
        self._salvaged = False  # claims read past a damaged journal, not yet in a snapshot
        # The last failed write of each file still failing (a claim's journal append and the
        # compaction of the snapshot fail apart): /healthz names every one.
        self.write_errors: dict[Path, CheckpointWriteError] = {}
        self.write_failures: dict[str, int] = {}  # failed writes per file name (the metric)
        self._lock = threading.RLock()
        self._written: dict[Path, bytes] = {}  # last bytes written (or read) per file: what is on disk
        # (inode, mtime, size) of each file as last read or written by us (None: absent); a
        # different stamp means another driver instance replaced it (atomic rename: new inode).
        self._stamps: dict[Path, _Stamp | None] = {}
        self._lock_path = self.directory / self.LOCK_FILENAME
        self._fold_path = self.directory / self.FOLD_FILENAME  # a compaction's new snapshot, before its rename
        self._lock_fd = -1  # open while an update holds the cross-process lock
        self._lock_depth = 0  # update() may nest (RLock): only the outermost takes the flock
        # A prepare encodes only its new claims, not the whole node's state (docs/performance.md):
        # stored PreparedClaims are never mutated in place (prepare adds/removes whole claims).
        self._claims_json: _Encodings[PreparedClaim] = _Encodings(
            PreparedClaim.to_dict,
            lambda claim, _: max((d.needed_version for d in claim.devices), default=COMPATIBLE_VERSION),
        )
        # A hook's write encodes only the pod it changed (PodNetState is frozen).
        self._pods_json: _Encodings[PodNetState] = _Encodings(pod_json, lambda _, plain: pod_version(plain))
        self._journal = Journal(self.journal_path, self.ops)
        self._base = base_of(None)  # the snapshot on disk, as the journal's records name it
        # The claims as on disk (snapshot and journal), the very objects: what changed is found by identity.
        self._persisted: dict[str, PreparedClaim] = {}
        # The snapshot is not in this driver's form (an older version, pods from before the split)
        # or not known to be durable: the next change of the claims rewrites it whole.
        self._rewrite = False
        # A directory no store ever opened (its lock file stays): a node's first start, or the first
        # after a reboot emptied the tmpfs (or someone removed it).
        self.started_empty = not any(p.exists() for p in (self.path, self.journal_path, self._lock_path))
        with self._lock, self._cross_process():
            # Under the lock: a leftover temporary file is then never another instance's write.
            self._state = self._load(cleanup=True)
            self._save_salvaged()

    @contextlib.contextmanager
    def _cross_process(self) -> Iterator[None]:
        """Hold ``checkpoint.lock`` (re-entrant within this store): other driver instances wait."""
        self._lock_depth += 1
        try:
            if self._lock_depth == 1:
                self._take_lock()
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing releases the flock
                self._lock_fd = -1

    def _take_lock(self) -> None:
        """Open and flock ``checkpoint.lock``; a disk that refuses it is a failed write (reported,
        counted; :class:`CheckpointWriteError`), never a raw ``OSError``."""
        # Read-only is enough for flock: on a read-only disk the store still loads and reports
        # its failing writes.
        flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                self._lock_fd = os.open(self._lock_path, flags, 0o600)
            except FileNotFoundError:  # the directory itself is gone (it exists from the load on)
                self.directory.mkdir(parents=True, exist_ok=True)
                self._lock_fd = os.open(self._lock_path, flags, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self.write_errors.pop(self._lock_path, None)
        except OSError as exc:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            raise self._failed(self._lock_path, exc) from exc

    @property
    def claims_quarantined(self) -> bool:
        """Whether prepared claims may be missing: their file or journal was moved aside at load, or
        the journal's last record may have been acknowledged and cannot be read."""
        return bool(self.claims_suspect) or any(q.path in (self.path, self.journal_path) for q in self.quarantined)

    def _save_salvaged(self) -> None:
        """(locked) After the journal was moved aside for damage: the claims read from its valid
        records are on disk nowhere else, so a snapshot of them is written at once. A disk that
        refuses it leaves the failure in :attr:`write_errors` (``/healthz`` reports it) and the
        snapshot to be written whole by the next change."""
        if not self._salvaged:
            return
        self._salvaged = False
        self._rewrite = True
        try:
            self._write_snapshot()
        except CheckpointWriteError as exc:
            log.error("cannot save the claims read from the damaged journal", extra={"kv": {"error": str(exc)}})

    def _load(self, cleanup: bool = False) -> DriverState:
        claims, at = self._load_part(self.path, "claims", cleanup)
        pods, _ = self._load_part(self.pods_path, "pods", cleanup)
        if cleanup:
            self._remove_fold_leftover()
        snapshot = self._written[self.path]
        on_disk = self._stamps[self.path] is not None
        self._base = base_of(snapshot if on_disk else None)
        self._claims_json.clear()
        self._pods_json.clear()
        self._rewrite = on_disk and snapshot != self._encode_claims(claims.claims, at)
        self._replay_journal(claims.claims, at)
        self._persisted = dict(claims.claims)
        # A checkpoint from before the split holds the pods too; keep them.
        return DriverState(claims=claims.claims, pods={**claims.pods, **pods.pods})

    def _load_part(self, path: Path, part: str, cleanup: bool = False) -> tuple[DriverState, Position | None]:
        """One state file's content, and the journal position it names (None: it names none)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if cleanup:
            remove_leftover(temporary_path(path))
        try:
            # The stamp of the very inode we read (a rename after the read gives a new one).
            raw, st = read_state(path)
            stamp = _stamp_of(st)
        except NotAStateFile as exc:
            return self._quarantine(path, part, str(exc)), None
        except FileNotFoundError:
            # A missing file is an empty part: no need to write it until something goes in.
            self._written[path] = encode({part: {}})
            self._stamps[path] = None
            return DriverState(), None
        except OSError as exc:  # EIO, EACCES: not damaged, unreadable; never guess at state
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        self._stamps[path] = stamp
        try:
            data = migrate(json.loads(raw))
            state = DriverState.from_json(data)
            at = Position.from_json(data.get("journal"))
        except CheckpointError as exc:
            if not isinstance(data_version(raw), int):
                return self._quarantine(path, part, str(exc)), None
            raise  # a valid file of another version: kept, refused
        except (*_CORRUPT, RecursionError) as exc:
            return self._quarantine(path, part, f"{type(exc).__name__}: {exc}"), None
        self._written[path] = raw
        return state, at

    def _remove_fold_leftover(self) -> None:
        """Remove the temporary file of a compaction that was killed, unless another instance is
        compacting now (it holds the fold lock: the file is its new snapshot)."""
        with self._folding(wait=False) as free:
            if free:
                remove_leftover(self._fold_path)

    def _replay_journal(self, claims: dict[str, PreparedClaim], at: Position | None) -> None:
        """Apply the journal's records for the snapshot just read to its ``claims``. A journal that
        cannot be used (not a regular file, a whole record that does not decode) is moved aside
        like a corrupt file: the claims are then the snapshot's, and the daemon rebuilds the rest."""
        try:
            payloads = self._journal.load(self._base, at)
        except NotAStateFile as exc:
            self._quarantine_journal(str(exc))
            return
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.journal_path}: {exc}") from exc
        changed: list[tuple[dict[str, PreparedClaim], list[str]]] = []
        damage, suspect = self._journal.damage, self._journal.suspect
        for payload in payloads:
            try:
                record = json.loads(payload)
                put = DriverState.from_json(migrate({"version": record["version"], "claims": record["put"]}))
                changed.append((put.claims, [str(uid) for uid in record["delete"]]))
            except CheckpointError:
                if not isinstance(data_version(payload), int):
                    self._quarantine_journal("a record without a version")
                    return
                raise  # a newer driver's record: kept, refused
            except (*_CORRUPT, RecursionError) as exc:
                self._quarantine_journal(f"{type(exc).__name__}: {exc}")
                return
        for puts, deleted in changed:
            claims.update(puts)
            for uid in deleted:
                claims.pop(uid, None)
        if damage:
            # Records between valid ones are unreadable: not a crash's tear. Every claim the valid
            # records hold is kept (written to a new snapshot at once, see :meth:`_save_salvaged`),
            # the file is kept aside for a human, and the daemon rebuilds the rest from the API server.
            self._quarantine_journal(f"damaged records: {damage}")
            self._salvaged = True
        elif suspect:
            log.warning(
                "claims journal: its last record may have been acknowledged; claims are rebuilt from the API server",
                extra={"kv": {"path": str(self.journal_path), "why": suspect}},
            )
            self.claims_suspect = suspect

    def _quarantine_journal(self, reason: str) -> None:
        self._journal.close()
        self._quarantine(self.journal_path, "claims", reason)
        self._journal.forget()

    def _quarantine(self, path: Path, part: str, reason: str) -> DriverState:
        """Move a damaged state file aside (kept for a human) and start that part empty."""
        try:
            moved = move_aside(path)
        except OSError as exc:
            raise CheckpointError(f"cannot parse {path} ({reason}) nor move it aside: {exc}") from exc
        log.error(
            "state file is corrupt: moved aside, starting without it and rebuilding what can be rebuilt",
            extra={"kv": {"path": str(path), "moved_to": str(moved), "error": reason}},
        )
        self.quarantined.append(QuarantinedFile(path, moved, reason))
        if path != self.journal_path:
            self._stamps[path] = None
            self._written[path] = encode({part: {}})
        return DriverState()

    def _unchanged(self) -> bool:
        """No other process wrote a state file since we last read or wrote it (three ``lstat``)."""
        return all(_stamp(p) == self._stamps.get(p, _UNSEEN) for p in (self.path, self.pods_path)) and not (
            self._journal.changed()
        )

    def refresh(self) -> bool:
        """Reload the files another process replaced since we last read or wrote them.

        Returns True if anything was reloaded. Raises :class:`CheckpointError` when the new
        content cannot be read (e.g. a newer driver's schema): never act on a misread state.
        """
        with self._lock:
            if self._unchanged():
                return False
            try:
                # Under the other instance's lock: never the snapshot of one write with the
                # journal of the next.
                with self._cross_process():
                    self._state = self._load()
                    self._save_salvaged()
            except CheckpointWriteError:  # no lock file on a read-only disk: read without it
                self._state = self._load()
            return True

    def read(self, fn: Callable[[DriverState], T]) -> T:
        """Run ``fn`` on the current state under the lock (do not mutate)."""
        with self._lock:
            self.refresh()
            return fn(self._state)

    def update(self, fn: Callable[[DriverState], T], *, claims_only: bool = False) -> T:
        """Mutate the state with ``fn`` and persist it before returning ``fn``'s result.

        ``claims_only``: ``fn`` changes nothing but the claims (the pod state is then not
        encoded again to find out). Raises :class:`CheckpointWriteError` when the new state could
        not be saved; the state is then what the files hold: what it was before the call, or, when
        only the directory's fsync failed after the rename (``replaced``), the new state (the
        caller is still told it failed; a retry of an idempotent call then finds its work done).
        """
        with self._lock, self._cross_process():  # the whole read-modify-write is one step
            try:
                self.refresh()
                result = fn(self._state)
                self._write(claims_only)
            except BaseException:
                # fn may have mutated the state before failing, or the write failed (ENOSPC):
                # go back to what is on disk so memory never claims what was not persisted.
                self._claims_json.clear()
                self._pods_json.clear()
                self._state = self._on_disk()
                raise
            return result

    def compact(self) -> bool:
        """Fold the journal into ``checkpoint.json`` (one atomic, durable write of the whole file);
        True when a new snapshot is current. Raises :class:`CheckpointWriteError`: the journal
        still holds its records then.

        The store's locks are held to copy the claims and to rename the new file into place, not
        while it is written and synced (updates go on meanwhile, see the module's docstring). A
        snapshot another write made in between holds everything this one would: it is then left
        in place (False).
        """
        with self._folding():
            fold = self._copy_for_fold()
            if fold is None:
                return False
            try:
                try:
                    write_synced(self._fold_path, fold.data, self.ops)
                except OSError as exc:
                    raise self._failed(self.path, exc) from exc
                if not self._rename_fold(fold):
                    return False
            except BaseException:
                discard(self._fold_path, self.ops)  # ours alone: we hold the fold lock
                raise
            try:
                # Outside the locks too: until this returns, either snapshot may be the one a crash
                # leaves, and the journal keeps every record either needs.
                sync_directory(self.directory, self.ops)
            except OSError as exc:
                raise self._failed(self.path, exc, replaced=True) from exc
            self._fold_durable(fold)
            return True

    @contextlib.contextmanager
    def _folding(self, wait: bool = True) -> Iterator[bool]:
        """Hold the fold lock (an ``flock`` on the state directory itself): one compaction at a time
        among every instance sharing the directory, since each writes :attr:`FOLD_FILENAME` outside
        the store's lock. Yields False when ``wait`` is False and another holds it (or the
        directory cannot be opened); a directory that cannot be opened to wait on is a failed write."""
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            if wait:
                raise self._failed(self.path, exc) from exc
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the flock

    def _copy_for_fold(self) -> _Fold | None:
        """(locked) The new snapshot's bytes: the claims as on disk, at the journal's position."""
        with self._lock, self._cross_process():
            self.refresh()
            if not self._journal.size and not self._rewrite:
                return None
            at = self._journal.position()
            data = self._encode_claims(self._persisted, at)
            return _Fold(previous=self._written[self.path], at=at, end=self._journal.length, data=data)

    def _rename_fold(self, fold: _Fold) -> bool:
        """(locked) Make the fold's file ``checkpoint.json``, if the snapshot is still the one it was
        copied from and the journal's run still goes through its position (records appended since
        only extend it). Else the file is discarded: another write made a newer snapshot."""
        with self._lock, self._cross_process():
            self.refresh()
            now = self._journal.position()
            if self._written[self.path] != fold.previous or self._journal.lost or not fold.at.reached_by(now):
                discard(self._fold_path, self.ops)
                return False
            try:
                rename_into_place(self._fold_path, self.path, self.ops)
            except OSError as exc:
                raise self._failed(self.path, exc) from exc
            # Memory already holds these claims (the copy, plus the records appended since, which
            # still apply): only the snapshot and the journal's start change.
            self._written[self.path] = fold.data
            self._stamps[self.path] = _stamp(self.path)
            self._base = base_of(fold.data)
            self._journal.folded(fold.at, fold.end)
            return True

    def _fold_durable(self, fold: _Fold) -> None:
        """(locked) The fold's rename is durable: unless a newer snapshot replaced it meanwhile, it is
        the claims file's last good write, and the records it holds can go from the journal."""
        with self._lock, self._cross_process():
            self.refresh()
            if self._written[self.path] != fold.data:
                return
            self._rewrite = False
            self.write_errors.pop(self.path, None)
            self.write_errors.pop(self.journal_path, None)  # the snapshot holds every record it failed to add
            self._journal.cut()

    @property
    def journal_size(self) -> int:
        """Bytes of records the journal holds beyond ``checkpoint.json`` (0: nothing to compact)."""
        return self._journal.size

    @property
    def write_error(self) -> CheckpointWriteError | None:
        """The most recent of :attr:`write_errors` (None: every write works)."""
        return next(reversed(self.write_errors.values()), None)

    def retry_write(self) -> bool:
        """After failed writes, write each failing file again; True once writes work again.

        The state equals what is on disk (a failed update is rolled back), so this rewrites the
        same content: it only proves the disk takes writes again and clears :attr:`write_errors`.
        A failing claims file (the journal or the snapshot) is retried by writing the snapshot,
        which folds the journal in.
        """
        with self._lock:
            failed = list(self.write_errors)
            if not failed:
                return True
            try:
                with self._cross_process():
                    if self.path in failed or self.journal_path in failed:
                        self._write_snapshot()
                    for path in failed:
                        if path not in (self.path, self.journal_path) and path in self._written:
                            self._atomic_write(path, self._written[path])
                        self.write_errors.pop(path, None)  # the lock file: taken above
            except CheckpointWriteError:
                return False
            log.info("state writes work again", extra={"kv": {"paths": [str(p) for p in failed]}})
            return True

    def close(self) -> None:
        """Close the journal file (the store stays usable: it is reopened by the next append)."""
        with self._lock:
            self._journal.close()

    def _on_disk(self) -> DriverState:
        """The state from the bytes last written or read (no I/O: it cannot fail like the disk)."""
        legacy = DriverState.from_json(migrate(json.loads(self._written[self.path])))
        pods = DriverState.from_json(migrate(json.loads(self._written[self.pods_path])))
        return DriverState(claims=dict(self._persisted), pods={**legacy.pods, **pods.pods})

    def _write(self, claims_only: bool = False) -> None:
        self._write_claims()
        if claims_only:
            return
        data = self._encode_pods(self._state.pods)
        if self._written.get(self.pods_path) != data:
            try:
                self._atomic_write(self.pods_path, data)
            except CheckpointWriteError as exc:
                if exc.replaced:  # memory follows the file, which holds the new bytes
                    self._written[self.pods_path] = data
                    self._stamps[self.pods_path] = _stamp(self.pods_path)
                raise
            self._written[self.pods_path] = data
            self._stamps[self.pods_path] = _stamp(self.pods_path)

    def _write_claims(self) -> None:
        """Persist what changed in the claims: a journal record, or the whole file."""
        claims, persisted = self._state.claims, self._persisted
        puts = [uid for uid, claim in claims.items() if persisted.get(uid) is not claim]
        deleted = [uid for uid in persisted if uid not in claims]
        if not (puts or deleted or self._rewrite):
            return
        if not self._journal_takes_it():
            self._write_snapshot()
            return
        try:
            self._journal.append(self._base, self._journal_record(puts, deleted))
        except OSError as exc:
            raise self._failed(self.journal_path, exc) from exc
        self.write_errors.pop(self.journal_path, None)
        self._persisted = dict(claims)

    def _journal_takes_it(self) -> bool:
        """Whether a change of the claims goes to the journal (else the whole file is written): this
        instance journals, the snapshot is ours and durable, the journal's run is whole on disk and
        has room (the bytes a start replays)."""
        journal = self._journal
        return not (self._rewrite or journal.lost or journal.length > JOURNAL_LIMIT) and self.journaling()

    def _journal_record(self, puts: list[str], deleted: list[str]) -> bytes:
        """A journal record's payload: the claims put (their cached JSON) and the UIDs removed."""
        members, version = self._claims_json.members(self._state.claims, puts)
        removed = json.dumps(sorted(deleted), separators=(",", ":")).encode()
        return b'{"delete":' + removed + b',"put":{' + members + b'},"version":' + str(version).encode() + b"}"

    def _write_snapshot(self) -> None:
        """Replace ``checkpoint.json`` with every claim; the journal's records are then in it.

        It names the journal's position: records another instance appends to the run before this
        file's rename is durable (after a failed directory sync) apply to the old snapshot and to
        this one alike.
        """
        journal = self._journal
        at, end = journal.position(), journal.length
        data = self._encode_claims(self._state.claims, at)
        try:
            self._atomic_write(self.path, data)
        except CheckpointWriteError as exc:
            if exc.replaced:  # memory follows the file, which holds the new bytes
                self._snapshot_written(data, at, end)
                self._rewrite = True  # its rename may not be durable: never journal on top of it
            raise
        self._snapshot_written(data, at, end)
        journal.cut()

    def _snapshot_written(self, data: bytes, at: Position, end: int) -> None:
        self._written[self.path] = data
        self._stamps[self.path] = _stamp(self.path)
        self._base = base_of(data)
        self._journal.folded(at, end)
        self._rewrite = False
        self._persisted = dict(self._state.claims)

    def _atomic_write(self, path: Path, data: bytes) -> None:
        try:
            atomic_write(path, data, self.ops)
        except OSError as exc:
            raise self._failed(path, exc, replaced=isinstance(exc, ReplacedNotSynced)) from exc
        self.write_errors.pop(path, None)
        if path == self.path:  # the snapshot holds every claim: the journal's failure is moot
            self.write_errors.pop(self.journal_path, None)

    def _failed(self, path: Path, exc: OSError, replaced: bool = False) -> CheckpointWriteError:
        """Record a failed write of ``path`` (logged once per distinct error, counted each time)."""
        error = CheckpointWriteError(path, exc, replaced=replaced)
        with self._lock:  # a compaction fails outside the lock
            previous = self.write_errors.pop(path, None)
            if previous is None or str(previous) != str(error):
                log.error("cannot save driver state", extra={"kv": {"path": str(path), "error": str(error)}})
            self.write_errors[path] = error  # last: the most recent
            self.write_failures[path.name] = self.write_failures.get(path.name, 0) + 1
        return error

    def writable_problem(self) -> str | None:
        """Why a state file could not be written now (None: both directories take a new file); for
        a clear refusal at start rather than a failure at the first claim."""
        for path in (self.path, self.pods_path):
            probe = path.with_name(f".{path.name}.probe-{os.getpid()}")
            try:
                os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
                os.unlink(probe)
            except OSError as exc:
                return str(CheckpointWriteError(path, exc)).split(";", 1)[0]
        return None

    def _encode_claims(self, claims: dict[str, PreparedClaim], at: Position | None) -> bytes:
        """The claims file, byte for byte what ``encode({"claims": {uid: claim.to_dict()}, "journal":
        at.to_json()}, version)`` gives, from cached pieces; ``version`` is the newest a claim needs
        (older drivers ignore ``journal``: it only tells which journal records apply)."""
        members, version = self._claims_json.members(claims)
        journal = b"" if at is None else b',"journal":{"epoch":%d,"seq":%d}' % (at.epoch, at.seq)
        return b'{"claims":{' + members + b"}" + journal + b',"version":' + str(version).encode() + b"}"

    def _encode_pods(self, pods: dict[str, PodNetState]) -> bytes:
        """``pods.json``, byte for byte what ``encode(DriverState(pods=pods).pods_json(), version)``
        gives with the newest version a pod needs, from each pod's JSON encoded once per stored object."""
        members, version = self._pods_json.members(pods)
        return b'{"pods":{' + members + b'},"version":' + str(version).encode() + b"}"


class _Encodings(Generic[T]):
    """Each stored object's compact JSON and the oldest version that reads it right, encoded once
    per object (by identity: stored objects are replaced, never changed), so a write encodes only
    what changed."""

    def __init__(self, plain: Callable[[T], dict[str, Any]], version: Callable[[T, dict[str, Any]], int]) -> None:
        self._plain = plain
        self._version = version  # of the object and its plain form
        self._cache: dict[str, tuple[T, bytes, int]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def members(self, objects: Mapping[str, T], keys: Iterable[str] | None = None) -> tuple[bytes, int]:
        """``"key":{...}`` of each of ``keys`` (default: every object, and the objects no longer
        stored are forgotten), sorted and comma-joined, and the newest version one of them needs."""
        pieces = []
        version = COMPATIBLE_VERSION
        for key in sorted(objects if keys is None else keys):
            obj = objects[key]
            cached = self._cache.get(key)
            if cached is None or cached[0] is not obj:
                plain = self._plain(obj)
                cached = (
                    obj,
                    json.dumps(plain, sort_keys=True, separators=(",", ":")).encode(),
                    self._version(obj, plain),
                )
                self._cache[key] = cached
            pieces.append(json.dumps(key).encode() + b":" + cached[1])
            version = max(version, cached[2])
        if keys is None:
            for key in self._cache.keys() - objects.keys():
                del self._cache[key]
        return b",".join(pieces), version
