"""Device health, checked every ``--health-interval`` seconds: links, RDMA ports, netdevs.

Each round (in one worker thread: netlink sockets are per thread) asks the kernel for the link of
every published NIC where it is now: in the host namespace, or in the namespace of the pod that
holds it (from the pod network state the NRI hooks keep). A link that is administratively up
without carrier is down (for a veth: its peer is down). The RDMA port states come from sysfs.
Only a change is reported (``on_change``): the daemon streams it to the kubelet
(``DRAResourceHealth``, the pod's ``allocatedResourcesStatus``) and turns it into device taints in
the ResourceSlice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from driver.checkpoint.state import DriverState
from driver.checkpoint.store import CheckpointStore
from driver.kubelet.device_health import DeviceHealthState, device_health_states
from driver.model.device import Device
from driver.netlink.link_health import LinkFacts, LinkProbe
from driver.netlink.namespaces import Namespaces

log = logging.getLogger(__name__)
IN_POD_STEPS = ("in-pod",)  # a NIC whose move is complete: it lives in the pod namespace


def _whereabouts(state: DriverState) -> tuple[set[str], dict[str, tuple[str, str, str]]]:
    """(allocated devices, device -> (pod netns path, name in the pod, "<ns>/<pod>")) from the checkpoint."""
    allocated = {d.device for c in state.claims.values() for d in c.devices}
    in_pod = {
        m.device: (p.netns_path, m.pod_ifname, f"{p.namespace}/{p.name}")
        for p in state.pods.values()
        for m in p.devices
        if m.step in IN_POD_STEPS and p.netns_path
    }
    return allocated, in_pod


class HealthMonitor:
    """Evaluates every published device every ``interval`` seconds (and when poked)."""

    def __init__(
        self,
        store: CheckpointStore,
        devices: Callable[[], dict[str, Device]],
        pool: str,
        sysfs_root: str,
        host_netns: str,
        interval: float,
        on_change: Callable[[list[DeviceHealthState]], Awaitable[None]],
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.devices = devices
        self.pool = pool
        self.sysfs_root = sysfs_root
        self.host_netns = host_netns
        self.interval = interval
        self.on_change = on_change
        self.quiet = quiet  # awaited before each round: no check competes with an NRI hook
        self.last: list[DeviceHealthState] | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="health")
        self._probe: LinkProbe | None = None  # built in the worker thread (its sockets live there)
        self._poke: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def poke(self) -> None:
        """Check now (coalesced); safe from any thread."""
        loop, event = self._loop, self._poke
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def evaluate(self) -> list[DeviceHealthState]:
        """One round (blocking: run it in the worker thread)."""
        if self._probe is None:
            self._probe = LinkProbe(Namespaces(self.host_netns))
        devices = self.devices()
        allocated, in_pod = self.store.read(_whereabouts)
        by_ifname: dict[str, str] = {}
        pods: dict[str, dict[str, str]] = {}  # netns path -> {pod ifname: device}
        where: dict[str, str] = {}
        for name, device in devices.items():
            if name in in_pod:
                path, ifname, pod = in_pod[name]
                pods.setdefault(path, {})[ifname] = name
                where[path] = pod
            elif device.host.ifname:
                by_ifname[device.host.ifname] = name
        links: dict[str, LinkFacts] = {}
        try:
            for ifname, facts in self._probe.host(by_ifname).items():
                links[by_ifname[ifname]] = facts
        except OSError as exc:
            log.warning("link check in the host namespace failed", extra={"kv": {"error": str(exc)}})
        for path, names in pods.items():
            for ifname, facts in self._probe.pod(path, names, where[path]).items():
                links[names[ifname]] = facts
        return device_health_states(devices, self.pool, self.sysfs_root, allocated.__contains__, links)

    async def run(self) -> None:
        """Check until cancelled; report each change to ``on_change``."""
        self._loop = asyncio.get_running_loop()
        self._poke = asyncio.Event()
        try:
            while True:
                if self.quiet is not None:
                    await self.quiet()
                started = time.perf_counter()
                states = await self._loop.run_in_executor(self._worker, self.evaluate)
                if states != self.last:
                    changed = _changes(self.last or [], states)
                    self.last = states
                    if changed:
                        log.info("device health changed", extra={"kv": {"devices": changed}})
                    await self.on_change(states)
                log.debug("health checked", extra={"kv": {"ms": round((time.perf_counter() - started) * 1e3, 2)}})
                try:
                    await asyncio.wait_for(self._poke.wait(), timeout=self.interval)
                except TimeoutError:
                    pass
                self._poke.clear()
        finally:
            self._loop = None


def _changes(before: list[DeviceHealthState], after: list[DeviceHealthState]) -> dict[str, Any]:
    old = {s.device: s.healthy for s in before}
    return {
        s.device: ("healthy" if s.healthy else f"unhealthy: {s.message}")
        for s in after
        if old.get(s.device, True) != s.healthy
    }
