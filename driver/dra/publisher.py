"""Publishes a driver's devices on one node as ResourceSlices, coalescing bursts of changes.

``update(devices)`` only records the desired set (cheap, thread-safe). ``run()`` (async) writes
at most once per ``interval``: the first change after a quiet period is written at once, a
burst that follows is folded into one write at the end of the interval. A watch on our own
slices (field selector ``spec.driver,spec.nodeName``) notices deletions by others (the kubelet
wipes a node's slices when it starts) and edits, and triggers a re-publish. The watch starts at
the resourceVersion of the LIST a sync made (no LIST of its own), and again after each error (the
error marks the pool dirty: the sync's LIST then checks it). While the watch runs, the slices as
that LIST, our writes' answers and the watch's events left them are what the next sync plans
against: a write round is its writes alone, no LIST (a write based on a stale copy fails its
resourceVersion check, and the sync lists and plans again). Our own writes come back as watch
events: they are told apart by the resourceVersions the writes returned, and an event that arrives
while a write is still waiting for its answer is judged once that answer is in, so an echo never
costs a re-list. Conflicts re-list and re-plan; a re-list every ``resync_interval`` (30 min) is
the last resort should a watch ever miss an event.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic

from driver.dra.protocol import D
from driver.dra.slices import CounterSets, SlicePlan, Taints, kept, plan_slices
from driver.kube.client import KubeClient
from driver.kube.errors import Conflict, KubeError, NotFound

log = logging.getLogger(__name__)


@dataclass
class PublishStats:
    """Counters for tests and benchmarks."""

    syncs: int = 0  # list+plan rounds
    writes: int = 0  # API write calls (create/update/delete)
    write_rounds: int = 0  # syncs that wrote anything
    conflicts: int = 0
    errors: int = 0
    last_write: float = 0.0  # time.monotonic() of the last write round


class SlicePublisher(Generic[D]):
    """Keeps the node's pool of ResourceSlices equal to the last `update()`."""

    def __init__(
        self,
        kube: KubeClient,
        driver_name: str,
        node_name: str,
        interval: float = 2.0,
        on_published: Callable[[list[D], bool], None] | None = None,
        resync_interval: float = 1800.0,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.kube, self.driver_name, self.node_name = kube, driver_name, node_name
        self.interval, self.resync_interval = interval, resync_interval
        # Called after each successful sync with the devices and whether anything was written.
        self.on_published = on_published
        # Awaited before each write round: the round (plan, JSON, HTTP) waits while an NRI hook runs.
        self.quiet = quiet
        self.stats = PublishStats()
        self.node_uid: str | None = None
        self._lock = threading.Lock()
        self._desired: list[D] | None = None
        self._counter_sets: list[dict[str, Any]] = []  # the pool's shared counters, written with the devices
        self._taints: dict[str, list[dict[str, Any]]] = {}  # device -> taints, written with the devices
        self._version = 0  # bumped by every update() and every foreign slice event
        self._synced_version = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = threading.Event()
        self._own_rvs: set[str] = set()  # resourceVersions our writes produced (watch echo)
        self._own_deletes: set[str] = set()  # names of slices we deleted (watch echo)
        self._watch_resp: Any = None
        # Writes waiting for their answer (their resourceVersion is not known yet), and the
        # resourceVersion of each sync's LIST (the watch starts there), under one condition.
        self._cond = threading.Condition()
        self._writing = 0
        self._listed: tuple[int, str] = (0, "")  # (LISTs so far, the last one's resourceVersion)
        # Our slices by name as the apiserver has them, devices as their digest (:func:`kept`), kept
        # by the watch (None: not known, LIST), and whether a watch runs that started at or after
        # the LIST they came from.
        self._known: dict[str, dict[str, Any]] | None = None
        self._watched = False

    # -- producer side -----------------------------------------------------------------------

    def update(self, devices: list[D], counter_sets: CounterSets = ()) -> None:
        """Record the desired device set and the counter sets its devices consume from; the next write
        picks them up. Callable from any thread. The same again (a periodic rescan that found nothing
        new) costs nothing: no LIST."""
        devices, sets = list(devices), [dict(c) for c in counter_sets]
        with self._lock:
            if devices == self._desired and sets == self._counter_sets:
                return
            self._desired, self._counter_sets = devices, sets
            self._version += 1
        self._poke()

    def set_taints(self, taints: Taints) -> None:
        """Record the devices' taints; written with the next slice write (same coalescing and rate
        limit as device changes). Callable from any thread; an unchanged set costs nothing."""
        with self._lock:
            new = {k: list(v) for k, v in taints.items() if v}
            if new == self._taints:
                return
            self._taints = new
            self._version += 1
        self._poke()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # loop closing
                pass

    def _dirty(self) -> None:
        with self._lock:
            self._version += 1
        self._poke()

    @property
    def selector(self) -> str:
        """Field selector for this driver's slices of this node."""
        return f"spec.driver={self.driver_name},spec.nodeName={self.node_name}"

    # -- loop --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish until cancelled or `stop()`; never raises on API errors (logs and retries)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stop.clear()
        await self._lookup_node()
        watcher = threading.Thread(target=self._watch_loop, name="slice-watch", daemon=True)
        watcher.start()
        backoff = 0.5
        try:
            while not self._stop.is_set():
                with self._lock:
                    pending = self._desired is not None and self._version != self._synced_version
                if not pending:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self.resync_interval)
                    except TimeoutError:
                        self._forget_slices()
                        self._dirty()  # periodic re-list: repairs anything a broken watch missed
                    continue
                # Rate limit: at most one write round per interval; what arrives meanwhile is
                # folded into the next round because we snapshot only after the wait.
                wait = self.stats.last_write + self.interval - time.monotonic()
                if self.stats.last_write and wait > 0:
                    await asyncio.sleep(wait)
                if self.quiet is not None:
                    await self.quiet()
                try:
                    await asyncio.to_thread(self.sync)
                    backoff = 0.5
                except Exception as exc:  # noqa: BLE001 - keep publishing whatever the API says
                    self.stats.errors += 1
                    log.warning(
                        "publishing ResourceSlices failed", extra={"kv": {"error": str(exc), "retry_s": backoff}}
                    )
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
        finally:
            self._stop.set()
            self._close_watch()
            self._loop = None

    def stop(self) -> None:
        """Ask `run()` to return (thread-safe)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._close_watch()
        self._poke()

    async def _lookup_node(self) -> None:
        # The node UID is needed for the owner reference; it never changes for a node object,
        # so one GET (retried until the Node exists) is enough.
        delay = 0.2
        while self.node_uid is None and not self._stop.is_set():
            try:
                node = await asyncio.to_thread(self.kube.read_node, self.node_name)
                self.node_uid = node["metadata"]["uid"]
            except KubeError as exc:
                log.warning("node lookup failed", extra={"kv": {"node": self.node_name, "error": str(exc)}})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    # -- one sync round (blocking; runs in a worker thread) ---------------------------------------

    def list_slices(self) -> list[dict[str, Any]]:
        """Our driver's slices for this node, as the API has them (devices as their digest: :func:`kept`)."""
        listed = self.kube.list_resource_slice(self.selector)
        rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        items: list[dict[str, Any]] = [kept(s) for s in listed.get("items") or []]
        del listed  # the decoded devices go now, not after the plan
        with self._cond:
            self._listed = (self._listed[0] + 1, rv or self._listed[1])
            self._known = {s["metadata"]["name"]: s for s in items}
            self._cond.notify_all()
        return items

    def _slices(self, fresh: bool) -> list[dict[str, Any]]:
        """Our slices: as the watch keeps them, or (``fresh``, or not known) from a LIST."""
        with self._cond:
            known = None if fresh or self._known is None or not self._watched else list(self._known.values())
        return self.list_slices() if known is None else known

    def _forget_slices(self) -> None:
        with self._cond:
            self._known, self._watched = None, False

    def _keep(self, obj: dict[str, Any] | None, name: str) -> None:
        """Record a slice as the apiserver has it now (None: deleted), its devices as their digest."""
        slim = None if obj is None else kept(obj)
        with self._cond:
            if self._known is not None:
                if slim is None:
                    self._known.pop(name, None)
                else:
                    self._known[name] = slim

    def sync(self, attempts: int = 3) -> SlicePlan:
        """List, plan and apply once; re-list and re-plan on a conflict."""
        assert self.node_uid is not None, "node UID unknown"
        for attempt in range(attempts):
            with self._lock:
                devices = list(self._desired or [])
                taints = dict(self._taints)
                sets = list(self._counter_sets)
                version = self._version
            existing = self._slices(fresh=attempt > 0)
            names = {d.name for d in devices}
            taints = {k: v for k, v in taints.items() if k in names}
            plan = plan_slices(
                devices, existing, self.driver_name, self.node_name, self.node_uid, taints=taints, counter_sets=sets
            )
            self.stats.syncs += 1
            try:
                self._apply(plan)
            except (Conflict, NotFound) as exc:  # a slice changed or vanished since we listed: re-plan
                self.stats.conflicts += 1
                log.info("slice write conflict, re-listing", extra={"kv": {"error": str(exc), "attempt": attempt}})
                continue
            with self._lock:
                self._synced_version = version
            self._after_publish(devices, plan)
            return plan
        raise RuntimeError(f"ResourceSlice sync still conflicting after {attempts} attempts")

    def _apply(self, plan: SlicePlan) -> None:
        if plan.empty:
            return
        self.stats.write_rounds += 1
        self.stats.last_write = time.monotonic()
        with self._cond:
            self._writing += 1
        try:
            self._write(plan)
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify_all()

    def _write(self, plan: SlicePlan) -> None:
        # The new generation first, whole, then the old one goes (Kubernetes' own slice controller's
        # order): a reader never sees a pool of the old generation missing slices, only, for a
        # moment, the new one complete beside leftovers of the old, which the newer generation
        # tells it to ignore.
        for s in plan.update:
            self.stats.writes += 1
            out = self.kube.replace_resource_slice(s["metadata"]["name"], s)
            self._own_rvs.add(out["metadata"]["resourceVersion"])
            self._keep(out, out["metadata"]["name"])
        for s in plan.create:
            self.stats.writes += 1
            out = self.kube.create_resource_slice(s)
            self._own_rvs.add(out["metadata"]["resourceVersion"])
            self._keep(out, out["metadata"]["name"])
        for s in plan.delete:
            meta = s["metadata"]
            self.stats.writes += 1
            self._own_deletes.add(meta["name"])
            try:
                # Preconditions: never delete a slice someone replaced since we listed it.
                self.kube.delete_resource_slice(meta["name"], meta["uid"], meta["resourceVersion"])
            except NotFound:
                pass  # already gone: what we wanted
            self._keep(None, meta["name"])
        log.info(
            "published ResourceSlices",
            extra={
                "kv": {
                    "node": self.node_name,
                    "generation": plan.generation,
                    "created": len(plan.create),
                    "updated": len(plan.update),
                    "deleted": len(plan.delete),
                }
            },
        )

    def _after_publish(self, devices: list[D], plan: SlicePlan) -> None:
        if self.on_published is not None:
            self.on_published(devices, not plan.empty)

    # -- watch (thread) --------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        """Watch our slices; any change we did not make marks the pool dirty."""
        rv = ""
        after = 0  # a LIST later than this many: the first sync's, or the one after an error
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._next_list_rv(after)
                    if not rv:
                        return  # stopped
                rv = self._watch_once(rv)
            except Exception as exc:  # noqa: BLE001 - a broken watch just restarts
                if self._stop.is_set():
                    return
                log.debug("slice watch restarting", extra={"kv": {"error": str(exc)}})
                rv = ""
                with self._cond:
                    after = self._listed[0]
                    self._known, self._watched = None, False  # events may be lost: the next sync lists
                self._dirty()  # we may have missed events: the sync's LIST re-checks the pool
                self._stop.wait(1.0)

    def _next_list_rv(self, after: int) -> str:
        """The resourceVersion of the first sync's LIST after the ``after``-th ("" once stopped)."""
        with self._cond:
            while not self._stop.is_set():
                count, rv = self._listed
                if count > after and rv:
                    return rv
                self._cond.wait(1.0)
        return ""

    def _own_write(self, kind: str, rv: str, name: str) -> bool:
        """Whether an event is the echo of our own write (forgetting it then)."""
        if kind in ("ADDED", "MODIFIED") and rv in self._own_rvs:
            self._own_rvs.discard(rv)
            return True
        if kind == "DELETED" and name in self._own_deletes:
            self._own_deletes.discard(name)
            return True
        return False

    def _watch_once(self, rv: str) -> str:
        resp = self.kube.watch_resource_slice(self.selector, rv)
        self._watch_resp = resp
        with self._cond:
            self._watched = True  # from here the watch keeps the slices of the LIST it started at
        try:
            buf = b""
            for chunk in resp.stream(4096, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        rv = self._on_event(json.loads(line), rv)
                if self._stop.is_set():
                    break
        finally:
            with self._cond:
                self._watched = False
            self._watch_resp = None
            resp.release_conn()
        return rv

    def _on_event(self, event: dict[str, Any], rv: str) -> str:
        kind, obj = event.get("type"), event.get("object", {})
        if kind == "ERROR":
            # 410 Gone: our resourceVersion is too old; start over with a fresh list.
            raise RuntimeError(f"watch error: {obj.get('message')}")
        new_rv = obj.get("metadata", {}).get("resourceVersion", rv)
        if kind == "BOOKMARK":
            return new_rv
        name = obj.get("metadata", {}).get("name", "")
        if self._own_write(str(kind), new_rv, name):
            return new_rv
        with self._cond:
            # The echo can come before the write's answer: judge it once the writes in flight are answered.
            if self._writing and self._cond.wait_for(lambda: not self._writing, timeout=60.0):
                if self._own_write(str(kind), new_rv, name):
                    return new_rv
        if len(self._own_rvs) > 1000:  # echoes lost across a watch restart: don't grow forever
            self._own_rvs.clear()
        log.info(
            "ResourceSlice changed by someone else, re-publishing",
            extra={"kv": {"event": kind, "slice": obj.get("metadata", {}).get("name")}},
        )
        self._keep(obj if kind in ("ADDED", "MODIFIED") else None, name)
        self._dirty()
        return new_rv

    def _close_watch(self) -> None:
        resp = self._watch_resp
        if resp is not None:
            try:
                resp.shutdown()  # urllib3 >= 2.3: unblocks a read in another thread
            except Exception:  # noqa: BLE001 - best effort: the watch thread ends either way
                pass
