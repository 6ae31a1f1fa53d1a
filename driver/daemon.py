"""``dranet run``: the node daemon, every component in one asyncio loop.

Start order: checkpoint (fail if unreadable or from a newer driver: never drop state; a
corrupt file is moved aside), first discovery scan (so the first prepare finds the inventory),
the prepared claims rebuilt from the API server if the checkpoint was corrupt, kubelet plugin (DRA socket, then
registration), the HTTP probe server (/healthz, /metrics), then the background loops: ResourceSlice publisher,
full rescans (periodic resync, lost link events), link updates, NRI plugin.
SIGTERM/SIGINT stop the gRPC servers, remove the sockets and exit 0.

Link events keep the inventory current one device at a time (:mod:`driver.inventory.incremental`):
an event the NRI hooks caused themselves (announced in :class:`OwnChanges`) is dropped, one for
an excluded interface too, the rest are coalesced per link and each rebuilds the one device it
feeds. A full scan runs at start, on the resync timer and when events were lost.

While an NRI hook runs, background work waits (:meth:`OwnChanges.idle`): link updates, rescans,
ResourceSlice writes and claim status writes start only when no hook is running, so a hook never
competes with them for the interpreter lock. Blocking work (sysfs walks, netlink dumps) runs in a
worker thread so gRPC calls are answered meanwhile. Background components run under a guard that
restarts them with backoff, so none can take the kubelet's socket down.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import resource
import signal
import time
from collections.abc import Callable
from typing import Any

from driver.checkpoint import CheckpointError, CheckpointStore, DriverState, claim_device_counts
from driver.claims.prepare import Preparer
from driver.claims.profile import check_at_start, profile_resolver
from driver.claims.recovery import rebuild_prepared_claims
from driver.claims.status import ClaimStatusWriter
from driver.config import DriverConfig, config_from_args
from driver.inventory.cloud.detection import effective_provider
from driver.inventory.cloud.metadata import MetadataClient
from driver.inventory.cloud.service import CloudMetadata
from driver.inventory.device_filter import DeviceFilter, FilterError
from driver.inventory.discovery import Scanner, merge_allocated
from driver.inventory.discovery_cli import sysfs_root_error
from driver.inventory.incremental import LinkChange, LinkUpdater
from driver.kube.client import KubeClient
from driver.kubelet.device_health import DeviceHealthFeed, DeviceHealthState
from driver.kubelet.health_monitor import HealthMonitor
from driver.kubelet.plugin import KubeletPlugin
from driver.metrics import Metrics
from driver.model.device import Device, rdma_count
from driver.netlink import rdma_netns
from driver.netlink.link_watch import LinkEvent, LinkWatcher
from driver.netlink.own_changes import OwnChanges
from driver.node_lease import POLL_INTERVAL, NodeLease
from driver.probe_server import ProbeServer, parse_bind_address
from driver.publish.device_taints import OFF, UnhealthyTaints, device_taints_accepted
from driver.publish.list_attributes import list_attributes_accepted
from driver.publish.publisher import SlicePublisher

log = logging.getLogger(__name__)

CLOUD_STARTUP_WAIT = 3.0
"""Seconds the first scan waits for cloud metadata: a healthy service's attributes are then in the
first publish; a down or slow one costs at most this, and its attributes follow in a republish."""
STATE_WRITE_RETRY_S = 5.0
"""Seconds between retries of a failed state write (see :meth:`Daemon._state_write_retry_loop`)."""
LINK_COALESCE = 0.02  # s: the events of one change (flags, then operstate) fold into one update


def _allocated_snapshots(state: DriverState) -> dict[str, Device]:
    """Device snapshots of prepared claims: published even while their netdev sits in a pod."""
    return {d.device: d.snapshot for claim in state.claims.values() for d in claim.devices}


class Daemon:
    """Owns the components of one node driver and their lifecycle."""

    def __init__(
        self, config: DriverConfig, kube: KubeClient, store: CheckpointStore, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.kube = kube
        self.store = store
        self.metrics = metrics or Metrics()
        self.metrics.watch_claim_devices(lambda: store.read(claim_device_counts))
        self.inventory: dict[str, Device] = {}
        self.scanned = False
        self.stopping = asyncio.Event()
        self._rescan = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cloud = CloudMetadata(
            effective_provider(config.cloud_provider, config.host_sysfs, config.cloud_metadata_url),
            MetadataClient(config.cloud_metadata_url),
            config.sysfs_root,
            on_change=self.request_rescan,
        )
        self.list_numa = config.list_numa_attribute  # turned off at start if the apiserver cannot take it
        self.rdma_mode = rdma_netns.UNKNOWN  # detected at start: exclusive mode moves RDMA devices with NICs
        # The NRI hooks announce themselves and the links they change here (shared with them).
        self.own_changes = OwnChanges()
        self.scanner = Scanner(
            config.sysfs_root,
            netlink=config.host_sysfs,
            exclude_interfaces=config.exclude_interfaces,
            numa_list=self.list_numa,
        )
        # Compiled here so a bad --filter stops the daemon at start.
        self.device_filter = DeviceFilter(config.filter, config.driver_name) if config.filter else None
        self.updater = LinkUpdater(self.scanner)
        self._pending: dict[int | str, LinkChange] = {}  # link changes not applied yet, by ifindex
        self._link_wake = asyncio.Event()
        self._inventory_lock = asyncio.Lock()  # one full scan or link update at a time
        self.publisher = SlicePublisher(
            kube,
            config.driver_name,
            config.node_name,
            interval=config.publish_interval,
            metrics=self.metrics,
            quiet=self.own_changes.idle,
        )
        self.status_writer = ClaimStatusWriter(
            kube,
            config.node_name,
            driver_name=config.driver_name,
            sysfs_root=config.sysfs_root,
            quiet=self.own_changes.wait_idle,
        )
        self.health_feed = DeviceHealthFeed()
        # Several instances on one node (rolling update): only the lease holder moves NICs and
        # writes slices (driver/node_lease.py); both serve the kubelet.
        self.lease = NodeLease(config.runtime_dir, config.instance_id)
        self.taints = UnhealthyTaints(config.unhealthy_taint_effect)
        self.health = HealthMonitor(
            store,
            lambda: self.inventory,
            config.node_name,
            config.sysfs_root,
            config.host_netns,
            config.health_interval,
            self._health_changed,
            quiet=self.own_changes.idle,
        )
        self.nri: Any = None  # the NRIPlugin, once the NRI task built it
        # The preparer decodes claim configs strictly, once: a bad config is a per-claim error
        # naming the field, at prepare time, not a pod that fails to start.
        self.preparer = Preparer(
            kube,
            store,
            lambda: self.inventory,
            config.driver_name,
            config.node_name,
            on_unprepare=self._claim_unprepared,
            cloud_config=self.cloud.device_config,
            on_error=lambda ref, error: self.status_writer.prepare_failed(ref.namespace, ref.name, ref.uid, error),
            profiles=profile_resolver(config),
        )
        self.hooks: Any = None  # the NRIHooks, once the NRI task built them
        self.plugin = KubeletPlugin(config, self.preparer, health=self.health_feed, metrics=self.metrics)
        self.probes = ProbeServer(
            config.bind_address,
            self.metrics,
            self.ready,
            self.problems,
            serving=self.serving,
            claim_port=self.lease.request_port,
        )

    def _claim_unprepared(self, claim: Any) -> None:
        # NICs the runtime never asked back (no StopPodSandbox) go home first, then the status.
        if self.hooks is not None:
            self.hooks.claim_unprepared(claim)
        self.status_writer.claim_unprepared(claim)

    # -- construction ------------------------------------------------------------------------

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
        return merge_allocated(devices, allocated)

    def _scan_fn(self) -> list[Device]:
        """A full scan, filtered and merged (blocking: runs in a worker thread)."""
        self.scanner.numa_list = self.list_numa
        return self._filter_and_merge(self.scanner.scan())

    def _update_fn(self, changes: list[LinkChange]) -> tuple[dict[str, Device], set[str]] | None:
        """The devices ``changes`` rebuild and the names they remove; None: a full scan is needed.

        Blocking (a worker thread); between two links it waits while an NRI hook runs.
        """
        delta = self.updater.apply(changes, pause=self.own_changes.wait_idle)
        if delta.full_scan:
            return None
        names = set(delta.updated) | delta.removed
        merged = {d.name: d for d in self._filter_and_merge(list(delta.updated.values()), names)}
        return merged, names - set(merged)

    # -- state -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Alive (``/healthz``): the kubelet plugin serves and discovery ran at least once."""
        return self.plugin.serving and self.scanned

    def problems(self) -> list[str]:
        """Conditions ``/healthz`` and ``/readyz`` report (503) until they clear: state that cannot be saved."""
        error = self.store.write_error
        return [str(error)] if error is not None else []

    def serving(self) -> bool:
        """Ready (``/readyz``): alive, registered with the kubelet and (with NRI) synchronized with the
        runtime at least once (from then on it calls us for every event), so a rolling update
        replaces the old pod only once this one can take over."""
        nri_ok = not self.config.nri_enabled or (self.nri is not None and self.nri.synchronized > 0)
        return self.ready() and self.plugin.registered is True and nri_ok

    async def _health_changed(self, states: list[DeviceHealthState]) -> None:
        """New device health: to the kubelet's stream, and as taints into the slices."""
        await self.health_feed.set(states)
        self.publisher.set_taints(self.taints.update({s.device: s.reason for s in states if not s.healthy}))

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
        """One full scan in a worker thread, then publish and refresh the device health stream."""
        await self.own_changes.idle()
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

    def _publish(self) -> None:
        """Hand the inventory to the publisher (which sets the device gauges once the slices are
        written); have the health monitor look at the devices now."""
        devices = [self.inventory[n] for n in sorted(self.inventory)]
        self.publisher.update(devices)
        self.health.poke()

    async def _rescan_loop(self) -> None:
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

    async def _state_write_retry_loop(self) -> None:
        """While a state write is failing, try again every few seconds, so ``/healthz`` turns
        200 once the disk takes writes again even if no claim or pod changes meanwhile."""
        while True:
            await asyncio.sleep(STATE_WRITE_RETRY_S)
            if self.store.write_error is not None:
                await asyncio.to_thread(self.store.retry_write)

    # -- link events -------------------------------------------------------------------------

    def on_link_events(self, events: list[LinkEvent]) -> None:
        """Sort a batch of host link events (event loop): own and excluded ones dropped, the rest queued."""
        state = self.scanner.state
        own = ignored = queued = 0
        for ev in events:
            if self.own_changes.is_own(ev.index, ev.ifname):
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

    async def _link_update_loop(self) -> None:
        while True:
            await self._link_wake.wait()
            await asyncio.sleep(LINK_COALESCE)
            await self.own_changes.idle()
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

    async def _guard(self, name: str, coro_fn: Callable[[], Any]) -> None:
        """Run a background component; restart it after a crash (backoff 1 s .. 30 s) instead of
        taking the daemon, and with it the kubelet's DRA socket, down."""
        delay = 1.0
        while True:
            try:
                await coro_fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("component crashed, restarting", extra={"kv": {"component": name, "in_s": delay}})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until :attr:`stopping` is set; returns the exit code."""
        self._loop = asyncio.get_running_loop()
        if self.list_numa:
            await self._check_list_attributes()
        if self.taints.effect != OFF:
            await self._check_device_taints()
        if self.config.host_sysfs and self.config.nri_enabled:
            self.rdma_mode = await asyncio.to_thread(rdma_netns.netns_mode)
            log.info("RDMA netns mode", extra={"kv": {"mode": self.rdma_mode}})
        self.cloud.start()
        await asyncio.to_thread(self.cloud.wait, CLOUD_STARTUP_WAIT)
        try:
            await self.rescan()
        except Exception:
            log.exception("initial scan failed; serving an empty inventory until the next resync")
        if any(q.path == self.store.path for q in self.store.quarantined):
            # Before the kubelet plugin serves: the NRI hooks and the kubelet must find them.
            await rebuild_prepared_claims(self.preparer, self.kube)
        self.status_writer.start()
        await self.plugin.start()
        try:
            await self.probes.start()
            self.lease.port_taken(self.probes.port)
            self._start_background()
            # Everything built so far lives as long as the daemon: keep it out of the cyclic
            # collector's full passes, which would otherwise walk it (milliseconds) in the
            # middle of whatever hook allocates the object that triggers one.
            gc.collect()
            gc.freeze()
            await self.stopping.wait()
        finally:
            await self.shutdown()
        return 0

    async def _check_list_attributes(self) -> None:
        accepted, why = await asyncio.to_thread(
            list_attributes_accepted, self.kube, self.config.driver_name, self.config.node_name
        )
        if accepted:
            log.info("publishing resource.kubernetes.io/numaNode as a list (DRAListTypeAttributes)")
            return
        self.list_numa = False
        log.error(
            "--feature-gates DRAListTypeAttributes=true, but the apiserver cannot store list attributes; "
            "publishing resource.kubernetes.io/numaNode as an int (a list would make it reject every slice)",
            extra={"kv": {"why": why}},
        )

    async def _check_device_taints(self) -> None:
        accepted, why = await asyncio.to_thread(
            device_taints_accepted, self.kube, self.config.driver_name, self.config.node_name
        )
        if not accepted:
            self.taints.effect = OFF
            log.warning("unhealthy devices are not tainted in the ResourceSlice", extra={"kv": {"why": why}})

    def _acting(self) -> bool:
        """Whether this instance holds the node lease (taking it if free); blocking, cheap."""
        return self.hooks.acting() if self.hooks is not None else self.lease.try_acquire()

    async def _act_when_leased(self) -> None:
        """Write slices once this instance holds the node lease (at once, unless another instance
        on this node holds it: then when that one stops)."""
        if not await asyncio.to_thread(self._acting):
            log.info("standby: another driver instance on this node acts until it stops")
            while not await asyncio.to_thread(self._acting):
                await asyncio.sleep(POLL_INTERVAL)
        self._spawn("publisher", self.publisher.run)

    async def _yield_probe_port(self) -> None:
        """Give the probe port to a newer instance on this node when it asks (see node_lease)."""
        while self.lease.port_requested(self.probes.port) is None:
            await asyncio.sleep(POLL_INTERVAL * 2)
        log.info("probe port handed to a newer driver instance", extra={"kv": {"port": self.probes.port}})
        await self.probes.stop()

    def _spawn(self, name: str, fn: Callable[[], Any]) -> None:
        self._tasks.append(asyncio.create_task(self._guard(name, fn), name=name))

    def _start_background(self) -> None:
        spawn = self._spawn
        spawn("rescan", self._rescan_loop)
        spawn("state-write-retry", self._state_write_retry_loop)
        spawn("health", self.health.run)
        spawn("lease", self._act_when_leased)
        spawn("probe-port", self._yield_probe_port)
        if self.config.host_sysfs:
            spawn("link-updates", self._link_update_loop)
            spawn("link-watch", LinkWatcher(self.on_link_events, on_overflow=self.request_rescan).run)
        if self.config.nri_enabled:
            spawn("nri", self._run_nri)

    async def _run_nri(self) -> None:
        # Built inside the guard: a failing constructor (e.g. no access to the host netns) is
        # logged and retried, never fatal for the kubelet plugin.
        from driver.nri.handover import HandoverHooks
        from driver.nri.hooks import NRIHooks
        from driver.nri.plugin import NRIPlugin

        hooks = NRIHooks(
            self.store,
            status=self.status_writer,
            host_netns=self.config.host_netns,
            sysfs_root=self.config.sysfs_root,
            rdma_exclusive=self.rdma_mode == rdma_netns.EXCLUSIVE,
            own_changes=self.own_changes,
        )
        # Acts only while this instance holds the node lease (another instance may be connected).
        self.hooks = HandoverHooks(hooks, self.lease, self.config.runtime_dir)
        self.nri = NRIPlugin(self.config.nri_socket, handler=self.hooks, metrics=self.metrics)
        await self.nri.run()

    async def shutdown(self) -> None:
        """Stop the servers (removing the sockets) and the background tasks.

        Order for a rolling update: the kubelet sockets go first (the kubelet then calls the
        other instance), then the node lease is handed over (after the NRI event in progress),
        then the NRI connection and the publisher stop."""
        await self.plugin.stop()
        if self.hooks is not None:
            await asyncio.to_thread(self.hooks.retire)
        await asyncio.to_thread(self.lease.release)
        self.cloud.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.probes.stop()
        await asyncio.to_thread(self.status_writer.stop, 5.0)
        self.scanner.close()
        self.lease.close()
        log.info("daemon stopped")


async def _main(config: DriverConfig) -> int:
    try:
        store = CheckpointStore(config.state_dir, config.runtime_dir)
    except CheckpointError as exc:
        log.error("cannot load checkpoint; refusing to start without it", extra={"kv": {"error": str(exc)}})
        return 1
    try:
        kube = KubeClient.from_kubeconfig(config.kubeconfig)
    except Exception as exc:  # noqa: BLE001 - any client setup failure stops the daemon with its reason
        log.error(
            "cannot configure the Kubernetes client",
            extra={"kv": {"kubeconfig": config.kubeconfig or "<in-cluster>", "error": str(exc)}},
        )
        return 1
    try:
        daemon = Daemon(config, kube, store)
    except FilterError as exc:
        log.error("invalid --filter", extra={"kv": {"error": str(exc)}})
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stopping.set)
    log.info(
        "dranet starting",
        extra={
            "kv": {
                "node": config.node_name,
                "driver": config.driver_name,
                "sysfs": config.sysfs_root,
                "state_dir": config.state_dir,
                "nri": config.nri_enabled,
                "cloud_provider": config.cloud_provider,
                "feature_gates": {k: v for k, v in config.feature_gates.items() if v},
            }
        },
    )
    return await daemon.run()


def cli_run(args: argparse.Namespace) -> int:
    """Entry point of ``dranet run``."""
    config = config_from_args(args)
    try:
        if not config.node_name:
            raise ValueError("--node-name: must not be empty (set NODE_NAME)")
        if config.resync_interval <= 0 or config.publish_interval <= 0 or config.health_interval <= 0:
            raise ValueError("--resync-interval/--publish-interval/--health-interval: must be > 0 seconds")
        if "/" in config.instance_id or len(config.instance_id) > 64:
            raise ValueError(f"--instance-id {config.instance_id!r}: at most 64 characters, no '/'")
        parse_bind_address(config.bind_address)
        problem = sysfs_root_error(config.sysfs_root)
        if problem:
            raise ValueError(problem)
        profiles = profile_resolver(config)
        problem = check_at_start(profiles) if profiles is not None else ""
        if problem:
            raise ValueError(f"--webhook-url: {problem}")
    except ValueError as exc:
        log.error("invalid configuration", extra={"kv": {"error": str(exc)}})
        return 2
    _raise_nofile_limit()
    return asyncio.run(_main(config))


def _raise_nofile_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (as Go programs do at start): discovery keeps the
    sysfs files it rereads open (:mod:`driver.inventory.scan_replay`), several per device."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.info("cannot raise the open files limit", extra={"kv": {"soft": soft, "error": str(exc)}})
