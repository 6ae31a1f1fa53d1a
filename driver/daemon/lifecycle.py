"""The node daemon's components, built and started in order, and stopped in order.

Start order: apiserver feature checks, first discovery scan (so the first prepare finds the
inventory), the prepared claims rebuilt from the API server if the checkpoint was corrupt, kubelet
plugin (DRA socket, then registration), the HTTP probe server (/healthz, /metrics), then the
background loops (:mod:`driver.daemon.supervisor`): ResourceSlice publisher (once this instance
holds the node lease), full rescans and link updates (:mod:`driver.daemon.device_sync`), health
checks, NRI plugin. :meth:`Daemon.shutdown` stops them in the order a rolling update needs.

While an NRI hook runs, background work waits (:meth:`OwnChanges.idle`): link updates, rescans,
ResourceSlice writes and claim status writes start only when no hook is running, so a hook never
competes with them for the interpreter lock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

from driver.checkpoint.state import claim_device_counts
from driver.checkpoint.store import CheckpointStore
from driver.claims.prepare import Preparer
from driver.claims.profile import profile_resolver
from driver.claims.recovery import rebuild_prepared_claims
from driver.claims.status import ClaimStatusWriter
from driver.config import DriverConfig
from driver.daemon.device_sync import DeviceSync
from driver.daemon.supervisor import Supervisor
from driver.kube.client import KubeClient
from driver.kubelet.device_health import DeviceHealthFeed, DeviceHealthState
from driver.kubelet.health_monitor import HealthMonitor
from driver.kubelet.plugin import KubeletPlugin
from driver.metrics import Metrics
from driver.model.device import Device
from driver.netlink import rdma_netns
from driver.netlink.link_watch import LinkWatcher
from driver.netlink.own_changes import OwnChanges
from driver.node_lease import POLL_INTERVAL, NodeLease
from driver.probe_server import ProbeServer
from driver.publish.device_taints import OFF, UnhealthyTaints, device_taints_accepted
from driver.publish.list_attributes import list_attributes_accepted
from driver.publish.publisher import SlicePublisher

log = logging.getLogger(__name__)

CLOUD_STARTUP_WAIT = 3.0
"""Seconds the first scan waits for cloud metadata: a healthy service's attributes are then in the
first publish; a down or slow one costs at most this, and its attributes follow in a republish."""
STATE_WRITE_RETRY_S = 5.0
"""Seconds between retries of a failed state write (see :meth:`Daemon._state_write_retry_loop`)."""


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
        self.metrics.watch_state_writes(lambda: store.write_failures)
        self.stopping = asyncio.Event()
        self.background = Supervisor()
        self.rdma_mode = rdma_netns.UNKNOWN  # detected at start: exclusive mode moves RDMA devices with NICs
        # The NRI hooks announce themselves and the links they change here (shared with them).
        self.own_changes = OwnChanges()
        self.device_sync = DeviceSync(config, store, self.metrics, self.own_changes, on_inventory=self._publish)
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
            lambda: self.device_sync.inventory,
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
            lambda: self.device_sync.inventory,
            config.driver_name,
            config.node_name,
            on_unprepare=self._claim_unprepared,
            cloud_config=self.device_sync.cloud.device_config,
            on_error=lambda ref, error: self.status_writer.prepare_failed(ref.namespace, ref.name, ref.uid, error),
            profiles=profile_resolver(config),
            sysfs_root=config.sysfs_root,
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

    # -- state -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Alive (``/healthz``): the kubelet plugin serves and discovery ran at least once."""
        return self.plugin.serving and self.device_sync.scanned

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

    def _publish(self, devices: list[Device]) -> None:
        """Hand the inventory to the publisher (which sets the device gauges once the slices are
        written); have the health monitor look at the devices now."""
        self.publisher.update(devices)
        self.health.poke()

    async def _state_write_retry_loop(self) -> None:
        """While a state write is failing, try again every few seconds, so ``/healthz`` turns
        200 once the disk takes writes again even if no claim or pod changes meanwhile."""
        while True:
            await asyncio.sleep(STATE_WRITE_RETRY_S)
            if self.store.write_error is not None:
                await asyncio.to_thread(self.store.retry_write)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until :attr:`stopping` is set; returns the exit code."""
        self.device_sync.bind_loop()
        if self.device_sync.list_numa:
            await self._check_list_attributes()
        if self.taints.effect != OFF:
            await self._check_device_taints()
        if self.config.host_sysfs and self.config.nri_enabled:
            self.rdma_mode = await asyncio.to_thread(rdma_netns.netns_mode)
            log.info("RDMA netns mode", extra={"kv": {"mode": self.rdma_mode}})
        self.device_sync.cloud.start()
        await asyncio.to_thread(self.device_sync.cloud.wait, CLOUD_STARTUP_WAIT)
        try:
            await self.device_sync.rescan()
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
        self.device_sync.list_numa = False
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
        self.background.spawn("publisher", self.publisher.run)

    async def _yield_probe_port(self) -> None:
        """Give the probe port to a newer instance on this node when it asks (see node_lease)."""
        while self.lease.port_requested(self.probes.port) is None:
            await asyncio.sleep(POLL_INTERVAL * 2)
        log.info("probe port handed to a newer driver instance", extra={"kv": {"port": self.probes.port}})
        await self.probes.stop()

    def _start_background(self) -> None:
        spawn, sync = self.background.spawn, self.device_sync
        spawn("rescan", sync.rescan_loop)
        spawn("state-write-retry", self._state_write_retry_loop)
        spawn("health", self.health.run)
        spawn("lease", self._act_when_leased)
        spawn("probe-port", self._yield_probe_port)
        if self.config.host_sysfs:
            spawn("link-updates", sync.link_update_loop)
            spawn("link-watch", LinkWatcher(sync.on_link_events, on_overflow=sync.request_rescan).run)
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
        self.device_sync.cloud.stop()
        await self.background.stop()
        await self.probes.stop()
        await asyncio.to_thread(self.status_writer.stop, 5.0)
        self.device_sync.scanner.close()
        self.lease.close()
        log.info("daemon stopped")
