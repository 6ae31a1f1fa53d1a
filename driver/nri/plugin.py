"""The NRI plugin lifecycle: connect, register, configure, synchronize, dispatch, reconnect.

The runtime (containerd, CRI-O) listens on the NRI socket; we connect, serve the
``Plugin`` service on mux connection 1, call ``Runtime.RegisterPlugin`` on mux
connection 2, then answer Configure, Synchronize and the pod/container events we
subscribed to. Hooks run one at a time in a dedicated worker thread: they do
blocking netlink work (the host sockets are per thread) and the runtime already
serializes NRI calls, so one thread keeps the netns bookkeeping simple.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from google.protobuf.message import DecodeError

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.config import DRIVER_NAME
from driver.metrics import FAILED, SUCCESS, Metrics
from driver.nri import ttrpc
from driver.nri.hooks import HookError
from driver.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Mux

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0  # s, containerd/nri DefaultPluginRegistrationTimeout

SUBSCRIBED_EVENTS = (api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX, api.CREATE_CONTAINER)


def event_mask(events: Sequence[int]) -> int:
    """The ConfigureResponse.events bit mask: bit ``event - 1`` per event (pkg/api/event.go)."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class NRIHandler(Protocol):
    """What the plugin calls for each runtime event; methods run in the hook worker thread.

    Raising fails that one NRI call (the runtime sees an error status); it never
    stops the plugin.
    """

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        """Reconcile with every pod and container the runtime knows (on each (re)connect)."""

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """The sandbox and its network namespace exist (after CNI, before containers)."""

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """The sandbox is stopping; its netns may still exist."""

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """The sandbox is gone for good."""

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        """Adjustments for a container about to be created (None: no change)."""

    def shutdown(self) -> None:
        """The runtime is shutting down (the plugin will reconnect when it comes back)."""


class Backoff(NamedTuple):
    """Seconds between reconnect attempts: from ``initial``, doubling up to ``maximum``."""

    initial: float
    maximum: float


RECONNECT = Backoff(0.1, 5.0)


class NRIPlugin:
    """An external NRI plugin that reconnects with exponential backoff until :meth:`stop`."""

    def __init__(
        self,
        socket_path: str,
        handler: NRIHandler,
        idx: str = "00",
        *,
        reconnect: Backoff = RECONNECT,
        metrics: Metrics | None = None,
    ) -> None:
        if len(idx) != 2 or not idx.isdigit():
            raise ValueError(f"NRI plugin index must be two digits, got {idx!r}")
        self.socket_path = socket_path or DEFAULT_SOCKET
        self.handler = handler
        self.name = DRIVER_NAME  # the plugin name the runtime logs
        self.idx = idx
        self.reconnect = reconnect
        self.metrics = metrics  # dranet_driver_nri_plugin_requests_total / _latency_seconds per hook
        self.registered = asyncio.Event()  # set while registered with a runtime
        self.sessions = 0  # completed registrations, for tests and metrics
        self.synchronized = 0  # completed Synchronize calls: the runtime now calls us for its events
        self.request_timeout: float = 2.0  # s, updated from ConfigureRequest
        self._stopping = asyncio.Event()
        self._mux: Mux | None = None
        # One worker: hooks are serialized and the host netlink sockets stay in one thread.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nri-hook")
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []

    async def run(self) -> None:
        """Connect, serve, and reconnect after each disconnect until :meth:`stop` is called."""
        delay = self.reconnect.initial
        try:
            while not self._stopping.is_set():
                try:
                    registered = await self._session()
                except (TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError, ttrpc.RPCError) as exc:
                    registered = False
                    log.info("NRI connection failed", extra={"kv": {"socket": self.socket_path, "error": str(exc)}})
                if self._stopping.is_set():
                    break
                delay = self.reconnect.initial if registered else min(delay * 2, self.reconnect.maximum)
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except TimeoutError:
                    pass
        finally:
            self._worker.shutdown(wait=False)

    def stop(self) -> None:
        """Disconnect and make :meth:`run` return."""
        self._stopping.set()
        if self._mux is not None:
            self._mux.close()

    async def _session(self) -> bool:
        """One connection's life; returns whether registration succeeded."""
        reader, writer = await asyncio.open_unix_connection(self.socket_path)
        mux = Mux(reader, writer)
        self._mux = mux
        self._sync_pods, self._sync_containers = [], []
        server = ttrpc.Server(mux.conn(PLUGIN_SERVICE_CONN), self._methods())
        client = ttrpc.Client(mux.conn(RUNTIME_SERVICE_CONN))
        tasks = [asyncio.create_task(t) for t in (mux.run(), server.serve(), client.run())]
        registered = False
        try:
            req = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx)
            await client.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), timeout=REGISTRATION_TIMEOUT)
            registered = True
            self.sessions += 1
            self.registered.set()
            log.info(
                "NRI plugin registered", extra={"kv": {"name": self.name, "idx": self.idx, "socket": self.socket_path}}
            )
            await mux.closed.wait()
            log.info("NRI runtime connection closed", extra={"kv": {"socket": self.socket_path}})
        finally:
            self.registered.clear()
            mux.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._mux = None
        return registered

    def _methods(self) -> dict[tuple[str, str], ttrpc.Handler]:
        def unary(req_type: Any, fn: Callable[[Any], Any]) -> ttrpc.Handler:
            async def call(payload: bytes) -> bytes:
                req = req_type()
                try:
                    req.ParseFromString(payload)
                except DecodeError as exc:
                    name = req_type.DESCRIPTOR.name
                    raise ttrpc.RPCError(ttrpc.INVALID_ARGUMENT, f"payload is not a {name}: {exc}") from None
                resp = await fn(req)
                return resp.SerializeToString()

            return call

        table: dict[str, tuple[Any, Callable[[Any], Any]]] = {
            "Configure": (api.ConfigureRequest, self._configure),
            "Synchronize": (api.SynchronizeRequest, self._synchronize),
            "Shutdown": (api.Empty, self._shutdown),
            "RunPodSandbox": (api.RunPodSandboxRequest, self._run_pod_sandbox),
            "StopPodSandbox": (api.StopPodSandboxRequest, self._stop_pod_sandbox),
            "RemovePodSandbox": (api.RemovePodSandboxRequest, self._remove_pod_sandbox),
            "CreateContainer": (api.CreateContainerRequest, self._create_container),
            "StateChange": (api.StateChangeEvent, self._state_change),
        }
        return {(PLUGIN_SERVICE, m): unary(t, f) for m, (t, f) in table.items()}

    async def _in_worker(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        status = FAILED
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
            status = SUCCESS
            return result
        except HookError as exc:  # reported by the hook with its pod, device and step: no traceback
            raise ttrpc.RPCError(ttrpc.UNKNOWN, str(exc)) from None
        finally:
            seconds = time.perf_counter() - start
            if self.metrics is not None:
                self.metrics.observe_hook(what, status, seconds)
            ms = seconds * 1e3
            level = logging.WARNING if ms > self.request_timeout * 1e3 / 2 else logging.DEBUG
            log.log(level, "NRI hook done", extra={"kv": {"hook": what, "ms": round(ms, 3)}})

    async def _configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
        if req.request_timeout:
            self.request_timeout = req.request_timeout / 1000.0
        log.info(
            "NRI configure",
            extra={
                "kv": {
                    "runtime": req.runtime_name,
                    "version": req.runtime_version,
                    "request_timeout_ms": req.request_timeout,
                }
            },
        )
        # fail_request: a pod whose NIC hook died or timed out must fail, not start without its
        # NIC (the Go driver's issue #310); keep_connected: one slow call does not unregister us.
        # Runtimes older than NRI v0.12.5 ignore the field.
        policy = api.FailurePolicy(fail_request=True, keep_connected=True)
        return api.ConfigureResponse(events=event_mask(SUBSCRIBED_EVENTS), failure_policy=policy)

    async def _synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        # Chunked: collect until a message with more=false, echo `more` on every chunk.
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            return api.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        await self._in_worker("Synchronize", self.handler.synchronize, pods, containers)
        self.synchronized += 1
        return api.SynchronizeResponse(more=False)

    async def _shutdown(self, _req: api.Empty) -> api.Empty:
        await self._in_worker("Shutdown", self.handler.shutdown)
        return api.Empty()

    async def _run_pod_sandbox(self, req: api.RunPodSandboxRequest) -> api.RunPodSandboxResponse:
        await self._in_worker("RunPodSandbox", self.handler.run_pod_sandbox, req.pod)
        return api.RunPodSandboxResponse()

    async def _stop_pod_sandbox(self, req: api.StopPodSandboxRequest) -> api.StopPodSandboxResponse:
        await self._in_worker("StopPodSandbox", self.handler.stop_pod_sandbox, req.pod)
        return api.StopPodSandboxResponse()

    async def _remove_pod_sandbox(self, req: api.RemovePodSandboxRequest) -> api.RemovePodSandboxResponse:
        await self._in_worker("RemovePodSandbox", self.handler.remove_pod_sandbox, req.pod)
        return api.RemovePodSandboxResponse()

    async def _create_container(self, req: api.CreateContainerRequest) -> api.CreateContainerResponse:
        adjust = await self._in_worker("CreateContainer", self.handler.create_container, req.pod, req.container)
        resp = api.CreateContainerResponse()
        if adjust is not None:
            resp.adjust.CopyFrom(adjust)
        return resp

    async def _state_change(self, req: api.StateChangeEvent) -> api.Empty:
        # Runtimes before NRI v0.12 deliver pod events only through StateChange.
        hooks = {
            api.RUN_POD_SANDBOX: ("RunPodSandbox", self.handler.run_pod_sandbox),
            api.STOP_POD_SANDBOX: ("StopPodSandbox", self.handler.stop_pod_sandbox),
            api.REMOVE_POD_SANDBOX: ("RemovePodSandbox", self.handler.remove_pod_sandbox),
        }
        if req.event in hooks:
            what, fn = hooks[req.event]
            await self._in_worker(what, fn, req.pod)
        return api.Empty()
