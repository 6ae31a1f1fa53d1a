"""A DRA driver's kubelet plugin: registration and DRA gRPC servers on unix sockets.

Two gRPC servers, as the Go helper (k8s.io/dynamic-resource-allocation/kubeletplugin):

* ``<kubelet root>/plugins/<driver>/dra.sock`` serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  and the v1beta1 service (same messages; both go to the driver's :class:`~driver.dra.protocol.ClaimPreparer`),
  plus ``v1alpha1.DRAResourceHealth`` when a :class:`DeviceHealthFeed` is given;
* ``<kubelet root>/plugins_registry/<driver>-reg.sock`` serves ``pluginregistration.Registration``.

The DRA server starts first so the kubelet, which dials it right after registration,
always finds it ready. It is grpcio's thread-pool server, not the asyncio one: a call runs on one
of its threads from the request to the answer, where the asyncio server hands each call to the
event loop and back (``bench/bench_grpc_server.py`` measures an empty call both ways); the health
stream holds one of its threads while the kubelet watches. The registration server, called a few
times in a driver's life, is an asyncio one. Sockets are removed on stop, which deregisters the plugin.

The caller names the sockets. With an instance id (the pod UID) both carry its first
8 characters (``<driver>-<id>-reg.sock``, ``dra-<id>.sock``: the naming of
k8s.io/dynamic-resource-allocation's kubeletplugin with ``RollingUpdate``, shortened because a
unix socket path has 107 bytes), so during a rolling update the new driver pod
registers beside the old one and the kubelet (>= 1.33) prefers the newest connected one. A
stopping instance removes its registration socket first and keeps answering on its DRA socket
for :data:`DEREGISTER_DELAY` seconds, until the kubelet has noticed (its plugin watcher
reconciles every second). Sockets of instances that died without removing them (kill -9) are
removed at start: a unix socket nobody listens on refuses connections.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import grpc

from dranet_proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from dranet_proto import dra_v1_pb2 as v1_pb
from dranet_proto import dra_v1beta1_pb2 as v1beta1_pb
from dranet_proto import pluginregistration_pb2_grpc as reg_grpc
from driver.dra.dra_service import DRAService, RequestMetrics, add_to_server
from driver.dra.health import DeviceHealthFeed, DeviceHealthService
from driver.dra.protocol import ClaimPreparer
from driver.dra.registration import RegistrationService

log = logging.getLogger(__name__)

DRA_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # kubelet 1.34+ picks the first it knows
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
DEREGISTER_DELAY = 2.0
"""Seconds a stopping plugin keeps serving DRA calls after removing its registration socket."""
STOP_GRACE = 5.0
"""Seconds in-flight DRA calls get to finish when the server stops."""
DRA_THREADS = 8
"""Threads of the DRA server: the kubelet's calls in flight at once (one per pod it starts or
ends, each with its claims) and the health stream (one thread while the kubelet watches)."""


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


def _nobody_listens(path: Path) -> bool:
    """True for a unix socket file no process accepts on (left by a killed instance)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError as exc:
        return exc.errno in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        s.close()
    return False


def remove_stale_sockets(registry_dir: Path, plugin_dir: Path, driver_name: str, keep: set[str]) -> list[str]:
    """Remove registration and DRA sockets of dead instances of ``driver_name``; returns their paths.

    Registration sockets are ``<driver>-reg.sock`` and ``<driver>-<id>-reg.sock``, DRA sockets
    ``dra.sock`` and ``dra-<id>.sock``; paths in ``keep`` (ours) are left alone.
    """
    reg = re.compile(rf"^{re.escape(driver_name)}(-[^/]+)?-reg\.sock$")
    dra = re.compile(r"^dra(-[^/]+)?\.sock$")
    removed = []
    for directory, pattern in ((registry_dir, reg), (plugin_dir, dra)):
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if str(path) in keep or not pattern.match(path.name) or not path.is_socket():
                continue
            if _nobody_listens(path):
                _remove(str(path))
                removed.append(str(path))
    return removed


class KubeletPlugin:
    """Registration + DRA gRPC servers for one driver instance."""

    def __init__(
        self,
        driver: ClaimPreparer,
        driver_name: str,
        dra_socket: str,
        registration_socket: str,
        *,
        health: DeviceHealthFeed | None = None,
        metrics: RequestMetrics | None = None,
        health_check_timeout: int = 60,
        health_resend: float = 10.0,
    ) -> None:
        self.driver = driver
        self.driver_name = driver_name
        self.health = health
        self.metrics = metrics
        self.health_check_timeout = health_check_timeout
        self.health_resend = health_resend
        self.dra_socket = os.path.abspath(dra_socket)
        self.registration_socket = os.path.abspath(registration_socket)
        self.supported_versions = DRA_SERVICES + ([HEALTH_SERVICE] if health is not None else [])
        self.registered: bool | None = None  # last NotifyRegistrationStatus verdict
        self._dra: grpc.Server | None = None
        self._reg: grpc.aio.Server | None = None

    @property
    def serving(self) -> bool:
        """True once both sockets accept calls."""
        return self._dra is not None and self._reg is not None

    async def start(self) -> None:
        """Serve the DRA socket, then the registration socket (which makes the kubelet call us)."""
        stale = await asyncio.to_thread(
            remove_stale_sockets,
            Path(self.registration_socket).parent,
            Path(self.dra_socket).parent,
            self.driver_name,
            {self.registration_socket, self.dra_socket},
        )
        if stale:
            log.info("removed sockets of driver instances that are gone", extra={"kv": {"sockets": stale}})
        loop = asyncio.get_running_loop()
        dra = grpc.server(ThreadPoolExecutor(DRA_THREADS, thread_name_prefix="dra-grpc"))
        services: list[tuple[ModuleType, str]] = [(v1_pb, "v1"), (v1beta1_pb, "v1beta1")]
        for pb, version in services:
            add_to_server(DRAService(pb, self.driver, self.metrics, version, loop), dra)
        if self.health is not None:
            self.health.open()
            service = DeviceHealthService(self.health, self.health_check_timeout, self.health_resend)
            health_grpc.add_DRAResourceHealthServicer_to_server(service, dra)
        dra.add_insecure_port(_listen_path(self.dra_socket))
        dra.start()
        self._dra = dra
        reg = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(RegistrationService(self), reg)
        reg.add_insecure_port(_listen_path(self.registration_socket))
        await reg.start()
        self._reg = reg
        log.info(
            "kubelet plugin serving",
            extra={
                "kv": {
                    "dra_socket": self.dra_socket,
                    "registration_socket": self.registration_socket,
                    "versions": self.supported_versions,
                }
            },
        )

    async def stop(self, grace: float = STOP_GRACE, deregister_delay: float = DEREGISTER_DELAY) -> None:
        """Stop both servers and remove the sockets (registration first: that deregisters us).

        The DRA server keeps answering for ``deregister_delay`` seconds after the registration
        socket is gone, then gets ``grace`` seconds for calls in flight: the kubelet's calls
        routed here before it noticed complete instead of failing.
        """
        reg, dra, self._reg, self._dra = self._reg, self._dra, None, None
        if reg is not None:
            _remove(self.registration_socket)
            await reg.stop(0)
            if dra is not None and deregister_delay > 0:
                await asyncio.sleep(deregister_delay)
        if dra is not None:
            stopped = dra.stop(grace)
            if self.health is not None:
                self.health.close()  # the health stream's thread ends at once
            await asyncio.to_thread(stopped.wait)
            _remove(self.dra_socket)
        log.info("kubelet plugin stopped")
