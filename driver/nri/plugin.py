"""The NRI plugin lifecycle: connect, register, configure, synchronize, dispatch, reconnect.

The runtime (containerd, CRI-O) listens on the NRI socket; we connect, serve the
``Plugin`` service on mux connection 1, call ``Runtime.RegisterPlugin`` on mux
connection 2, then answer Configure, Synchronize and the pod/container events we
subscribed to.

The connection lives in one dedicated thread with a blocking socket: it reads a request, runs
the hook right there and writes the answer. The runtime sends a plugin one event at a time (its
adaptation holds a lock per event), the hooks' netlink work is blocking (the host sockets are per
thread) and they must not run concurrently anyway, so one thread loses nothing. It saves the pod
start the hand-offs an event loop would add: the loop waking for the request, a worker thread
woken for the hook, the loop woken again for the answer: a hook is answered sooner after its
kernel wait this way than through an asyncio reader and a worker thread (measured against the
containerd/nri harness: docs/performance.md, "What makes it fast"). :meth:`NRIPlugin.run` is the
asyncio face the daemon supervises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from google.protobuf.message import DecodeError

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.config import DRIVER_NAME
from driver.metrics import FAILED, SUCCESS, Metrics
from driver.nri import ttrpc
from driver.nri.claim_reports import HookError
from driver.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, MuxError, encode
from driver.nri.step_clock import RUNTIME_CALL_TIMEOUT_S

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTRATION_TIMEOUT = 5.0  # s, containerd/nri DefaultPluginRegistrationTimeout
RECV_BYTES = 256 << 10
"""Bytes asked of the socket per read (a Synchronize of thousands of pods arrives in several)."""

SUBSCRIBED_EVENTS = (api.RUN_POD_SANDBOX, api.STOP_POD_SANDBOX, api.REMOVE_POD_SANDBOX, api.CREATE_CONTAINER)


def event_mask(events: Sequence[int]) -> int:
    """The ConfigureResponse.events bit mask: bit ``event - 1`` per event (pkg/api/event.go)."""
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class NRIHandler(Protocol):
    """What the plugin calls for each runtime event; methods run in the plugin's connection thread.

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
        self.registered = asyncio.Event()  # set while registered with a runtime (in run()'s loop)
        self.sessions = 0  # completed registrations, for tests and metrics
        self.synchronized = 0  # completed Synchronize calls, over every connection
        # Whether the current connection completed its Synchronize: the runtime now calls us for
        # its events (a lost connection clears it until the next one is synchronized).
        self.in_sync = False
        self.request_timeout: float = RUNTIME_CALL_TIMEOUT_S  # updated from ConfigureRequest
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        # The connection's thread, the same for every session: the hooks' host netlink sockets
        # are per thread.
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nri-hook")
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []
        self._methods_table = self._methods()

    async def run(self) -> None:
        """Connect, serve, and reconnect after each disconnect until :meth:`stop` is called (or the
        task is cancelled)."""
        self._loop = asyncio.get_running_loop()
        serving = self._loop.run_in_executor(self._worker, self._serve)
        try:
            await asyncio.shield(serving)
        finally:
            if not serving.done():
                self.stop()  # cancelled: the thread ends with its connection
            self._worker.shutdown(wait=False)

    def stop(self) -> None:
        """Disconnect and make :meth:`run` return (from any thread)."""
        self._stopping.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's blocking read

    def _serve(self) -> None:
        """(connection thread) Sessions until :meth:`stop`, with backoff between failed ones."""
        delay = self.reconnect.initial
        while not self._stopping.is_set():
            try:
                registered = self._session()
            except (OSError, MuxError, ttrpc.RPCError) as exc:
                registered = False
                log.info("NRI connection failed", extra={"kv": {"socket": self.socket_path, "error": str(exc)}})
            if self._stopping.is_set():
                break
            delay = self.reconnect.initial if registered else min(delay * 2, self.reconnect.maximum)
            self._stopping.wait(delay)

    def _session(self) -> bool:
        """(connection thread) One connection's life; returns whether registration succeeded."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock = sock
        registered = False
        try:
            if self._stopping.is_set():  # stop() ran before the socket was visible to it
                return False
            sock.settimeout(REGISTRATION_TIMEOUT)
            sock.connect(self.socket_path)
            conn = _Connection(sock, self._methods_table)
            req = api.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.idx)
            conn.call(RUNTIME_SERVICE, "RegisterPlugin", req.SerializeToString(), timeout=REGISTRATION_TIMEOUT)
            sock.settimeout(None)
            registered = True
            self.sessions += 1
            self._set_registered(True)
            log.info(
                "NRI plugin registered", extra={"kv": {"name": self.name, "idx": self.idx, "socket": self.socket_path}}
            )
            while conn.pump():
                pass
            log.info("NRI runtime connection closed", extra={"kv": {"socket": self.socket_path}})
        finally:
            self.in_sync = False
            self._set_registered(False)
            self._sock = None
            sock.close()
        return registered

    def _set_registered(self, value: bool) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(self.registered.set if value else self.registered.clear)

    def _methods(self) -> dict[tuple[str, str], ttrpc.Handler]:
        def unary(req_type: Any, fn: Callable[[Any], Any]) -> ttrpc.Handler:
            def call(payload: bytes) -> bytes:
                req = req_type()
                try:
                    req.ParseFromString(payload)
                except DecodeError as exc:
                    name = req_type.DESCRIPTOR.name
                    raise ttrpc.RPCError(ttrpc.INVALID_ARGUMENT, f"payload is not a {name}: {exc}") from None
                return fn(req).SerializeToString()

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

    def _hook(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one handler method: timed, counted, a :class:`HookError` answered without a traceback."""
        start = time.perf_counter()
        status = FAILED
        try:
            result = fn(*args)
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

    def _configure(self, req: api.ConfigureRequest) -> api.ConfigureResponse:
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

    def _synchronize(self, req: api.SynchronizeRequest) -> api.SynchronizeResponse:
        # Chunked: collect until a message with more=false, echo `more` on every chunk.
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            return api.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        self._hook("Synchronize", self.handler.synchronize, pods, containers)
        self.synchronized += 1
        self.in_sync = True
        return api.SynchronizeResponse(more=False)

    def _shutdown(self, _req: api.Empty) -> api.Empty:
        self._hook("Shutdown", self.handler.shutdown)
        return api.Empty()

    def _run_pod_sandbox(self, req: api.RunPodSandboxRequest) -> api.RunPodSandboxResponse:
        self._hook("RunPodSandbox", self.handler.run_pod_sandbox, req.pod)
        return api.RunPodSandboxResponse()

    def _stop_pod_sandbox(self, req: api.StopPodSandboxRequest) -> api.StopPodSandboxResponse:
        self._hook("StopPodSandbox", self.handler.stop_pod_sandbox, req.pod)
        return api.StopPodSandboxResponse()

    def _remove_pod_sandbox(self, req: api.RemovePodSandboxRequest) -> api.RemovePodSandboxResponse:
        self._hook("RemovePodSandbox", self.handler.remove_pod_sandbox, req.pod)
        return api.RemovePodSandboxResponse()

    def _create_container(self, req: api.CreateContainerRequest) -> api.CreateContainerResponse:
        adjust = self._hook("CreateContainer", self.handler.create_container, req.pod, req.container)
        resp = api.CreateContainerResponse()
        if adjust is not None:
            resp.adjust.CopyFrom(adjust)
        return resp

    def _state_change(self, req: api.StateChangeEvent) -> api.Empty:
        # Runtimes before NRI v0.12 deliver pod events only through StateChange.
        hooks = {
            api.RUN_POD_SANDBOX: ("RunPodSandbox", self.handler.run_pod_sandbox),
            api.STOP_POD_SANDBOX: ("StopPodSandbox", self.handler.stop_pod_sandbox),
            api.REMOVE_POD_SANDBOX: ("RemovePodSandbox", self.handler.remove_pod_sandbox),
        }
        if req.event in hooks:
            what, fn = hooks[req.event]
            self._hook(what, fn, req.pod)
        return api.Empty()


class _Connection:
    """One connection to the runtime on a blocking socket: the plugin service answered inline, the
    plugin's own calls matched to their answers."""

    def __init__(self, sock: socket.socket, methods: dict[tuple[str, str], ttrpc.Handler]) -> None:
        self.sock = sock
        self.methods = methods
        self.mux = MuxDecoder((PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN))
        self.server = ttrpc.FrameDecoder()
        self.client = ttrpc.FrameDecoder()
        self.calls = ttrpc.Calls()

    def pump(self) -> bool:
        """Read once and act on what arrived: each request answered before the next is read; False
        at the end of the stream."""
        data = self.sock.recv(RECV_BYTES)
        if not data:
            return False
        for conn_id, payload in self.mux.feed(data):
            if conn_id == PLUGIN_SERVICE_CONN:
                for message in self.server.feed(payload):
                    answer = ttrpc.serve(message, self.methods)
                    if answer is not None:
                        self.sock.sendall(encode(PLUGIN_SERVICE_CONN, answer))
            else:
                for message in self.client.feed(payload):
                    self.calls.receive(message)
        return True

    def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """Call the runtime and wait for the answer (answering its calls meanwhile); raises
        :class:`ttrpc.RPCError` for an error status, ``TimeoutError``, ``ConnectionError``."""
        stream_id, request = self.calls.request(service, method, payload, timeout)
        self.sock.sendall(encode(RUNTIME_SERVICE_CONN, request))
        deadline = time.monotonic() + timeout
        while stream_id not in self.calls.answers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method} in {timeout} s")
            self.sock.settimeout(left)
            if not self.pump():
                raise ConnectionError(f"NRI connection closed during {method}")
        answer = self.calls.answers.pop(stream_id)
        if isinstance(answer, ttrpc.RPCError):
            raise answer
        return answer
