"""NodePrepareResources / NodeUnprepareResources: the kubelet's claims to checkpointed devices.

The kubelet sends only claim identities (namespace, name, UID). Each claim is prepared in one
thread of a pool, start to end (the checkpoint lookup, the GET of the ResourceClaim, concurrently
for the claims of a call, its record and the durable write), so a call costs the event loop one
hand-off out and one back. We build its record (:class:`~driver.claims.claim_build.ClaimBuilder`: our
allocated devices, in our node's pool and inventory, with a device snapshot and the
decoded, validated config), and store that :class:`PreparedClaim` in the checkpoint.
That record is all the NRI hooks need at pod start, and it is what makes a retried
prepare (also after a crash and restart) return the same answer without asking the API
server again.

Checkpoint mutations go through a group commit (:class:`GroupCommit`, called from those threads):
concurrent prepares and unprepares are applied in arrival order, with one durable write per batch (a journal record and
one ``fdatasync`` when the store journals). That queue is the serialization point (the Go
helper's mutex): decisions that depend on the stored state are made inside the mutation, under
the store's lock; there a claim wanting a device another claim holds is refused
(:func:`record_claims`: one NIC, one claim). The journal is folded into the claims file in the
background once the claims have been quiet for :data:`COMPACT_AFTER` seconds, or at once past
:data:`COMPACT_BYTES`; the fold takes the store's lock only to copy the claims and to rename its
file, so a batch arriving meanwhile is written without waiting for the fold's syncs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from driver.api.v1alpha1.network_config import VFIO_PCI
from driver.checkpoint.state import DriverState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder, ClaimError
from driver.claims.device_metadata import DeviceMetadataWriter, MetadataError
from driver.claims.vfio_vf_settings import VfioVfSettings
from driver.dra.protocol import ClaimRef, PrepareResult, ResultDevice
from driver.inventory.vfio_binding import VfioBinder, VfioError, write_file
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound
from driver.netlink.sriov_vf import VfError
from driver.nic_settings.writable_proc_sys import SYS, WritableProcSys

log = logging.getLogger(__name__)
T = TypeVar("T")

CLAIM_LOOKUP_THREADS = 16
"""Concurrent claim lookups (checkpoint read + GET); matches the API client's connection pool."""
COMPACT_AFTER = 1.0
"""Seconds without a claim change before the journal is folded into ``checkpoint.json``: the file is
then whole for anyone reading only it (an older driver during a rolling update or a downgrade)."""
COMPACT_BYTES = 256 << 10
"""Journal bytes that start a compaction without waiting for a quiet moment."""


def result_of(record: PreparedClaim) -> PrepareResult:
    """The kubelet's answer for a prepared claim: one result per device, under its request."""
    return PrepareResult(
        devices=[
            ResultDevice(request_names=[d.request], pool=d.pool, device=d.device, share_id=d.share_id)
            for d in record.devices
        ]
    )


def record_claims(state: DriverState, records: list[PreparedClaim]) -> list[PreparedClaim | ClaimError]:
    """Store new claims (under the store's lock: decided against every claim stored so far).

    A claim a concurrent call stored first keeps its original record. A claim that wants a device
    another stored claim holds is refused with the holder's name, unless both hold it shared
    (adminAccess or a shareID): a NIC moves into one pod, it cannot be in two, and a NIC whose
    sub-interfaces serve pods (a shareID) cannot move into a pod, nor get sub-interfaces while in one.
    """
    holders: dict[tuple[str, str], PreparedClaim] = {}  # whole NICs, then NICs with sub-interfaces
    parents: dict[tuple[str, str], PreparedClaim] = {}
    for claim in state.claims.values():
        _hold(holders, parents, claim)
    out: list[PreparedClaim | ClaimError] = []
    for record in records:
        existing = state.claims.get(record.uid)
        if existing is not None:
            out.append(existing)
            continue
        taken = [
            (d.device, found)
            for d in record.devices
            for found in (
                holders.get((d.pool, d.device)) if not d.shared or d.sub_interface else None,
                parents.get((d.pool, d.device)) if not d.shared else None,
            )
            if found is not None
        ]
        if taken:
            device, holder = taken[0]
            out.append(
                ClaimError(
                    f"ResourceClaim {record.namespace}/{record.name}: device {device} is already held by "
                    f"ResourceClaim {holder.namespace}/{holder.name} (uid {holder.uid}); a device can be in "
                    "one claim at a time unless allocated with adminAccess, or shared (a shareID) by every claim"
                )
            )
            continue
        state.claims[record.uid] = record
        _hold(holders, parents, record)
        out.append(record)
    return out


def _hold(
    holders: dict[tuple[str, str], PreparedClaim], parents: dict[tuple[str, str], PreparedClaim], claim: PreparedClaim
) -> None:
    """Note ``claim``'s devices: the NICs it holds whole, the NICs its sub-interfaces hang from."""
    for d in claim.devices:
        if d.sub_interface:
            parents[(d.pool, d.device)] = claim
        elif not d.shared:
            holders[(d.pool, d.device)] = claim


@dataclass
class _Change(Generic[T]):
    """One mutation waiting for its group commit, and its outcome once written."""

    fn: Callable[[DriverState], T]
    done: bool = False
    ok: bool = False
    value: Any = field(default=None)


class GroupCommit:
    """Applies checkpoint mutations in arrival order, batching concurrent ones into one write.

    :meth:`apply` blocks its (pool) thread: the first caller that finds no write in progress
    writes every change queued so far in one store update, with its own; callers arriving during
    that write wait and are written together by the next of them. The compaction is scheduled
    from the event loop (:meth:`schedule_compaction`, after the callers' results came back there).
    """

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._queue: list[_Change[Any]] = []
        self._writing = False
        self._compaction: asyncio.TimerHandle | None = None
        self._compactor: asyncio.Task[None] | None = None
        # When a claim last changed (any thread writes it): an armed compaction that fires sooner
        # than COMPACT_AFTER after it waits the rest, so a call need not wake the loop to push it back.
        self.changed_at = 0.0

    def changed(self) -> bool:
        """(any thread) Note a claim change; whether the loop must be woken to schedule the
        compaction (none armed, or the journal is over :data:`COMPACT_BYTES`)."""
        self.changed_at = time.monotonic()
        return self._compaction is None or self._store.journal_size > COMPACT_BYTES

    def apply(self, fn: Callable[[DriverState], T]) -> T:
        """(any thread but the event loop's) Run ``fn`` on the state; its result once the state is on
        disk. A failed write raises :class:`ClaimError` with the store's reason."""
        change: _Change[T] = _Change(fn)
        with self._cond:
            self._queue.append(change)
            while not change.done:
                if self._writing:
                    self._cond.wait()
                    continue
                batch, self._queue = self._queue, []
                self._writing = True
                self._cond.release()
                try:
                    self._write(batch)
                finally:
                    self._cond.acquire()
                    self._writing = False
                    self._cond.notify_all()
        if not change.ok:
            raise change.value
        return change.value  # type: ignore[no-any-return]

    def _write(self, batch: list[_Change[Any]]) -> None:
        """One store update for ``batch``: each change's outcome, or the write's failure for all."""

        def run_batch(state: DriverState) -> None:
            for change in batch:
                try:
                    change.value, change.ok = change.fn(state), True
                except Exception as exc:  # noqa: BLE001 - one bad mutation must not sink the batch
                    change.value, change.ok = exc, False

        try:
            self._store.update(run_batch, claims_only=True)
        except Exception as exc:  # noqa: BLE001 - every waiter gets the write's failure as its claim error
            # The store logged the failure (path, errno) once; each waiter answers with it.
            log.debug("checkpoint batch not saved", extra={"kv": {"error": str(exc), "batch": len(batch)}})
            for change in batch:
                change.value, change.ok = ClaimError(str(exc)), False
        for change in batch:
            change.done = True

    @property
    def busy(self) -> bool:
        """A write is in progress or changes are queued for one."""
        with self._cond:
            return self._writing or bool(self._queue)

    def schedule_compaction(self) -> None:
        """(event loop) Fold the journal in once the claims have been quiet (each batch pushes it back)."""
        if self._compaction is not None:
            self._compaction.cancel()
            self._compaction = None
        if not self._store.journal_size:
            return
        delay = 0.0 if self._store.journal_size > COMPACT_BYTES else COMPACT_AFTER
        self._compaction = asyncio.get_running_loop().call_later(delay, self._start_compaction)

    def _start_compaction(self) -> None:
        self._compaction = None
        quiet = time.monotonic() - self.changed_at  # read after the handle is cleared: see changed()
        if quiet < COMPACT_AFTER and self._store.journal_size <= COMPACT_BYTES:
            self._compaction = asyncio.get_running_loop().call_later(COMPACT_AFTER - quiet, self._start_compaction)
            return
        if self.busy or (self._compactor is not None and not self._compactor.done()):
            return  # the callers of the write in progress schedule it again
        self._compactor = asyncio.create_task(self._compact())

    async def _compact(self) -> None:
        try:
            await asyncio.to_thread(self._store.compact)
        except Exception as exc:  # noqa: BLE001 - the journal still holds every record; the next batch retries
            log.warning("checkpoint compaction failed", extra={"kv": {"error": str(exc)}})
            return
        if not self.busy:
            self.schedule_compaction()  # records a batch added while it ran


class Preparer:
    """Prepares and unprepares claims for the kubelet; all state lives in the checkpoint."""

    def __init__(
        self,
        kube: KubeClient,
        store: CheckpointStore,
        builder: ClaimBuilder,
        *,
        after_commit: Callable[[list[str]], None] | None = None,
        on_unprepare: Callable[[PreparedClaim], None] | None = None,
        on_error: Callable[[ClaimRef, str], None] | None = None,
        metadata: DeviceMetadataWriter | None = None,
    ) -> None:
        """``builder`` builds each claim's record (and resolves its profiles); ``after_commit`` is
        called with the claim UIDs just persisted (tests use it to crash the process between the
        checkpoint write and the response); ``on_unprepare`` gets each claim that unprepare removed
        (the claim status writer drops our entries); ``on_error`` gets each claim answered with an
        error (the status writer posts an event on it); ``metadata`` writes each prepared claim's
        device metadata files and adds their CDI devices to the answer (None: no metadata)."""
        self.kube, self.store, self.builder = kube, store, builder
        self.metadata = metadata
        if metadata is not None:  # its files are rendered from the checkpoint, facts it lacks from a GET
            metadata.bind(store, lambda r: self._get_claim(ClaimRef(namespace=r.namespace, name=r.name, uid=r.uid)))
        self.profiles = builder.profiles
        self.after_commit, self.on_unprepare = after_commit, on_unprepare
        self.on_error = on_error
        self._commit = GroupCommit(store)
        # VFs a claim holds on vfio-pci (sriov.driver); sysfs written where it is writable.
        self._sysfs = WritableProcSys(path=SYS) if builder.sysfs_root == SYS else None
        self.vfio = VfioBinder(builder.sysfs_root, write=self.write_sysfs)
        self.vf_settings = VfioVfSettings(builder.sysfs_root)  # their PF's settings of them
        self._pool: Executor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the daemon's: the journal's compaction is timed there

    # -- prepare ------------------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The daemon's event loop, where the journal's compaction is scheduled after each change."""
        self._loop = loop

    def _compact_later(self) -> None:
        """(any thread) Have the loop schedule the journal's compaction (each change pushes it back).
        The loop is woken only when no compaction is armed: waking it on every call made it take the
        GIL while the call's answer went out (the kubelet's round trip after an idle gap)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._commit.changed():
            loop.call_soon_threadsafe(self._commit.schedule_compaction)

    def prepare_now(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """(the kubelet's call, on the DRA server's thread) Prepare every claim: the usual single
        claim start to end on this thread (its GET, build, files and durable write), several on
        the pool concurrently; an entry for each claim UID, never an exception."""
        answers: list[PrepareResult | BaseException]
        if not claims:
            return {}  # nothing asked, nothing changed
        if len(claims) == 1:
            try:
                answers = [self._prepare(claims[0])]
            except Exception as exc:  # noqa: BLE001 - the checkpoint failed: the whole call fails below
                answers = [exc]
        else:
            pending = [self._io_pool().submit(self._prepare, c) for c in claims]
            answers = [f.exception() or f.result() for f in pending]
        self._compact_later()
        return self._answered(claims, answers)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare every claim; the result has an entry for each claim UID, never an exception."""
        loop = asyncio.get_running_loop()
        pool = self._io_pool()
        if len(claims) == 1:  # the usual call: no gather
            answers: list[PrepareResult | BaseException] = [await loop.run_in_executor(pool, self._prepare, claims[0])]
        else:
            answers = await asyncio.gather(
                *(loop.run_in_executor(pool, self._prepare, c) for c in claims), return_exceptions=True
            )
        self._commit.schedule_compaction()
        return self._answered(claims, answers)

    def _answered(
        self, claims: Sequence[ClaimRef], answers: Sequence[PrepareResult | BaseException]
    ) -> dict[str, PrepareResult]:
        """The kubelet's answer from each claim's outcome (a failed checkpoint fails the call)."""
        results: dict[str, PrepareResult] = {}
        for ref, answer in zip(claims, answers, strict=True):
            if isinstance(answer, BaseException):
                raise answer  # the checkpoint itself failed (GET failures are claim errors): fail the call
            results[ref.uid] = answer
        for ref in claims:  # the kubelet treats a missing entry as "left out": never leave one out
            results.setdefault(ref.uid, PrepareResult(error=f"claim {ref.uid} was not processed"))
            if results[ref.uid].error and self.on_error is not None:
                try:
                    self.on_error(ref, results[ref.uid].error)
                except Exception:
                    log.exception("on_error failed", extra={"kv": {"claim": ref.uid}})
        log.info(
            "prepared claims",
            extra={
                "kv": {"claims": [c.uid for c in claims], "errors": {u: r.error for u, r in results.items() if r.error}}
            },
        )
        return results

    def _prepare(self, ref: ClaimRef) -> PrepareResult:
        """(pool thread) One claim, start to end: answered from the checkpoint (a retry), or fetched,
        built and stored. Raises only when the checkpoint cannot be read."""
        try:
            claim = self._lookup(ref)
        except ClaimError as exc:
            return PrepareResult(error=str(exc))
        if isinstance(claim, PreparedClaim):  # the kubelet's retry: answered from the checkpoint
            problem = self._bind_vfio(claim)  # a crash may have come between the record and the bind
            return PrepareResult(error=problem) if problem else self._with_metadata(claim, None)
        record = self._build(ref, claim)
        if isinstance(record, PrepareResult):
            return record
        if self.metadata is not None:  # what its files need of the claim, kept with the record
            record = self.metadata.with_facts(record, claim)
        # The metadata files first: once the claim is durable a retry answers from the checkpoint
        # alone (no GET), also after a crash right after the write, so its files must be there.
        written = self._with_metadata(record, claim)
        if written.error:
            return written
        try:
            [outcome] = self._commit.apply(lambda state: record_claims(state, [record]))
        except Exception as exc:  # noqa: BLE001 - the kubelet gets an error for this claim, never none
            self._drop_metadata(record)
            return PrepareResult(error=f"not prepared: {exc}")
        if isinstance(outcome, ClaimError):
            self._drop_metadata(record)
            if self.profiles:  # refused: free what it resolved
                self.profiles.release_devices(record.uid, [(d.snapshot, d.config) for d in record.devices])
            return PrepareResult(error=str(outcome))
        if self.after_commit is not None:
            self.after_commit([outcome.uid])
        # A VF goes to vfio-pci once the record (with the driver it goes back to) is durable: a crash
        # after the bind leaves a record that gives it back. A failed bind takes the claim back.
        problem = self._bind_vfio(outcome)
        if problem and outcome is record:
            return self._taken_back(record, problem)
        if problem:
            return PrepareResult(error=problem)
        return written if outcome is record else self._with_metadata(outcome, None)

    def write_sysfs(self, path: str, value: str) -> None:
        """One sysfs write, in the thread with a writable ``/sys`` when it is the host's own tree (VF
        drivers here, the PFs' VF counts at start)."""
        if self._sysfs is None:
            write_file(path, value)
        else:  # a failure to make it writable is an OSError too (ProcSysReadOnly), named by the binder
            self._sysfs.run(write_file, path, value)

    def _bind_vfio(self, record: PreparedClaim) -> str | None:
        """(pool thread) Put the claim's VFs for vfio-pci on it, then their PF settings (both
        idempotent); the error, or None."""
        for d in record.devices:
            if d.vfio and d.snapshot.host.pci_address:
                try:
                    self.vfio.bind(d.snapshot.host.pci_address)
                except VfioError as exc:
                    log.warning("VF not bound to vfio-pci", extra={"kv": {"claim": record.uid, "error": str(exc)}})
                    return f"ResourceClaim {record.namespace}/{record.name}: device {d.device}: {exc}"
        refused = self.vf_settings.apply(record.devices)
        if refused:
            log.warning("VF settings refused by the PF", extra={"kv": {"claim": record.uid, "error": refused}})
            return f"ResourceClaim {record.namespace}/{record.name}: {refused}"
        return None

    def _taken_back(self, record: PreparedClaim, problem: str) -> PrepareResult:
        """(pool thread) Undo a claim just stored whose VF could not go to vfio-pci: its VFs back on
        their drivers, the record forgotten, its files removed; the answer is the bind's error."""
        errors = self._give_back_vfio([record])
        if errors:  # kept: the kubelet's unprepare (or its retried prepare) tries again
            return PrepareResult(error=f"{problem}; {errors[record.uid]}")

        def forget(state: DriverState) -> None:
            state.claims.pop(record.uid, None)

        try:
            self._commit.apply(forget)
        except Exception as exc:  # noqa: BLE001 - the record stays; the kubelet's unprepare removes it
            return PrepareResult(error=f"{problem}; the claim's record stays: {exc}")
        self._drop_metadata(record)
        if self.profiles:
            self.profiles.release_devices(record.uid, [(d.snapshot, d.config) for d in record.devices])
        return PrepareResult(error=problem)

    def _give_back_vfio(self, claims: Sequence[PreparedClaim]) -> dict[str, str]:
        """(pool thread) Each claim's VFs on vfio-pci back on their kernel drivers, their PF settings
        put back first; claim UID -> error for the claims where one could not go back (they stay
        recorded)."""
        errors: dict[str, str] = {}
        for claim in claims:
            for d in claim.devices:
                unrestored = self.vf_settings.restore(d) if d.vfio else None
                if unrestored:
                    log.warning("VF settings not restored", extra={"kv": {"claim": claim.uid, "error": unrestored}})
                    errors.setdefault(claim.uid, unrestored)
                    continue  # the VF stays on vfio-pci with its claim: the retry restores both
                if not (d.vfio and d.host_driver and d.snapshot.host.pci_address) or d.host_driver == VFIO_PCI:
                    continue  # an admin's VF on vfio-pci stays there
                try:
                    self.vfio.give_back(d.snapshot.host.pci_address, d.host_driver)
                except VfioError as exc:
                    log.warning(
                        "VF not given back to its driver", extra={"kv": {"claim": claim.uid, "error": str(exc)}}
                    )
                    errors.setdefault(claim.uid, f"device {d.device}: {exc}")  # the others still go back
        return errors

    def _drop_metadata(self, record: PreparedClaim) -> None:
        """The files of a claim that was not stored (refused, or the write failed)."""
        if self.metadata is not None:
            _best_effort("device metadata removal", record, self.metadata.unprepared, record)

    def _with_metadata(self, record: PreparedClaim, claim: dict[str, Any] | None) -> PrepareResult:
        """(pool thread) The kubelet's answer for a claim, with its device metadata files written
        (``claim``: the ResourceClaim just fetched), or checked and mended (None: a retry)."""
        result = result_of(record)
        if self.metadata is None:
            return result
        try:
            return self.metadata.prepared(record, result, claim)
        except (MetadataError, ClaimError) as exc:
            return PrepareResult(error=str(exc))

    def restore_metadata(self) -> list[str]:
        """(thread, at start) Every stored claim's metadata files and CDI specs read, compared with
        what the checkpoint says they hold (the pod's view included) and written again where
        missing or damaged: a reboot empties /run and /var/run/cdi, and a container that restarts
        in a running pod mounts them without any prepare. Returns the claims whose files stay wrong."""
        if self.metadata is None:
            return []
        return self.metadata.keep_all(full=True)

    def restore_vfio(self) -> list[str]:
        """(thread, at start) Every stored claim's VFs on vfio-pci again (a reboot or an admin put them
        back on their drivers; a crash may have come between a record and its bind). Returns the
        claims with a VF that could not be bound (each logged)."""
        claims = self.store.read(lambda s: [c for c in s.claims.values() if any(d.vfio for d in c.devices)])
        return [c.uid for c in claims if self._bind_vfio(c)]

    def _build(self, ref: ClaimRef, claim: dict[str, Any]) -> PreparedClaim | PrepareResult:
        """(pool thread) The record of a claim not prepared yet, or its answer instead: its error, or
        nothing to prepare."""
        try:
            record = self.builder.build(ref, claim)
        except ClaimError as exc:
            return PrepareResult(error=str(exc))
        except Exception as exc:  # a bug for one claim must not fail the others
            log.exception("prepare failed", extra={"kv": {"claim": ref.uid}})
            return PrepareResult(error=f"internal error preparing claim {ref.namespace}/{ref.name}: {exc}")
        refusal = ""
        if self.metadata is None and any(d.vfio for d in record.devices):
            refusal = (
                "sriov.driver vfio-pci: the VFIO devices reach the containers through the device metadata's "
                "CDI specs, which this node has turned off (--no-device-metadata)"
            )
        else:
            try:  # what the PFs of its VFs for vfio-pci report now, recorded before anything changes
                record = replace(record, devices=self.vf_settings.recorded(record.devices))
            except VfError as exc:
                refusal = str(exc)
        if refusal:
            if self.profiles:  # refused: free what it resolved
                self.profiles.release_devices(record.uid, [(d.snapshot, d.config) for d in record.devices])
            return PrepareResult(error=f"ResourceClaim {ref.namespace}/{ref.name}: {refusal}")
        if not record.devices:
            # The kubelet asks a driver only about claims with devices of that driver;
            # this one has none of ours (reallocated?): nothing to prepare, nothing to store.
            log.debug(
                "claim has no devices of this driver: nothing prepared",
                extra={"kv": {"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid}},
            )
            return PrepareResult()
        return record

    def _io_pool(self) -> Executor:
        """The threads for claim lookups, created on first use.

        Not asyncio's default executor: that has min(32, CPUs + 4) threads (6 on a 2-core node)
        shared with checkpoint writes and scans, so 100 concurrent claims were fetched 6 at a
        time. Sized to the API client's connection pool so no connection is opened and thrown
        away (a TLS handshake each). Its idle threads exit when the Preparer is collected.
        """
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=CLAIM_LOOKUP_THREADS, thread_name_prefix="claim-lookup")
        return self._pool

    def _lookup(self, ref: ClaimRef) -> PreparedClaim | dict[str, Any]:
        """(pool thread) The checkpointed record of ``ref``, else the ResourceClaim from the API."""
        record = self.store.read(lambda s: s.claims.get(ref.uid))
        return record if record is not None else self._get_claim(ref)

    def _get_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """(pool thread) GET the claim; every failure is a :class:`ClaimError` for this claim only."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            return self.kube.read_namespaced_resource_claim(ref.namespace, ref.name)
        except NotFound:
            raise ClaimError(f"{where} not found (deleted?)") from None
        except KubeError as exc:
            raise ClaimError(f"cannot get {where}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any GET failure is this claim's error only
            raise ClaimError(f"cannot get {where}: {exc}") from None

    # -- unprepare ----------------------------------------------------------------------------

    def unprepare_now(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """(the kubelet's call, on the DRA server's thread) Forget the claims, then what follows
        (NICs the runtime never asked back go home, the status cleared, the metadata files handed
        to their removal after the answer), all on this thread; claim UID -> error ("" = success).
        Unknown UIDs succeed.

        The answer comes once the claims are durably forgotten and their NICs are home or known
        lost (the NRI hooks' lock is waited for): the kubelet may hand the devices to another pod
        as soon as it has the answer."""
        uids = [c.uid for c in claims]
        try:
            kept = self._forget_then_release(uids)
        except Exception as exc:  # noqa: BLE001 - answered to the kubelet per claim
            return {u: f"not unprepared: {exc}" for u in uids}
        finally:
            self._compact_later()
        return {u: kept.get(u, "") for u in uids}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Forget the claims; returns claim UID -> error ("" = success). Unknown UIDs succeed."""
        uids = [c.uid for c in claims]
        try:  # one pool hand-off for the whole unprepare
            loop = asyncio.get_running_loop()
            kept = await loop.run_in_executor(self._io_pool(), self._forget_then_release, uids)
        except Exception as exc:  # noqa: BLE001 - answered to the kubelet per claim
            return {u: f"not unprepared: {exc}" for u in uids}
        finally:
            self._commit.schedule_compaction()
        return {u: kept.get(u, "") for u in uids}

    def _forget_then_release(self, uids: list[str]) -> dict[str, str]:
        """Forget the claims durably, then what follows; claim UID -> error for the claims kept: a VF
        on vfio-pci goes back to its driver first, and a claim whose VF could not stays recorded
        (the kubelet asks again)."""
        kept: dict[str, str] = {}
        held = self.store.read(lambda s: [c for u in uids if (c := s.claims.get(u)) and any(d.vfio for d in c.devices)])
        if held:
            kept = {u: f"not unprepared: {e}" for u, e in self._give_back_vfio(held).items()}
        gone = [u for u in uids if u not in kept]

        def forget(state: DriverState) -> list[PreparedClaim]:
            return [c for c in (state.claims.pop(u, None) for u in gone) if c is not None]

        self._released(gone, self._commit.apply(forget))
        return kept

    def _released(self, uids: list[str], removed: list[PreparedClaim]) -> None:
        """(pool thread, the unprepare durable) What follows, claim by claim, best effort: the
        profile provider frees its devices (as dranet: it reclaims what is not released), then
        ``on_unprepare``. In this thread, not the event loop: giving back NICs the runtime never
        asked back waits for the NRI hooks' lock, held through a pod's moves (tens of ms)."""
        log.info("unprepared claims", extra={"kv": {"claims": uids, "known": [c.uid for c in removed]}})
        for claim in removed:  # one failure never skips the next step or claim
            if self.profiles is not None:
                profiled = [(d.snapshot, d.config) for d in claim.devices]
                _best_effort("profile release", claim, self.profiles.release_devices, claim.uid, profiled)
            if self.metadata is not None:  # its files go after the answer (they are no part of it)
                _best_effort("device metadata removal", claim, self.metadata.unprepared_later, claim)
            if self.on_unprepare is not None:
                _best_effort("on_unprepare", claim, self.on_unprepare, claim)


def _best_effort(what: str, claim: PreparedClaim, step: Callable[..., None], *args: Any) -> None:
    """``step(*args)``; a failure is logged for ``claim``, never raised."""
    try:
        step(*args)
    except Exception:
        log.exception("unprepare step failed", extra={"kv": {"step": what, "claim": claim.uid}})
