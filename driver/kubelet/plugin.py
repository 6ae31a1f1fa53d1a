"""The kubelet side of the driver: registration and DRA gRPC servers on unix sockets.

Two grpc.aio servers, as the Go helper (k8s.io/dynamic-resource-allocation/kubeletplugin):

* ``<kubelet root>/plugins/<driver>/dra.sock`` serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  and the v1beta1 service (same messages; both go to one :class:`~driver.claims.prepare.Preparer`),
  plus ``v1alpha1.DRAResourceHealth`` when a :class:`DeviceHealthFeed` is given;
* ``<kubelet root>/plugins_registry/<driver>-reg.sock`` serves ``pluginregistration.Registration``.

The DRA server starts first so the kubelet, which dials it right after registration,
always finds it ready. Sockets are removed on stop, which deregisters the plugin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, AsyncIterator, Callable

import grpc

from driver.config import DriverConfig
from driver.metrics import Metrics
from driver.model.device import Device
from driver.claims.prepare import ClaimRef, Preparer, PrepareResult
from driver.proto import dra_health_v1alpha1_pb2 as health_pb
from driver.proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from driver.proto import dra_v1_pb2 as v1_pb
from driver.proto import dra_v1_pb2_grpc as v1_grpc
from driver.proto import dra_v1beta1_pb2 as v1beta1_pb
from driver.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from driver.proto import pluginregistration_pb2 as reg_pb
from driver.proto import pluginregistration_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # kubelet 1.34+ picks the first it knows
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"


# -- device health -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceHealthState:
    """Health of one published device as streamed to the kubelet."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


def evaluate_health(device: Device, sysfs_root: str, in_use: bool) -> tuple[bool, str]:
    """Healthy when an RDMA port is ACTIVE or the netdev is present (or moved into a pod)."""
    root = Path(sysfs_root)
    host = device.host
    if host.rdma_device:
        ports = sorted((root / "class" / "infiniband" / host.rdma_device / "ports").glob("*/state"))
        states = []
        for port in ports:
            try:
                states.append(port.read_text().strip())  # e.g. "4: ACTIVE"
            except OSError:
                continue
        if any(s.endswith("ACTIVE") for s in states):
            return True, ""
        if not host.ifname:
            return False, f"RDMA device {host.rdma_device}: no ACTIVE port ({', '.join(states) or 'no ports'})"
    if host.ifname:
        if (root / "class" / "net" / host.ifname).exists():
            return True, ""
        if in_use:
            return True, f"netdev {host.ifname} is in a pod network namespace"
        return False, f"netdev {host.ifname} is missing"
    if not host.rdma_device:
        return True, ""  # nothing to probe (e.g. a function without netdev or RDMA)
    return False, f"RDMA device {host.rdma_device} has no ACTIVE port"


class DeviceHealthFeed:
    """The current health of every published device; notifies streams when it changes."""

    def __init__(self) -> None:
        self._states: list[DeviceHealthState] = []
        self._version = 0
        self._changed: asyncio.Condition | None = None
        self.updated_at = int(time.time())

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # created lazily inside the running loop
            self._changed = asyncio.Condition()
        return self._changed

    async def set(self, states: list[DeviceHealthState]) -> None:
        """Replace the device list; wakes the streams only if something changed."""
        states = sorted(states, key=lambda s: (s.pool, s.device))
        if states == self._states and self._version:
            return
        cond = self._condition()
        async with cond:
            self._states = states
            self._version += 1
            self.updated_at = int(time.time())
            cond.notify_all()

    def snapshot(self) -> tuple[int, list[DeviceHealthState]]:
        """The version and the complete device list."""
        return self._version, list(self._states)

    async def wait_change(self, seen: int, timeout: float | None = None) -> bool:
        """Return True once the version differs from ``seen``; False after ``timeout`` seconds."""
        cond = self._condition()
        async with cond:
            try:
                await asyncio.wait_for(cond.wait_for(lambda: self._version != seen), timeout)
            except asyncio.TimeoutError:
                return False
            return True


# -- gRPC servicers ----------------------------------------------------------------------------


def _claim_refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare_response(pb: ModuleType, results: dict[str, PrepareResult], share_ids: bool) -> Any:
    response = pb.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = response.claims[uid]
        if result.error:
            entry.error = result.error
            continue
        for d in result.devices:
            device = entry.devices.add(request_names=d.request_names, pool_name=d.pool, device_name=d.device,
                                       cdi_device_ids=d.cdi_device_ids)
            if share_ids and d.share_id:
                device.share_id = d.share_id
    return response


class _DRAService:
    """NodePrepare/NodeUnprepare for one proto version; both versions share the Preparer."""

    def __init__(self, pb: ModuleType, preparer: Preparer, metrics: Metrics, version: str) -> None:
        self.pb = pb
        self.preparer = preparer
        self.metrics = metrics
        self.version = version

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        start = time.perf_counter()
        status = "error"
        try:
            results = await self.preparer.prepare(_claim_refs(request))
            failed = sum(1 for r in results.values() if r.error)
            if failed:
                self.metrics.claim_errors.labels("NodePrepareResources").inc(failed)
            status = "ok" if not failed else "claim_error"
            return _prepare_response(self.pb, results, share_ids=self.version == "v1")
        except Exception as exc:  # never let a bug kill the call without per-claim answers
            log.exception("NodePrepareResources failed")
            return _prepare_response(self.pb, {c.uid: PrepareResult(error=f"internal error: {exc}")
                                               for c in request.claims}, share_ids=False)
        finally:
            self.metrics.observe_request("NodePrepareResources", status, time.perf_counter() - start)

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        start = time.perf_counter()
        status = "error"
        response = self.pb.NodeUnprepareResourcesResponse()
        try:
            errors = await self.preparer.unprepare(_claim_refs(request))
            status = "ok" if not any(errors.values()) else "claim_error"
        except Exception as exc:
            log.exception("NodeUnprepareResources failed")
            errors = {c.uid: f"internal error: {exc}" for c in request.claims}
        finally:
            self.metrics.observe_request("NodeUnprepareResources", status, time.perf_counter() - start)
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class _HealthService(health_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: DeviceHealthFeed, timeout_seconds: int, resend_seconds: float) -> None:
        self.feed = feed
        self.timeout_seconds = timeout_seconds
        self.resend_seconds = resend_seconds

    async def NodeWatchResources(self, request: Any, context: grpc.aio.ServicerContext
                                 ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        # Send the complete list at once, on every change, and again every resend_seconds:
        # the kubelet turns devices whose last update is older than its timeout into Unknown.
        while True:
            version, states = self.feed.snapshot()
            now = int(time.time())
            yield health_pb.NodeWatchResourcesResponse(devices=[
                health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
                    health=health_pb.HEALTHY if s.healthy else health_pb.UNHEALTHY,
                    last_updated_time=now,
                    health_check_timeout_seconds=self.timeout_seconds,
                    message=s.message,
                ) for s in states])
            await self.feed.wait_change(version, self.resend_seconds)


class _RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: "KubeletPlugin") -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.plugin.config.driver_name,
                                 endpoint=self.plugin.dra_socket, supported_versions=self.plugin.supported_versions)

    async def NotifyRegistrationStatus(self, request: reg_pb.RegistrationStatus,
                                       context: grpc.aio.ServicerContext) -> reg_pb.RegistrationStatusResponse:
        self.plugin.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"kv": {"driver": self.plugin.config.driver_name}})
        else:
            log.error("kubelet rejected the plugin registration", extra={"kv": {"error": request.error}})
        return reg_pb.RegistrationStatusResponse()


# -- the plugin --------------------------------------------------------------------------------


def _listen_path(path: str) -> str:
    """Create the socket's directory and remove a stale socket left by a killed driver."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return f"unix://{path}"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class KubeletPlugin:
    """Registration + DRA gRPC servers for one driver instance."""

    def __init__(self, config: DriverConfig, preparer: Preparer, health: DeviceHealthFeed | None = None,
                 metrics: Metrics | None = None, health_check_timeout: int = 60,
                 health_resend: float = 10.0) -> None:
        self.config = config
        self.preparer = preparer
        self.health = health
        self.metrics = metrics or Metrics()
        self.health_check_timeout = health_check_timeout
        self.health_resend = health_resend
        self.dra_socket = os.path.abspath(config.dra_socket)
        self.registration_socket = os.path.abspath(config.registration_socket)
        self.supported_versions = DRA_SERVICES + ([HEALTH_SERVICE] if health is not None else [])
        self.registered: bool | None = None  # last NotifyRegistrationStatus verdict
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None

    @property
    def serving(self) -> bool:
        """True once both sockets accept calls."""
        return self._dra is not None and self._reg is not None

    async def start(self) -> None:
        """Serve the DRA socket, then the registration socket (which makes the kubelet call us)."""
        dra = grpc.aio.server()
        services: list[tuple[ModuleType, ModuleType, str]] = [(v1_pb, v1_grpc, "v1"), (v1beta1_pb, v1beta1_grpc, "v1beta1")]
        for pb, grpc_mod, version in services:
            grpc_mod.add_DRAPluginServicer_to_server(_DRAService(pb, self.preparer, self.metrics, version), dra)
        if self.health is not None:
            service = _HealthService(self.health, self.health_check_timeout, self.health_resend)
            health_grpc.add_DRAResourceHealthServicer_to_server(service, dra)
        dra.add_insecure_port(_listen_path(self.dra_socket))
        await dra.start()
        self._dra = dra
        reg = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), reg)
        reg.add_insecure_port(_listen_path(self.registration_socket))
        await reg.start()
        self._reg = reg
        log.info("kubelet plugin serving", extra={"kv": {
            "dra_socket": self.dra_socket, "registration_socket": self.registration_socket,
            "versions": self.supported_versions}})

    async def stop(self, grace: float = 1.0) -> None:
        """Stop both servers and remove the sockets (registration first: that deregisters us)."""
        reg, dra, self._reg, self._dra = self._reg, self._dra, None, None
        if reg is not None:
            _remove(self.registration_socket)
            await reg.stop(grace)
        if dra is not None:
            await dra.stop(grace)
            _remove(self.dra_socket)
        log.info("kubelet plugin stopped")


def health_states(devices: dict[str, Device], pool: str, sysfs_root: str, in_use: Callable[[str], bool]
                  ) -> list[DeviceHealthState]:
    """Evaluate every published device (used by the daemon after each scan)."""
    out = []
    for name, device in devices.items():
        healthy, message = evaluate_health(device, sysfs_root, in_use(name))
        out.append(DeviceHealthState(pool=pool, device=name, healthy=healthy, message=message))
    return out
