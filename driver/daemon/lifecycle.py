"""The node daemon's components, built and started in order, and stopped in order.

Start order: apiserver feature checks (list attributes, consumable capacity for shared NICs,
taints), first discovery scan (so the first prepare finds the inventory), the prepared claims
rebuilt from the API server if the checkpoint was corrupt, kubelet plugin (DRA socket, then
registration), the HTTP probe server (/healthz, /metrics), then the background loops
(:mod:`driver.daemon.supervisor`): ResourceSlice publisher (once this instance holds the node
lease), full rescans and link updates (:mod:`driver.daemon.device_sync`), health checks, NRI plugin.
:meth:`Daemon.shutdown` stops them in the order a rolling update needs.

While an NRI hook runs, background work waits (:meth:`HookActivity.idle`): link updates, rescans,
ResourceSlice writes and claim status writes start only when no hook is running, so a hook never
competes with them for the interpreter lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driver.checkpoint import location
from driver.checkpoint.errors import CheckpointError
from driver.checkpoint.state import PreparedClaim, claim_device_counts, share_usage
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import MetadataPaths
from driver.claims.metadata_sink import MetadataStatusSink
from driver.claims.owned_files import Mend
from driver.claims.prepare import Preparer
from driver.claims.profile import profile_resolver
from driver.claims.recovery import rebuild_prepared_claims
from driver.claims.status import ClaimStatusWriter
from driver.config import (
    FILES_MENDED_EVENT,
    LEASE_OUTSIDE_POOL_EVENT,
    NODE_SETTING_REFUSED_EVENT,
    NODE_WATCH_RETRY_MAX,
    NODE_WATCH_SECONDS,
    SHARING_POOLS_ANNOTATION,
    STATE_DAMAGED_EVENT,
    UNHEALTHY_TAINT_KEY,
    VF_COUNT_REFUSED_EVENT,
    DriverConfig,
    IPNetwork,
    parse_sharing_pools,
)
from driver.daemon.device_sync import DeviceSync
from driver.daemon.probe_server import ProbeServer
from driver.daemon.supervisor import Supervisor
from driver.dra.field_support import consumable_capacity_accepted, list_attributes_accepted
from driver.dra.helper import Helper
from driver.dra.protocol import ClaimRef, DeviceHealthState, PrepareResult, SliceDevice
from driver.health.monitor import HealthMonitor, RemovedDevices, removed_holders
from driver.inventory import partitions, vf_counts
from driver.inventory.vfio_binding import VfioTaints
from driver.kube.client import KubeClient, close_watch, watch_events
from driver.kube.errors import KubeError
from driver.metrics import Metrics
from driver.model.device import STANDARD_DOMAIN, Device, rdma_count
from driver.netlink import kernel_features, rdma_nldev
from driver.netlink.channel import netlink_socket
from driver.netlink.hook_activity import HookActivity
from driver.netlink.kernel_features import KernelFeatures
from driver.netlink.link_watch import LinkWatcher
from driver.netlink.rtnl import Rtnl
from driver.node_lease import POLL_INTERVAL, NodeLease

if TYPE_CHECKING:  # imported when NRI starts: `dranet run --no-nri` loads no NRI code
    from driver.nri.handover import HandoverHooks
    from driver.nri.plugin import NRIPlugin

log = logging.getLogger(__name__)

CLOUD_STARTUP_WAIT = 3.0
"""Seconds the first scan waits for cloud metadata: a healthy service's attributes are then in the
first publish; a down or slow one costs at most this, and its attributes follow in a republish."""
STATE_WRITE_RETRY_S = 5.0
"""Seconds between retries of a failed state write (see :meth:`Daemon._state_write_retry_loop`)."""
REBUILD_RETRY = 30.0
"""Seconds between attempts to rebuild damaged prepared claims while the API server cannot be asked."""
KEEP_FILES_INTERVAL = 2.0
"""Seconds between two checks of the files the driver owns (each claim's device metadata files and
CDI specs: a stat each while they are as last written). A damaged CDI spec fails the runtime's CDI
resolution before any NRI hook is called, so only this check mends it before the kubelet tries the
container again (its back-off starts at 10 s)."""
KEEP_FILES_FULL_EVERY = 30
"""Every this many checks the files are read and compared whole (a change that kept a file's size,
times and inode escapes the stat)."""
MENDED_EVENT_INTERVAL = 60.0
"""Seconds at least between two Node events about files written again (what comes in between is
counted in the next one): a loop that keeps breaking a file cannot flood the API server."""
LIST_ATTRIBUTE = f"{STANDARD_DOMAIN}/numaNode"
"""The attribute published as an int list with ``DRAListTypeAttributes`` (asked of the apiserver at start)."""


@dataclass
class NodeSeen:
    """What the daemon last read of its own Node: the resourceVersion its watch resumes from, and the
    text of the annotation it takes settings from (a change of anything else changes none)."""

    resource_version: str = ""
    pools_text: str | None = None
    read: bool = False  # the Node was read once: its settings are applied


class NetworkDriver:
    """The network driver as the DRA kit sees it (:class:`driver.dra.protocol.DRADriver`): claims
    prepared by the :class:`Preparer`, the inventory of :class:`DeviceSync`, NIC health."""

    def __init__(self, preparer: Preparer, device_sync: DeviceSync, health: HealthMonitor) -> None:
        self.preparer, self.device_sync, self.monitor = preparer, device_sync, health
        self.vfio_taints = VfioTaints()

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        return await self.preparer.prepare(claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return await self.preparer.unprepare(claims)

    def prepare_now(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        return self.preparer.prepare_now(claims)

    def unprepare_now(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return self.preparer.unprepare_now(claims)

    def devices(self) -> list[Device]:
        return partitions.with_counters(self.device_sync.devices())

    def counter_sets(self, devices: Sequence[SliceDevice]) -> list[dict[str, Any]]:
        return partitions.counter_sets([d for d in devices if isinstance(d, Device)])

    def device_taints(self, devices: Sequence[SliceDevice]) -> dict[str, list[dict[str, str]]]:
        return self.vfio_taints.of([d for d in devices if isinstance(d, Device)])

    async def health(self) -> list[DeviceHealthState]:
        return await self.monitor.check()


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
        self.metrics.watch_shares(lambda: store.read(share_usage))
        self.sharing_pools = parse_sharing_pools(config.sharing_pools)  # a bad entry stops the daemon here
        self.vf_counts = vf_counts.decode(config.sriov_vfs)  # as does a bad sriov.vfs entry
        self.node_seen = NodeSeen()  # the Node's settings, read at start and kept current (_watch_node)
        self.stopping = asyncio.Event()
        self.background = Supervisor()
        self.rdma_mode = rdma_nldev.UNKNOWN  # detected at start: exclusive mode moves RDMA devices with NICs
        self.rxe_in_pod = False  # probed at start: Soft-RoCE devices made again in the pods (Linux 7.1 on)
        self.kernel: KernelFeatures | None = None  # detected at start: what the kernel offers
        self.claims_damage: str | None = None  # damaged prepared claims, until rebuilt from the API
        self.removed = RemovedDevices()  # devices gone from the node whose holders were told
        # The NRI hooks announce themselves and the links they change here (shared with them).
        self.hook_activity = HookActivity()
        self.device_sync = DeviceSync(
            config, store, self.metrics, self.hook_activity, on_inventory=self._inventory_changed
        )
        self.status_writer = ClaimStatusWriter(
            kube,
            config.node_name,
            driver_name=config.driver_name,
            sysfs_root=config.sysfs_root,
            quiet=self.hook_activity.wait_idle,
        )
        # Several instances on one node (rolling update): only the lease holder moves NICs and
        # writes slices (driver/node_lease.py); both serve the kubelet.
        self.lease = NodeLease(config.runtime_dir, config.instance_id)
        # Claim changes are journaled (one sync each) only by the instance holding the lease: another
        # instance may be an older driver that reads only checkpoint.json, so a standby writes it whole.
        store.journaling = lambda: self.lease.held
        health = HealthMonitor(
            store, lambda: self.device_sync.inventory, config.node_name, config.sysfs_root, config.host_netns
        )
        self.nri: NRIPlugin | None = None  # once the NRI task built it
        # The preparer decodes claim configs strictly, once: a bad config is a per-claim error
        # naming the field, at prepare time, not a pod that fails to start.
        builder = ClaimBuilder(
            lambda: self.device_sync.inventory,
            config.driver_name,
            config.node_name,
            cloud_config=self.device_sync.cloud.device_config,
            profiles=profile_resolver(config),
            sysfs_root=config.sysfs_root,
        )
        # Device metadata files for the containers, bind-mounted by CDI (no feature gate needed).
        self.metadata = (
            DeviceMetadataWriter(
                MetadataPaths(config.driver_name, config.runtime_dir, config.cdi_dir),
                config.sysfs_root,
                foreign=self._node_devices_of,
            )
            if config.device_metadata
            else None
        )
        self.preparer = Preparer(
            kube,
            store,
            builder,
            on_unprepare=self._claim_unprepared,
            on_error=lambda ref, error: self.status_writer.prepare_failed(ref.namespace, ref.name, ref.uid, error),
            metadata=self.metadata,
        )
        self.hooks: HandoverHooks | None = None  # the NRI hooks, once the NRI task built them
        self.metadata_sink: MetadataStatusSink | None = None  # their status sink, with metadata on
        # The kubelet plugin, the ResourceSlices and device health, from the DRA kit.
        self.dra: Helper[Device] = Helper(
            NetworkDriver(self.preparer, self.device_sync, health),
            kube,
            driver_name=config.driver_name,
            node_name=config.node_name,
            dra_socket=config.dra_socket,
            registration_socket=config.registration_socket,
            taint_key=UNHEALTHY_TAINT_KEY,
            taint_effect=config.unhealthy_taint_effect,
            publish_interval=config.publish_interval,
            health_interval=config.health_interval,
            metrics=self.metrics,
            on_published=self._published,
            on_health=self._health_changed,
            quiet=self.hook_activity.idle,
        )
        self.probes = ProbeServer(
            config.bind_address,
            self.metrics,
            self.ready,
            self.problems,
            serving=self.serving,
            claim_port=self.lease.request_port,
            port_file=config.probe_port_file,
        )

    def _node_devices_of(self, driver: str) -> dict[tuple[str, str], dict[str, Any]]:
        """Another driver's devices on this node, by (pool, name): their attributes (a GPU's bus ID
        for the metadata's GPU pairing). One LIST, only for a claim holding that driver's devices."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        selector = f"spec.driver={driver},spec.nodeName={self.config.node_name}"
        for item in self.kube.list_resource_slice(selector).get("items") or []:
            spec = item.get("spec") or {}
            pool = (spec.get("pool") or {}).get("name", "")
            for device in spec.get("devices") or []:
                found[(pool, device.get("name", ""))] = device.get("attributes") or {}
        return found

    def _claim_unprepared(self, claim: PreparedClaim) -> None:
        # NICs the runtime never asked back (no StopPodSandbox) go home first, then the status.
        if self.hooks is not None:
            self.hooks.claim_unprepared(claim)
        self.status_writer.claim_unprepared(claim)

    # -- state -------------------------------------------------------------------------------

    def ready(self) -> bool:
        """Alive (``/healthz``): the kubelet plugin serves and discovery ran at least once."""
        return self.dra.serving and self.device_sync.scanned

    def problems(self) -> list[str]:
        """Conditions ``/healthz`` and ``/readyz`` report (503) until they clear: state that cannot be
        saved, prepared claims found damaged and not yet rebuilt from the API server."""
        out = [str(error) for error in self.store.write_errors.values()]
        if self.claims_damage is not None:
            out.append(self.claims_damage)
        return out

    async def _node_pools(self) -> None:
        """This node's own settings before anything starts (the address pools the NRI hooks begin
        with); :meth:`_watch_node` keeps them current from here. A node that cannot be read now keeps
        the flags' until the watch reads it."""
        try:
            node = await asyncio.to_thread(self.kube.read_node, self.config.node_name)
        except KubeError as exc:
            log.warning("cannot read this node for its address pools", extra={"kv": {"error": str(exc)}})
            return
        await self._node_changed(node)

    async def _watch_node(self) -> None:
        """This node's settings as they change, without a restart: a watch of its Node alone (field
        selector on its name) resumed from the resourceVersion last seen when the API server ends it;
        one that cannot be resumed (expired, broken, refused) starts over with a GET, with backoff."""
        delay, failing = 1.0, False
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                if not self.node_seen.resource_version:
                    await self._node_changed(await asyncio.to_thread(self.kube.read_node, self.config.node_name))
                await self._node_watch_once()
            except Exception as exc:  # noqa: BLE001 - a broken watch starts over; the settings stay meanwhile
                self.node_seen.resource_version = ""
                (log.debug if failing else log.warning)(
                    "cannot watch this node: its settings stay as last read until it can",
                    extra={"kv": {"error": str(exc), "retry_s": delay}},
                )
                failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, NODE_WATCH_RETRY_MAX)
                continue
            if failing:
                log.info("watching this node again")
            delay, failing = 1.0, False
            await asyncio.sleep(max(0.0, 1.0 - (loop.time() - started)))  # a server ending every watch at once

    async def _node_watch_once(self) -> None:
        """One watch of this node's Node from the resourceVersion last seen, until the API server ends
        it (its timeout, or an ERROR event: the resourceVersion is too old, and a GET starts over)."""
        resp = await asyncio.to_thread(
            self.kube.watch_node, self.config.node_name, self.node_seen.resource_version, NODE_WATCH_SECONDS
        )
        events = watch_events(resp)
        ended = False
        try:
            while (event := await asyncio.to_thread(next, events, None)) is not None:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    log.debug("node watch expired: reading the node again", extra={"kv": {"status": obj}})
                    self.node_seen.resource_version = ""
                elif kind == "BOOKMARK":
                    self.node_seen.resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                elif kind in ("ADDED", "MODIFIED"):
                    await self._node_changed(obj)
            ended = True
        finally:
            if not ended:  # cancelled (the daemon stops) or failed: the reading thread returns now
                close_watch(resp)
                with contextlib.suppress(ValueError):  # still running in its thread: it ends on its own
                    events.close()

    async def _node_changed(self, node: dict[str, Any]) -> None:
        """Apply the settings of this node's Node object, then say what an admin must know: a refused
        annotation (a Warning event on the Node naming it) and leases outside the pools now."""
        first, before = not self.node_seen.read, self.sharing_pools
        refused = self._apply_node(node)
        if refused is not None:
            await asyncio.to_thread(self.status_writer.post_node_event, NODE_SETTING_REFUSED_EVENT, refused)
        if first or self.sharing_pools is not before:
            await self._report_leases_outside()

    def _apply_node(self, node: dict[str, Any]) -> str | None:
        """Take this node's address pools from its Node object (on the event loop, where the NRI hooks
        are built from :attr:`sharing_pools`); the message of a refused annotation, else None. A bad
        annotation changes nothing: the pools in effect stay, so a typo never takes a range away."""
        meta = node.get("metadata") or {}
        self.node_seen.resource_version = str(meta.get("resourceVersion") or "")
        self.node_seen.read = True
        text = (meta.get("annotations") or {}).get(SHARING_POOLS_ANNOTATION)
        if text == self.node_seen.pools_text:
            return None
        self.node_seen.pools_text = text
        try:
            own = parse_sharing_pools(text or "", f"node annotation {SHARING_POOLS_ANNOTATION}")
        except ValueError as exc:
            kept = _pools_text(self.sharing_pools)
            log.error("bad address pools on this node: ignored", extra={"kv": {"error": str(exc), "in_effect": kept}})
            return f"{exc}: ignored, the address pools in effect stay ({kept})"
        pools = {**parse_sharing_pools(self.config.sharing_pools), **own}
        if pools == self.sharing_pools:
            return None
        self.sharing_pools = pools
        if self.hooks is not None:
            self.hooks.hooks.set_pools(pools)
        log.info("address pools of this node", extra={"kv": {"pools": _pools_text(pools), "annotation": text}})
        return None

    async def _report_leases_outside(self) -> None:
        """Shares holding addresses outside their NIC's pool as it is now keep them (until their pods
        end; no other share is given one meanwhile): logged and a Warning event on the Node."""
        if not self.config.nri_enabled:
            return
        from driver.nri.address_pool import leases_outside

        pools = self.sharing_pools
        outside = await asyncio.to_thread(self.store.read, lambda s: leases_outside(s, pools))
        if not outside:
            return
        named = [str(lease) for lease in outside]
        log.warning(
            "shares hold addresses outside their NIC's address pool: they keep them until their pods end",
            extra={"kv": {"leases": named, "pools": _pools_text(pools)}},
        )
        listed = "; ".join(named[:10]) + (f"; and {len(named) - 10} more" if len(named) > 10 else "")
        message = (
            f"{len(named)} running share(s) hold addresses outside their NIC's address pool now "
            f"({_pools_text(pools)}): {listed}. They keep them until their pods end; no other share gets them meanwhile"
        )
        await asyncio.to_thread(self.status_writer.post_node_event, LEASE_OUTSIDE_POOL_EVENT, message)

    def _damage(self) -> list[tuple[str, str]]:
        """(file, what) of each state file found damaged at start."""
        out = [(q.path.name, f"moved aside: {q.reason}") for q in self.store.quarantined]
        if self.store.claims_suspect:
            out.append((self.store.JOURNAL_FILENAME, self.store.claims_suspect))
        return out

    async def _rebuild_claims(self) -> None:
        """The prepared claims were found damaged: say so (log, metric, a Warning event on the Node,
        ``/healthz`` until done) and record every claim of this node the API server holds that the
        state lacks; retried in the background while the API server cannot be asked."""
        damage = self._damage()
        self.metrics.set_state_damage(damage)
        what = "; ".join(f"{name}: {why}" for name, why in damage)
        self.claims_damage = f"prepared claims were damaged ({what}): rebuilding them from the API server"
        message = f"dranet's prepared claims on this node were damaged ({what}); rebuilt from the API server"
        await asyncio.to_thread(self.status_writer.post_node_event, STATE_DAMAGED_EVENT, message)
        report = await rebuild_prepared_claims(self.preparer, self.kube)
        if report.api_error is None:
            self.claims_damage = None
            return
        self.claims_damage += f" (the API server could not be asked: {report.api_error}; retrying)"
        self.background.spawn("claims-rebuild", self._retry_rebuild)

    async def _record_claims_after_boot(self) -> None:
        """A new claims directory on a node where a driver ran before (a reboot emptied the tmpfs):
        record the API server's claims of this node before serving, for the NRI hooks and the
        kubelet alike (see driver/checkpoint/location.py); retried in the background while it
        cannot be asked."""
        report = await rebuild_prepared_claims(self.preparer, self.kube)
        if report.api_error is not None:
            self.background.spawn("claims-after-boot", self._retry_rebuild)

    async def _retry_rebuild(self) -> None:
        """Until the API server answers: record this node's claims, then write their metadata files."""
        while True:
            await asyncio.sleep(REBUILD_RETRY)
            if (await rebuild_prepared_claims(self.preparer, self.kube)).api_error is None:
                self.claims_damage = None
                await asyncio.to_thread(self.preparer.restore_metadata)
                await asyncio.to_thread(self.preparer.restore_vfio)
                return

    def serving(self) -> bool:
        """Ready (``/readyz``): alive, registered with the kubelet and (with NRI) synchronized with the
        runtime on the connection it has now (the runtime then calls us for every event), so a rolling
        update replaces the old pod only once this one can take over."""
        nri_ok = not self.config.nri_enabled or (self.nri is not None and self.nri.in_sync)
        return self.ready() and self.dra.registered is True and nri_ok

    def _inventory_changed(self) -> None:
        """Republish the inventory and have the health check look at the devices now."""
        self.dra.devices_changed()

    def _published(self, devices: list[Device], wrote: bool) -> None:
        """The slices list ``devices``: the device gauges, and the time of the last good round.

        Every successful round, written or already current (as the Go driver sets it on each
        publish): a stale value means the publisher is stuck or the API refuses it, not that
        the devices did not change."""
        del wrote
        self.metrics.set_devices(len(devices), rdma_count(devices))
        self.metrics.mark_published()

    def _health_changed(self, states: list[DeviceHealthState]) -> None:
        """New device health: the per-device gauge; the holders of a device that left the node told
        (claim condition and events, once per removal)."""
        self.metrics.set_device_health({s.device: s.healthy for s in states})
        removed = self.removed.newly_removed(states)
        if not removed:
            return
        for held in self.store.read(lambda st: removed_holders(st, removed)):
            log.warning(
                "a claimed device left the node",
                extra={"kv": {"device": held.device, "claim": f"{held.claim.namespace}/{held.claim.name}",
                              "pods": list(held.pod_uids), "why": removed[held.device]}},
            )  # fmt: skip
            self.status_writer.device_removed(held.pod_uids, held.claim, held.device, removed[held.device])

    async def _state_write_retry_loop(self) -> None:
        """While a state write is failing, try again every few seconds, so ``/healthz`` turns
        200 once the disk takes writes again even if no claim or pod changes meanwhile."""
        while True:
            await asyncio.sleep(STATE_WRITE_RETRY_S)
            if self.store.write_errors:
                await asyncio.to_thread(self.store.retry_write)

    def _compact_state(self) -> None:
        try:
            self.store.compact()
        except CheckpointError as exc:  # the journal still holds the claims: the next instance replays it
            log.warning("cannot fold the claims journal into the checkpoint", extra={"kv": {"error": str(exc)}})
        self.store.close()

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until :attr:`stopping` is set; returns the exit code."""
        self.device_sync.bind_loop()
        self.preparer.bind_loop(asyncio.get_running_loop())
        if self.device_sync.list_numa:
            await self._check_list_attributes()
        if self.device_sync.sharing is not None:
            await self._check_sharing()
        await self.dra.check_taints()
        await self.dra.check_counters()
        await self._node_pools()
        self.kernel = await asyncio.to_thread(_kernel_features)
        kernel_features.report(self.kernel)
        self.metrics.set_kernel(
            self.kernel.release,
            ".".join(map(str, kernel_features.FLOOR)),
            not self.kernel.below_floor,
            {f.name: f.available for f in self.kernel.features},
        )
        if self.config.host_sysfs and self.config.nri_enabled:
            self.rdma_mode = await asyncio.to_thread(rdma_nldev.netns_mode)
            log.info("RDMA netns mode", extra={"kv": {"mode": self.rdma_mode}})
            self.rxe_in_pod, why = await asyncio.to_thread(rdma_nldev.rxe_netns_probe, self.config.sysfs_root)
            log.info("Soft-RoCE in the pods' namespaces", extra={"kv": {"capable": self.rxe_in_pod, "why": why}})
        if self.vf_counts:
            await self._set_vf_counts()  # before the first scan, which publishes the VFs made
        self.device_sync.cloud.start()
        await asyncio.to_thread(self.device_sync.cloud.wait, CLOUD_STARTUP_WAIT)
        try:
            await self.device_sync.rescan()
        except Exception:
            log.exception("initial scan failed; serving an empty inventory until the next resync")
        ran_before = await asyncio.to_thread(location.ran_before, Path(self.config.plugin_dir, location.RAN_MARKER))
        # Before the kubelet plugin serves: the NRI hooks and the kubelet must find them.
        if self.store.claims_quarantined:
            await self._rebuild_claims()
        elif self.store.started_empty and ran_before:
            await self._record_claims_after_boot()
        await asyncio.to_thread(self.preparer.restore_metadata)
        # The claims' VFs on vfio-pci again (a reboot gave them back to their drivers, a crash may
        # have come between a record and its bind): before the kubelet starts their containers.
        await asyncio.to_thread(self.preparer.restore_vfio)
        self.status_writer.start()
        await self.dra.start()
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

    async def _set_vf_counts(self) -> None:
        """Each PF ``sriov.vfs`` selects gets its count (:mod:`driver.inventory.vf_counts`); a PF
        whose VFs prepared claims hold keeps its count, and every refusal is a Node event."""
        prepared = self.store.read(
            lambda s: {
                d.snapshot.host.pci_address for c in s.claims.values() for d in c.devices if d.snapshot.host.pci_address
            }
        )
        outcomes = await asyncio.to_thread(
            vf_counts.apply, self.vf_counts, self.config.sysfs_root, prepared, self.preparer.write_sysfs
        )
        refused = "; ".join(o.refused for o in outcomes if o.refused)
        if refused:
            await asyncio.to_thread(self.status_writer.post_node_event, VF_COUNT_REFUSED_EVENT, refused)

    async def _check_list_attributes(self) -> None:
        accepted, why = await asyncio.to_thread(
            list_attributes_accepted, self.kube, self.config.driver_name, self.config.node_name, LIST_ATTRIBUTE
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

    async def _check_sharing(self) -> None:
        accepted, why = await asyncio.to_thread(
            consumable_capacity_accepted, self.kube, self.config.driver_name, self.config.node_name
        )
        if accepted:
            log.info("sharing NICs (consumable capacity)", extra={"kv": {"filter": self.config.sharing_filter}})
            return
        self.device_sync.sharing = None
        log.error(
            "--sharing-filter is set, but the apiserver cannot count consumable capacity (Kubernetes 1.36+, "
            "DRAConsumableCapacity); publishing every NIC whole, for one claim at a time",
            extra={"kv": {"why": why}},
        )

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
        self.background.spawn("publisher", self.dra.publish)

    async def _yield_probe_port(self) -> None:
        """Give the probe port to a newer instance on this node when it asks (see node_lease)."""
        while self.lease.port_requested(self.probes.port) is None:
            await asyncio.sleep(POLL_INTERVAL * 2)
        log.info("probe port handed to a newer driver instance", extra={"kv": {"port": self.probes.port}})
        await self.probes.stop()

    def _start_background(self) -> None:
        spawn, sync = self.background.spawn, self.device_sync
        metadata = self.metadata
        self.metrics.watch_state_files_mended(lambda: metadata.mend_counts() if metadata is not None else {})
        if metadata is not None:
            spawn("keep-files", self._keep_files_loop)
        spawn("rescan", sync.rescan_loop)
        spawn("state-write-retry", self._state_write_retry_loop)
        spawn("health", self.dra.watch_health)
        spawn("lease", self._act_when_leased)
        spawn("probe-port", self._yield_probe_port)
        spawn("node-settings", self._watch_node)
        if self.config.host_sysfs:
            spawn("link-updates", sync.link_update_loop)
            spawn("link-watch", LinkWatcher(sync.on_link_events, on_overflow=sync.request_rescan).run)
        if self.config.nri_enabled:
            spawn("nri", self._run_nri)

    async def _keep_files_loop(self) -> None:
        """While this instance acts: every claim's files checked every :data:`KEEP_FILES_INTERVAL`
        (between hooks) and written again where missing or damaged, files no claim owns swept with
        every full check; in every instance, unprepared claims' files removed; what was written again (also
        by the check at start and before containers) goes into a Warning event on the Node, at most
        one per :data:`MENDED_EVENT_INTERVAL`."""
        metadata = self.metadata
        if metadata is None:
            return
        loop = asyncio.get_running_loop()
        pending: list[Mend] = []
        last_event, rounds = float("-inf"), 0
        while True:
            await asyncio.sleep(KEEP_FILES_INTERVAL)
            # Unprepared claims' files, whichever instance the kubelet asked.
            if len(metadata.leaving):
                await asyncio.to_thread(metadata.remove_leaving)
            if self.lease.held:
                rounds += 1
                await self.hook_activity.idle()
                await asyncio.to_thread(metadata.keep_all, rounds % KEEP_FILES_FULL_EVERY == 0)
                if rounds % KEEP_FILES_FULL_EVERY == 0 and self.claims_damage is None:
                    await asyncio.to_thread(metadata.sweep_strays)  # not while the stored claims are partial
            pending += metadata.take_mends()
            if pending and loop.time() - last_event >= MENDED_EVENT_INTERVAL:
                last_event = loop.time()
                await asyncio.to_thread(self.status_writer.post_node_event, FILES_MENDED_EVENT, _mended(pending))
                pending = []

    async def _run_nri(self) -> None:
        # Built inside the guard: a failing constructor (e.g. no access to the host netns) is
        # logged and retried, never fatal for the kubelet plugin.
        from driver.nri.handover import HandoverHooks
        from driver.nri.hooks import NRIHooks
        from driver.nri.plugin import NRIPlugin

        sink = None if self.metadata is None else MetadataStatusSink(self.metadata, self.status_writer)
        self.metadata_sink = sink
        hooks = NRIHooks(
            self.store,
            status=self.status_writer if sink is None else sink,
            host_netns=self.config.host_netns,
            sysfs_root=self.config.sysfs_root,
            rdma_exclusive=self.rdma_mode == rdma_nldev.EXCLUSIVE,
            rxe_in_pod=self.rxe_in_pod,
            hook_activity=self.hook_activity,
            pools=self.sharing_pools,
            on_host_change=self.device_sync.request_rescan,
            kernel=self.kernel,
            before_containers=None if sink is None else sink.settle,
            on_problem=self.metrics.count_pod_network_problem,
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
        await self.dra.stop()
        await asyncio.to_thread(self._compact_state)  # no claim changes from here: the whole file for the next instance
        if self.hooks is not None:
            await asyncio.to_thread(self.hooks.retire)
        if self.metadata_sink is not None:  # the pods' queued metadata, before another instance acts
            await asyncio.to_thread(self.metadata_sink.close)
        if self.metadata is not None:  # unprepared claims' files: no other instance knows them
            await asyncio.to_thread(self.metadata.remove_leaving)
        await asyncio.to_thread(self.lease.release)
        self.device_sync.cloud.stop()
        await self.background.stop()
        await self.probes.stop()
        await asyncio.to_thread(self.status_writer.stop, 5.0)
        self.device_sync.scanner.close()
        self.lease.close()
        log.info("daemon stopped")


def _mended(mends: Sequence[Mend]) -> str:
    """The Node event's message about files written again: how many, why, which (the first few)."""
    counts: dict[str, int] = {}
    for m in mends:
        counts[f"{m.kind} {m.reason}"] = counts.get(f"{m.kind} {m.reason}", 0) + 1
    why = ", ".join(f"{n} {what}" for what, n in sorted(counts.items()))
    files = sorted({m.path for m in mends})
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (
        f"dranet wrote again {len(mends)} file(s) it owns that were missing or damaged ({why}): {shown}; "
        "containers that mount them start with what they read before"
    )


def _pools_text(pools: dict[str, IPNetwork | None]) -> str:
    """Address pools as an admin writes them (``ib0=10.77.5.0/26,ib1=subnet``; ``none``)."""
    return ",".join(f"{nic}={pool or 'subnet'}" for nic, pool in sorted(pools.items())) or "none"


def _kernel_features() -> KernelFeatures:
    """The kernel's features, its link kinds asked over a socket of the driver's own namespace (the host's)."""
    try:
        rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE))
    except OSError:
        return kernel_features.detect()
    try:
        return kernel_features.detect(rtnl)
    finally:
        rtnl.close()
