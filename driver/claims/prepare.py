"""NodePrepareResources / NodeUnprepareResources: the kubelet's claims to checkpointed devices.

The kubelet sends only claim identities (namespace, name, UID). For each claim we
GET the ResourceClaim (concurrently, before any serialization: those calls are the
slow part), build its record (:class:`~driver.claims.claim_build.ClaimBuilder`: our
allocated devices, in our node's pool and inventory, with a device snapshot and the
decoded, validated config), and store that :class:`PreparedClaim` in the checkpoint.
That record is all the NRI hooks need at pod start, and it is what makes a retried
prepare (also after a crash and restart) return the same answer without asking the API
server again.

Checkpoint mutations go through a group commit (:mod:`driver.claims.group_commit`), where
a claim wanting a device another claim holds is refused (:mod:`driver.claims.device_holders`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder, ConfigDecoder
from driver.claims.device_holders import record_claims
from driver.claims.group_commit import GroupCommit
from driver.claims.prepare_results import ClaimError, result_of
from driver.claims.profile import ProfileResolver
from driver.dra.protocol import ClaimRef, PrepareResult
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound
from driver.model.device import Device

log = logging.getLogger(__name__)

CLAIM_LOOKUP_THREADS = 16
"""Concurrent claim lookups (checkpoint read + GET); matches the API client's connection pool."""


class Preparer(ClaimBuilder):
    """Prepares and unprepares claims for the kubelet; all state lives in the checkpoint."""

    def __init__(
        self,
        kube: KubeClient,
        store: CheckpointStore,
        devices: Callable[[], dict[str, Device]],
        driver_name: str,
        node_name: str,
        config_decoder: ConfigDecoder = configs_for_request,
        after_commit: Callable[[list[str]], None] | None = None,
        on_unprepare: Callable[[PreparedClaim], None] | None = None,
        cloud_config: Callable[[Device], NetworkConfig | None] | None = None,
        on_error: Callable[[ClaimRef, str], None] | None = None,
        profiles: ProfileResolver | None = None,
        sysfs_root: str = "/sys",
    ) -> None:
        """``devices``, ``config_decoder``, ``cloud_config`` and ``profiles`` build each claim's
        record (:class:`ClaimBuilder`); ``after_commit`` is called with the claim UIDs just persisted
        (tests use it to crash the process between the checkpoint write and the response);
        ``on_unprepare`` gets each claim that unprepare removed (the claim status writer drops our
        entries); ``on_error`` gets each claim answered with an error (the status writer posts an
        event on it)."""
        super().__init__(devices, driver_name, node_name, config_decoder, cloud_config, profiles, sysfs_root)
        self.kube, self.store = kube, store
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
        pool = self._io_pool()
        found = await asyncio.gather(
            *(loop.run_in_executor(pool, self._lookup, c) for c in claims), return_exceptions=True
        )

        records: list[PreparedClaim] = []
        for ref, claim in zip(claims, found, strict=True):
            if isinstance(claim, BaseException) and not isinstance(claim, ClaimError):
                raise claim  # the checkpoint itself failed (GET failures are ClaimErrors): fail the call
            if isinstance(claim, PreparedClaim):
                results[ref.uid] = result_of(claim)  # the kubelet's retry: answered from the checkpoint
                continue
            try:
                if isinstance(claim, BaseException):
                    raise claim
                # A profile is an HTTP call: keep it off the event loop.
                record = (
                    await loop.run_in_executor(pool, self.build, ref, claim)
                    if self.profiles
                    else self.build(ref, claim)
                )
                if not record.devices:
                    # The kubelet asks a driver only about claims with devices of that driver;
                    # this one has none of ours (reallocated?): nothing to prepare, nothing to store.
                    log.debug(
                        "claim has no devices of this driver: nothing prepared",
                        extra={"kv": {"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid}},
                    )
                    results[ref.uid] = PrepareResult()
                    continue
                records.append(record)
            except ClaimError as exc:
                results[ref.uid] = PrepareResult(error=str(exc))
            except Exception as exc:  # a bug for one claim must not fail the others
                log.exception("prepare failed", extra={"kv": {"claim": ref.uid}})
                results[ref.uid] = PrepareResult(
                    error=f"internal error preparing claim {ref.namespace}/{ref.name}: {exc}"
                )
        if records:
            try:
                outcomes = await self._commit.apply(lambda state: record_claims(state, records))
            except Exception as exc:  # noqa: BLE001 - the kubelet gets an error for these claims, never none
                for record in records:
                    results[record.uid] = PrepareResult(error=f"not prepared: {exc}")
            else:
                stored = [o for o in outcomes if isinstance(o, PreparedClaim)]
                if self.after_commit is not None:
                    self.after_commit([r.uid for r in stored])
                for record, outcome in zip(records, outcomes, strict=True):
                    if isinstance(outcome, ClaimError) and self.profiles:  # refused: free what it resolved
                        profiled = [(d.snapshot, d.config) for d in record.devices]
                        await loop.run_in_executor(pool, self.profiles.release_devices, record.uid, profiled)
                    results[record.uid] = (
                        PrepareResult(error=str(outcome)) if isinstance(outcome, ClaimError) else result_of(outcome)
                    )
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
