"""NodePrepareResources / NodeUnprepareResources: the kubelet's claims to checkpointed devices.

The kubelet sends only claim identities (namespace, name, UID). For each claim we
GET the ResourceClaim (concurrently, before any serialization: those calls are the
slow part), build its record (:class:`~driver.claims.claim_build.ClaimBuilder`: our
allocated devices, in our node's pool and inventory, with a device snapshot and the
decoded, validated config), and store that :class:`PreparedClaim` in the checkpoint.
That record is all the NRI hooks need at pod start, and it is what makes a retried
prepare (also after a crash and restart) return the same answer without asking the API
server again.

Checkpoint mutations go through a group commit (:class:`GroupCommit`): concurrent prepares and
unprepares are applied in arrival order, with one durable write per batch (a journal record and
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
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

from driver.checkpoint.state import DriverState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder, ClaimError
from driver.dra.protocol import ClaimRef, PrepareResult, ResultDevice
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound

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


class GroupCommit:
    """Applies checkpoint mutations in arrival order, batching concurrent ones into one write."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._pending: list[tuple[Callable[[DriverState], Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._compaction: asyncio.TimerHandle | None = None
        self._compactor: asyncio.Task[None] | None = None

    async def apply(self, fn: Callable[[DriverState], T]) -> T:
        """Run ``fn`` on the state and return its result once the state is on disk."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((fn, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            outcomes: list[tuple[bool, Any]] = []

            def run_batch(state: DriverState, batch: list[Any] = batch, outcomes: list[Any] = outcomes) -> None:
                for fn, _ in batch:
                    try:
                        outcomes.append((True, fn(state)))
                    except Exception as exc:  # noqa: BLE001 - one bad mutation must not sink the batch
                        outcomes.append((False, exc))

            try:
                # A sync blocks for a millisecond or more: keep it off the event loop.
                await asyncio.to_thread(self._store.update, run_batch, claims_only=True)
            except Exception as exc:  # noqa: BLE001 - every waiter gets the write's failure as its claim error
                # The store logged the failure (path, errno) once; each waiter answers with it.
                log.debug("checkpoint batch not saved", extra={"kv": {"error": str(exc), "batch": len(batch)}})
                for _, future in batch:
                    if not future.done():
                        future.set_exception(ClaimError(str(exc)))
                continue
            for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                if not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        self._schedule_compaction()

    def _schedule_compaction(self) -> None:
        """Fold the journal in once the claims have been quiet (each batch pushes it back)."""
        if self._compaction is not None:
            self._compaction.cancel()
            self._compaction = None
        if not self._store.journal_size:
            return
        delay = 0.0 if self._store.journal_size > COMPACT_BYTES else COMPACT_AFTER
        self._compaction = asyncio.get_running_loop().call_later(delay, self._start_compaction)

    def _start_compaction(self) -> None:
        self._compaction = None
        if self._pending or (self._compactor is not None and not self._compactor.done()):
            return  # the flush in progress schedules it again
        self._compactor = asyncio.create_task(self._compact())

    async def _compact(self) -> None:
        try:
            await asyncio.to_thread(self._store.compact)
        except Exception as exc:  # noqa: BLE001 - the journal still holds every record; the next batch retries
            log.warning("checkpoint compaction failed", extra={"kv": {"error": str(exc)}})
            return
        if not self._pending:
            self._schedule_compaction()  # records a batch added while it ran


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
    ) -> None:
        """``builder`` builds each claim's record (and resolves its profiles); ``after_commit`` is
        called with the claim UIDs just persisted (tests use it to crash the process between the
        checkpoint write and the response); ``on_unprepare`` gets each claim that unprepare removed
        (the claim status writer drops our entries); ``on_error`` gets each claim answered with an
        error (the status writer posts an event on it)."""
        self.kube, self.store, self.builder = kube, store, builder
        self.profiles = builder.profiles
        self.after_commit, self.on_unprepare = after_commit, on_unprepare
        self.on_error = on_error
        self._commit = GroupCommit(store)
        self._pool: Executor | None = None

    # -- prepare ------------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare every claim; the result has an entry for each claim UID, never an exception."""
        results: dict[str, PrepareResult] = {}
        # One pool job per claim does the checkpoint lookup and, on a miss, the GET: the
        # store's lock is held by the writer thread during an fsync (never wait for it on the
        # event loop), and each thread hop costs a loop round trip.
        loop = asyncio.get_running_loop()
        found = await asyncio.gather(
            *(loop.run_in_executor(self._io_pool(), self._lookup, c) for c in claims), return_exceptions=True
        )
        records: list[PreparedClaim] = []
        for ref, claim in zip(claims, found, strict=True):
            if isinstance(claim, BaseException) and not isinstance(claim, ClaimError):
                raise claim  # the checkpoint itself failed (GET failures are ClaimErrors): fail the call
            if isinstance(claim, PreparedClaim):
                results[ref.uid] = result_of(claim)  # the kubelet's retry: answered from the checkpoint
                continue
            record = await self._build(ref, claim, results)
            if record is not None:
                records.append(record)
        if records:
            await self._store(records, results)
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

    async def _build(
        self, ref: ClaimRef, claim: dict[str, Any] | ClaimError, results: dict[str, PrepareResult]
    ) -> PreparedClaim | None:
        """The record of a claim not prepared yet (None: answered in ``results`` instead: its error, or
        nothing to prepare)."""
        try:
            if isinstance(claim, ClaimError):
                raise claim
            # A profile is an HTTP call: keep it off the event loop.
            record = (
                await asyncio.get_running_loop().run_in_executor(self._io_pool(), self.builder.build, ref, claim)
                if self.profiles
                else self.builder.build(ref, claim)
            )
        except ClaimError as exc:
            results[ref.uid] = PrepareResult(error=str(exc))
            return None
        except Exception as exc:  # a bug for one claim must not fail the others
            log.exception("prepare failed", extra={"kv": {"claim": ref.uid}})
            results[ref.uid] = PrepareResult(error=f"internal error preparing claim {ref.namespace}/{ref.name}: {exc}")
            return None
        if not record.devices:
            # The kubelet asks a driver only about claims with devices of that driver;
            # this one has none of ours (reallocated?): nothing to prepare, nothing to store.
            log.debug(
                "claim has no devices of this driver: nothing prepared",
                extra={"kv": {"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid}},
            )
            results[ref.uid] = PrepareResult()
            return None
        return record

    async def _store(self, records: list[PreparedClaim], results: dict[str, PrepareResult]) -> None:
        """Store new records in one group commit; each claim's answer in ``results``."""
        try:
            outcomes = await self._commit.apply(lambda state: record_claims(state, records))
        except Exception as exc:  # noqa: BLE001 - the kubelet gets an error for these claims, never none
            for record in records:
                results[record.uid] = PrepareResult(error=f"not prepared: {exc}")
            return
        if self.after_commit is not None:
            self.after_commit([o.uid for o in outcomes if isinstance(o, PreparedClaim)])
        for record, outcome in zip(records, outcomes, strict=True):
            if isinstance(outcome, ClaimError):
                if self.profiles:  # refused: free what it resolved
                    profiled = [(d.snapshot, d.config) for d in record.devices]
                    await asyncio.get_running_loop().run_in_executor(
                        self._io_pool(), self.profiles.release_devices, record.uid, profiled
                    )
                results[record.uid] = PrepareResult(error=str(outcome))
            else:
                results[record.uid] = result_of(outcome)

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

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Forget the claims; returns claim UID -> error ("" = success). Unknown UIDs succeed."""
        uids = [c.uid for c in claims]
        try:
            removed = await self._commit.apply(
                lambda state: [c for c in (state.claims.pop(u, None) for u in uids) if c is not None]
            )
        except Exception as exc:  # noqa: BLE001 - answered to the kubelet per claim
            return {u: f"not unprepared: {exc}" for u in uids}
        log.info("unprepared claims", extra={"kv": {"claims": uids, "known": [c.uid for c in removed]}})
        if self.profiles is not None:  # best effort, as dranet: the provider reclaims what is not released
            for claim in removed:
                profiled = [(d.snapshot, d.config) for d in claim.devices]
                await asyncio.get_running_loop().run_in_executor(
                    self._io_pool(), self.profiles.release_devices, claim.uid, profiled
                )
        for claim in removed if self.on_unprepare else ():
            try:
                self.on_unprepare(claim)  # type: ignore[misc]
            except Exception:
                log.exception("on_unprepare failed", extra={"kv": {"claim": claim.uid}})
        return {u: "" for u in uids}
