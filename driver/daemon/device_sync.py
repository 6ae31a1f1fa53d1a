"""The node's device inventory, kept current: full scans, link events -> device updates, the rescan loop.

Link events keep the inventory current one device at a time (:mod:`driver.inventory.incremental`):
an event the NRI hooks caused themselves (announced in :class:`HookActivity`) is dropped, one for
an excluded interface too, the rest are coalesced per link and each rebuilds the one device it
feeds. A full scan runs at start, on the resync timer, when events were lost and when the cloud
metadata changed. Every device list passes the cloud attributes, the admin ``--filter``, the
allocated devices' snapshots and the sharing filter before it is handed on (to the publisher and the health monitor).

Scans and link updates wait while an NRI hook runs (:meth:`HookActivity.idle`) and do their
blocking work (sysfs walks, netlink dumps) in a worker thread, so gRPC calls are answered meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from driver.checkpoint.state import DriverState
from driver.checkpoint.store import CheckpointStore
from driver.config import DriverConfig
from driver.inventory.cloud.detection import effective_provider
from driver.inventory.cloud.metadata import MetadataClient
from driver.inventory.cloud.service import CloudMetadata
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner, merge_allocated
from driver.inventory.incremental import LinkChange, LinkUpdater
from driver.inventory.sharing import Sharing
from driver.metrics import Metrics
from driver.model.device import Device, rdma_count
from driver.netlink.hook_activity import HookActivity
from driver.netlink.link_watch import LinkEvent

log = logging.getLogger(__name__)

LINK_COALESCE = 0.02  # s: the events of one change (flags, then operstate) fold into one update


def _allocated_snapshots(state: DriverState) -> dict[str, Device]:
    """Device snapshots of prepared claims: published even while their netdev sits in a pod."""
    return {d.device: d.snapshot for claim in state.claims.values() for d in claim.devices}


class DeviceSync:
    """Owns the inventory (``name -> Device``) and every way it changes: full scans and link updates.

    ``on_inventory`` is called after every change; :meth:`devices` is the whole list then.
    """

    def __init__(
        self,
        config: DriverConfig,
        store: CheckpointStore,
        metrics: Metrics,
        hook_activity: HookActivity,
        on_inventory: Callable[[], None],
    ) -> None:
        self.config = config
        self.inventory: dict[str, Device] = {}
        self.scanned = False
        self.store = store
        self.metrics = metrics
        self.hook_activity = hook_activity
        self._on_inventory = on_inventory
        self._rescan = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cloud = CloudMetadata(
            effective_provider(config.cloud_provider, config.host_sysfs, config.cloud_metadata_url),
            MetadataClient(config.cloud_metadata_url),
            config.sysfs_root,
            on_change=self.request_rescan,
        )
        self.list_numa = config.list_numa_attribute  # turned off at start if the apiserver cannot take it
        self.scanner = Scanner(
            config.sysfs_root,
            netlink=config.host_sysfs,
            exclude_interfaces=config.exclude_interfaces,
            numa_list=self.list_numa,
        )
        # Compiled here so a bad --filter stops the daemon at start.
        self.device_filter = DeviceFilter(config.filter, config.driver_name) if config.filter else None
        sharing = Sharing(config.sharing_filter, config.sharing_max_interfaces, config.driver_name)
        # None: no NIC shared (none selected, or the apiserver cannot count capacity: see the daemon).
        self.sharing: Sharing | None = sharing if sharing.enabled else None
        self.updater = LinkUpdater(self.scanner)
        self._pending: dict[int | str, LinkChange] = {}  # link changes not applied yet, by ifindex
        self._link_wake = asyncio.Event()
        self._inventory_lock = asyncio.Lock()  # one full scan or link update at a time

    def bind_loop(self) -> None:
        """Remember the running event loop, so :meth:`request_rescan` works from other threads."""
        self._loop = asyncio.get_running_loop()

    # -- building device lists (blocking: worker threads) ------------------------------------

    def _filter_and_merge(self, devices: list[Device], names: set[str] | None = None) -> list[Device]:
        """Filter, then re-add allocated devices (published while their netdev is in a pod).

        ``names``: only these device names are being rebuilt (a link update): only their
        allocated snapshots take part.
        """
        # Cloud attributes before the filter, so an admin filter can select on them too.
        devices = self.cloud.annotate(devices)
        if self.device_filter is not None:
            devices = self.device_filter.apply(devices)
        allocated = self.store.read(_allocated_snapshots)
        if names is not None:
            allocated = {n: d for n, d in allocated.items() if n in names}
        devices = merge_allocated(devices, allocated)
        return self.sharing.apply(devices) if self.sharing is not None else devices

    def _scan_fn(self) -> list[Device]:
        """A full scan, filtered and merged (blocking: runs in a worker thread)."""
        self.scanner.numa_list = self.list_numa
        return self._filter_and_merge(self.scanner.scan())

    def _update_fn(self, changes: list[LinkChange]) -> tuple[dict[str, Device], set[str]] | None:
        """The devices ``changes`` rebuild and the names they remove; None: a full scan is needed.

        Blocking (a worker thread); between two links it waits while an NRI hook runs.
        """
        delta = self.updater.apply(changes, pause=self.hook_activity.wait_idle)
        if delta.full_scan:
            return None
        names = set(delta.updated) | delta.removed
        merged = {d.name: d for d in self._filter_and_merge(list(delta.updated.values()), names)}
        return merged, names - set(merged)

    # -- full scans --------------------------------------------------------------------------

    def request_rescan(self) -> None:
        """Ask for a rescan soon (coalesced); safe to call from any thread."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is None or running is self._loop:
            self._rescan.set()
        else:
            self._loop.call_soon_threadsafe(self._rescan.set)

    async def rescan(self) -> None:
        """One full scan in a worker thread, then hand the inventory on."""
        await self.hook_activity.idle()
        async with self._inventory_lock:
            started = time.perf_counter()
            self._pending.clear()  # the scan sees what those events announced
            devices = await asyncio.to_thread(self._scan_fn)
            self.metrics.count_inventory_update("full_scan")
            self.inventory = {d.name: d for d in devices}
            self.scanned = True
            self._publish()
            log.info(
                "scan done",
                extra={
                    "kv": {
                        "devices": len(devices),
                        "rdma": rdma_count(devices),
                        "ms": round((time.perf_counter() - started) * 1000, 1),
                    }
                },
            )

    def devices(self) -> list[Device]:
        """The inventory, sorted by name."""
        return [self.inventory[n] for n in sorted(self.inventory)]

    def _publish(self) -> None:
        self._on_inventory()

    async def rescan_loop(self) -> None:
        """Full scans on the resync timer and whenever one is requested (:meth:`request_rescan`)."""
        while True:
            try:
                await asyncio.wait_for(self._rescan.wait(), timeout=self.config.resync_interval)
            except TimeoutError:
                pass
            self._rescan.clear()
            try:
                await self.rescan()
            except Exception:  # a failed scan keeps the last inventory; try again next time
                log.exception("rescan failed")

    # -- link events -------------------------------------------------------------------------

    def on_link_events(self, events: list[LinkEvent]) -> None:
        """Sort a batch of host link events (event loop): own and excluded ones dropped, the rest queued."""
        state = self.scanner.state
        own = ignored = queued = 0
        for ev in events:
            if self.hook_activity.is_own(ev.index, ev.ifname):
                own += 1
            elif ev.ifname in self.config.exclude_interfaces or (state is not None and ev.ifname in state.roots):
                ignored += 1
            else:
                self._pending[ev.index or ev.ifname] = LinkChange(ev.index, ev.ifname)
                queued += 1
        for outcome, count in (("own", own), ("ignored", ignored), ("update", queued)):
            if count:
                self.metrics.link_events.labels(outcome).inc(count)
        if queued:
            self._link_wake.set()

    async def link_update_loop(self) -> None:
        """Apply the queued link changes (coalesced, once no hook runs), one device each."""
        while True:
            await self._link_wake.wait()
            await asyncio.sleep(LINK_COALESCE)
            await self.hook_activity.idle()
            self._link_wake.clear()
            if not self._pending:
                continue
            async with self._inventory_lock:
                changes = list(self._pending.values())
                self._pending.clear()
                result = await asyncio.to_thread(self._update_fn, changes)
                if result is None:
                    self.request_rescan()
                    continue
                self.metrics.count_inventory_update("link", len(changes))
                updated, removed = result
                changed = {n for n, d in updated.items() if self.inventory.get(n) != d}
                changed |= {n for n in removed if n in self.inventory}
                if not changed:
                    continue
                for name in removed:
                    self.inventory.pop(name, None)
                self.inventory.update(updated)
                self._publish()
                log.debug("link update", extra={"kv": {"links": len(changes), "devices": sorted(changed)}})
