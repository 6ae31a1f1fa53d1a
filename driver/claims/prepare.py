"""NodePrepareResources / NodeUnprepareResources: the kubelet's claims to checkpointed devices.

The kubelet sends only claim identities (namespace, name, UID). For each claim we
GET the ResourceClaim (concurrently, before any serialization: those calls are the
slow part), keep the allocation results of our driver, check they are in our node's
pool and in our inventory, and record a :class:`PreparedClaim` with a device snapshot
and its decoded, validated config in the checkpoint. That record is all the NRI hooks
need at pod start, and it is what makes a retried prepare (also after a crash and
restart) return the same answer without asking the API server again.

Checkpoint mutations go through a group commit: concurrent prepares and unprepares
are applied in arrival order, atomically, and persisted with one fsynced write per
batch. That queue is the serialization point (the Go helper's mutex): decisions that
depend on the stored state are made inside the mutation, under the store's lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from driver.checkpoint import CheckpointStore, DriverState, PreparedClaim, PreparedDevice
from driver.claims.conflicts import conflict_errors, interface_conflicts
from driver.claims.fields import ConfigError
from driver.claims.merge import configs_for_request, merge_under_cloud
from driver.claims.numa_pinning import device_numa_node, numa_pin_node
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound
from driver.model.device import Device
from driver.model.network_config import NetworkConfig
from driver.netlink.ethtool import check_features
from driver.netlink.offload_sizes import check_host_nic

log = logging.getLogger(__name__)
T = TypeVar("T")

CLAIM_LOOKUP_THREADS = 16
"""Concurrent claim lookups (checkpoint read + GET); matches the API client's connection pool."""

ConfigDecoder = Callable[[list[dict[str, Any]], str, str], NetworkConfig]
"""``(allocation_configs, request, driver) -> NetworkConfig``: the decoded, validated config of one
allocated device (:func:`~driver.claims.merge.configs_for_request`); stored typed per device."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepare/NodeUnprepare requests."""

    namespace: str
    name: str
    uid: str


@dataclass
class ResultDevice:
    """One device of a prepared claim, as returned to the kubelet."""

    request_names: list[str]
    pool: str
    device: str
    cdi_device_ids: list[str] = field(default_factory=list)
    share_id: str | None = None


@dataclass
class PrepareResult:
    """Per-claim outcome: devices, or a non-empty error (then devices are ignored)."""

    devices: list[ResultDevice] = field(default_factory=list)
    error: str = ""


class ClaimError(Exception):
    """A claim cannot be prepared; the message is returned to the kubelet for that claim only."""


def base_request(request: str) -> str:
    """The request name without a subrequest suffix (``"nic/sub"`` -> ``"nic"``)."""
    return request.split("/", 1)[0]


class _GroupCommit:
    """Applies checkpoint mutations in arrival order, batching concurrent ones into one write."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store
        self._pending: list[tuple[Callable[[DriverState], Any], asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

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
                # fsync blocks for milliseconds: keep it off the event loop.
                await asyncio.to_thread(self._store.update, run_batch)
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


class Preparer:
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
    ) -> None:
        """``devices`` returns the current inventory by device name; ``config_decoder`` turns
        the allocation's config entries into the per-device config (decoded once, here);
        ``after_commit`` is called with the claim UIDs just persisted (tests use it to crash the
        process between the checkpoint write and the response); ``on_unprepare`` gets each claim
        that unprepare removed (the claim status writer drops our entries); ``cloud_config`` gives the
        cloud provider's config of a device, merged under the claim's (the Go driver's order);
        ``on_error`` gets each claim answered with an error (the status writer posts an event on it)."""
        self.kube, self.store, self.devices = kube, store, devices
        self.driver_name, self.node_name = driver_name, node_name
        self.config_decoder = config_decoder
        self.after_commit, self.on_unprepare = after_commit, on_unprepare
        self.cloud_config = cloud_config
        self.on_error = on_error
        self._commit = _GroupCommit(store)
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
                results[ref.uid] = _result_of(claim)  # the kubelet's retry: answered from the checkpoint
                continue
            try:
                if isinstance(claim, BaseException):
                    raise claim
                record = self.build(ref, claim)
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
                outcomes = await self._commit.apply(lambda state: _record(state, records))
            except Exception as exc:  # noqa: BLE001 - the kubelet gets an error for these claims, never none
                for record in records:
                    results[record.uid] = PrepareResult(error=f"not prepared: {exc}")
            else:
                stored = [o for o in outcomes if isinstance(o, PreparedClaim)]
                if self.after_commit is not None:
                    self.after_commit([r.uid for r in stored])
                for record, outcome in zip(records, outcomes, strict=True):
                    results[record.uid] = (
                        PrepareResult(error=str(outcome)) if isinstance(outcome, ClaimError) else _result_of(outcome)
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

    def build(self, ref: ClaimRef, claim: dict[str, Any], inventory: dict[str, Device] | None = None) -> PreparedClaim:
        """The record of ``claim``: our allocated devices with their snapshots (from ``inventory``,
        default the current one) and decoded configs; :class:`ClaimError` when it cannot be prepared."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(f"{where} was replaced: it has UID {uid}, the kubelet asked for {ref.uid}")
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise ClaimError(f"{where} is not allocated (status.allocation is empty)")
        alloc_devices = allocation.get("devices") or {}
        configs = alloc_devices.get("config") or []
        inventory = self.devices() if inventory is None else inventory
        prepared: list[PreparedDevice] = []
        requests: list[str] = []  # each prepared device's request (with its subrequest)
        for index, result in enumerate(alloc_devices.get("results") or []):
            if result.get("driver") != self.driver_name:
                continue  # another driver's device in a mixed claim
            path = f"status.allocation.devices.results[{index}]"
            pool, name, request = result.get("pool"), result.get("device"), result.get("request") or ""
            if pool != self.node_name:
                raise ClaimError(f"{where}: {path}.pool is {pool!r}, not this node's pool {self.node_name!r}")
            device = inventory.get(name or "")
            if device is None:
                raise ClaimError(f"{where}: {path}.device {name!r} is not a device of this node")
            base = base_request(request)
            try:
                config = self.config_decoder(configs, request or base, self.driver_name)
            except ClaimError:
                raise
            except Exception as exc:  # noqa: BLE001 - decoder errors name the field; pass them on per claim
                raise ClaimError(f"{where}: config for request {base!r}: {exc}") from None
            cloud = self.cloud_config(device) if self.cloud_config is not None else None
            config = merge_under_cloud(cloud, config)
            _check_ethtool(where, base, device, config)
            shared = result.get("adminAccess") is True or bool(result.get("shareID"))
            prepared.append(
                PreparedDevice(
                    request=base,
                    pool=pool,
                    device=name,
                    snapshot=device,
                    config=config,
                    cloud_config=cloud,
                    shared=shared,
                )
            )
            requests.append(request or base)
        pod_uids = [
            r["uid"]
            for r in status.get("reservedFor") or []
            if r.get("resource") == "pods" and r.get("apiGroup", "") in ("", None) and r.get("uid")
        ]
        nics = [(f"request {r!r} (device {d.device})", r, d.config) for r, d in zip(requests, prepared, strict=True)]
        errors = conflict_errors(
            interface_conflicts(nics), configs, self.driver_name, "status.allocation.devices.config"
        )
        if errors:
            raise ClaimError(f"{where}: {'; '.join(str(e) for e in errors)}")
        try:
            # numa.pin across NICs on several NUMA nodes can never be honoured: refuse it now,
            # as a per-claim error, rather than start a pod that silently runs unpinned.
            numa_pin_node(
                ((d.config, device_numa_node(d), d.device) for d in prepared),
                "status.allocation.devices.config: numa.pin",
            )
        except ConfigError as exc:
            raise ClaimError(f"{where}: {exc}") from None
        return PreparedClaim(uid=ref.uid, namespace=ref.namespace, name=ref.name, pod_uids=pod_uids, devices=prepared)

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
        for claim in removed if self.on_unprepare else ():
            try:
                self.on_unprepare(claim)  # type: ignore[misc]
            except Exception:
                log.exception("on_unprepare failed", extra={"kv": {"claim": claim.uid}})
        return {u: "" for u in uids}


def _check_ethtool(where: str, request: str, device: Device, config: NetworkConfig) -> None:
    """Refuse, at prepare, ethtool settings and offload sizes the NIC cannot take (like the Go driver
    for ethtool), rather than fail at pod start. Only devices whose config sets them pay the netlink call."""
    sizes = config.interface.offload_sizes if config.interface else {}
    if sizes and device.host.ifname:  # GSO/GRO sizes above the NIC's or kernel's maximum: refused now too
        problems = check_host_nic(device.host.ifname, sizes)
        if problems:
            raise ClaimError(f"{where}: config for request {request!r}: {'; '.join(problems)}")
    eth = config.ethtool
    if eth is None or eth.empty:
        return
    if not device.host.ifname:
        raise ClaimError(f"{where}: config for request {request!r}: ethtool: device {device.name} has no netdev")
    problems = check_features(device.host.ifname, eth.features, private_flags=eth.private_flags)
    if problems:
        raise ClaimError(f"{where}: config for request {request!r}: {'; '.join(problems)}")


def _record(state: DriverState, records: list[PreparedClaim]) -> list[PreparedClaim | ClaimError]:
    """Store new claims (under the store's lock: decided against every claim stored so far).

    A claim a concurrent call stored first keeps its original record. A claim that wants a device
    another stored claim holds is refused with the holder's name, unless one of the two holds
    it shared (adminAccess): a NIC moves into one pod, it cannot be in two.
    """
    holders: dict[tuple[str, str], PreparedClaim] = {
        (d.pool, d.device): c for c in state.claims.values() for d in c.devices if not d.shared
    }
    out: list[PreparedClaim | ClaimError] = []
    for record in records:
        existing = state.claims.get(record.uid)
        if existing is not None:
            out.append(existing)
            continue
        taken = [
            (d.device, holders[(d.pool, d.device)])
            for d in record.devices
            if not d.shared and (d.pool, d.device) in holders
        ]
        if taken:
            device, holder = taken[0]
            out.append(
                ClaimError(
                    f"ResourceClaim {record.namespace}/{record.name}: device {device} is already held by "
                    f"ResourceClaim {holder.namespace}/{holder.name} (uid {holder.uid}); a device can be in "
                    "one claim at a time unless allocated with adminAccess"
                )
            )
            continue
        state.claims[record.uid] = record
        holders.update({(d.pool, d.device): record for d in record.devices if not d.shared})
        out.append(record)
    return out


def _result_of(record: PreparedClaim) -> PrepareResult:
    return PrepareResult(
        devices=[ResultDevice(request_names=[d.request], pool=d.pool, device=d.device) for d in record.devices]
    )
