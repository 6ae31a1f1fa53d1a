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

import logging
import os
from pathlib import Path
from types import ModuleType

import grpc

from dranet_proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from dranet_proto import dra_v1_pb2 as v1_pb
from dranet_proto import dra_v1beta1_pb2 as v1beta1_pb
from dranet_proto import pluginregistration_pb2_grpc as reg_grpc
from driver.claims.prepare import Preparer
from driver.config import DriverConfig
from driver.kubelet.device_health import DeviceHealthFeed, DeviceHealthService
from driver.kubelet.dra_service import DRAService, add_to_server
from driver.kubelet.registration import RegistrationService
from driver.metrics import Metrics

log = logging.getLogger(__name__)

DRA_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]  # kubelet 1.34+ picks the first it knows
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"


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

    def __init__(
        self,
        config: DriverConfig,
        preparer: Preparer,
        health: DeviceHealthFeed | None = None,
        metrics: Metrics | None = None,
        health_check_timeout: int = 60,
        health_resend: float = 10.0,
    ) -> None:
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
        services: list[tuple[ModuleType, str]] = [(v1_pb, "v1"), (v1beta1_pb, "v1beta1")]
        for pb, version in services:
            add_to_server(DRAService(pb, self.preparer, self.metrics, version), dra)
        if self.health is not None:
            service = DeviceHealthService(self.health, self.health_check_timeout, self.health_resend)
            health_grpc.add_DRAResourceHealthServicer_to_server(service, dra)
        dra.add_insecure_port(_listen_path(self.dra_socket))
        await dra.start()
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
