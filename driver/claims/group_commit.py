"""The group commit: concurrent prepares and unprepares applied to the checkpoint in arrival order.

Mutations are applied atomically and persisted with one durable write per batch (a journal record
and one ``fdatasync`` when the store journals). That queue is the serialization point (the Go
helper's mutex): decisions that depend on the stored state are made inside the mutation, under
the store's lock. The journal is folded into the claims file in the background once the claims
have been quiet for :data:`COMPACT_AFTER` seconds, or at once past :data:`COMPACT_BYTES`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from driver.checkpoint.state import DriverState
from driver.checkpoint.store import CheckpointStore
from driver.claims.prepare_results import ClaimError

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPACT_AFTER = 1.0
"""Seconds without a claim change before the journal is folded into ``checkpoint.json``: the file is
then whole for anyone reading only it (an older driver during a rolling update or a downgrade)."""
COMPACT_BYTES = 256 << 10
"""Journal bytes that start a compaction without waiting for a quiet moment."""


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
                if future.done():
                    continue
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
