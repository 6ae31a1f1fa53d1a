"""A gRPC client that plays the kubelet against a DRA driver's unix sockets.

Covers what the kubelet does: GetInfo and NotifyRegistrationStatus on the registration
socket, then NodePrepareResources / NodeUnprepareResources (v1 or v1beta1) and the
health stream on the endpoint the plugin advertised. Async (grpc.aio); use it as an
async context manager so channels are always closed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from types import ModuleType
from typing import Any

import grpc

from dranet_proto import dra_health_v1alpha1_pb2 as health_pb
from dranet_proto import dra_health_v1alpha1_pb2_grpc as health_grpc
from dranet_proto import dra_v1_pb2 as v1_pb
from dranet_proto import dra_v1_pb2_grpc as v1_grpc
from dranet_proto import dra_v1beta1_pb2 as v1beta1_pb
from dranet_proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from dranet_proto import pluginregistration_pb2 as reg_pb
from dranet_proto import pluginregistration_pb2_grpc as reg_grpc

ClaimTuple = tuple[str, str, str]  # (namespace, name, uid)
_VERSIONS: dict[str, tuple[ModuleType, ModuleType]] = {"v1": (v1_pb, v1_grpc), "v1beta1": (v1beta1_pb, v1beta1_grpc)}


async def wait_for_socket(path: str, timeout: float = 10.0) -> None:
    """Wait until ``path`` exists (the plugin created its socket)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not os.path.exists(path):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"socket {path} did not appear within {timeout}s")
        await asyncio.sleep(0.02)


class KubeletClient:
    """Registration and DRA calls the way the kubelet makes them."""

    def __init__(self, registration_socket: str, dra_socket: str | None = None, timeout: float = 45.0) -> None:
        self.registration_socket = registration_socket
        self.dra_socket = dra_socket  # None: use the endpoint from GetInfo
        self.timeout = timeout  # the kubelet's defaultClientCallTimeout
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def __aenter__(self) -> KubeletClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every channel."""
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    def _channel(self, path: str) -> grpc.aio.Channel:
        if path not in self._channels:
            self._channels[path] = grpc.aio.insecure_channel(f"unix://{path}")
        return self._channels[path]

    # -- registration ------------------------------------------------------------------------

    async def get_info(self) -> reg_pb.PluginInfo:
        """GetInfo; remembers the advertised endpoint for later DRA calls."""
        info = await reg_grpc.RegistrationStub(self._channel(self.registration_socket)).GetInfo(
            reg_pb.InfoRequest(), timeout=self.timeout
        )
        if self.dra_socket is None:
            self.dra_socket = info.endpoint
        return info

    async def notify(self, registered: bool = True, error: str = "") -> None:
        """NotifyRegistrationStatus."""
        await reg_grpc.RegistrationStub(self._channel(self.registration_socket)).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=self.timeout
        )

    async def wait_serving(self, timeout: float = 20.0) -> reg_pb.PluginInfo:
        """Retry GetInfo until the plugin answers (a stale socket of a killed driver refuses)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                return await reg_grpc.RegistrationStub(self._channel(self.registration_socket)).GetInfo(
                    reg_pb.InfoRequest(), timeout=1.0, wait_for_ready=False
                )
            except grpc.aio.AioRpcError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                # A channel that saw a refused connect backs off; start afresh.
                channel = self._channels.pop(self.registration_socket, None)
                if channel is not None:
                    await channel.close()
                await asyncio.sleep(0.05)

    async def register(self) -> reg_pb.PluginInfo:
        """GetInfo then NotifyRegistrationStatus(registered), as the plugin watcher does."""
        info = await self.get_info()
        await self.notify(True)
        return info

    # -- DRA ---------------------------------------------------------------------------------

    def _dra(self, version: str) -> tuple[ModuleType, Any]:
        if self.dra_socket is None:
            raise RuntimeError("no DRA socket: call get_info() first or pass dra_socket")
        pb, grpc_mod = _VERSIONS[version]
        return pb, grpc_mod.DRAPluginStub(self._channel(self.dra_socket))

    async def prepare(self, claims: Iterable[ClaimTuple], version: str = "v1") -> Any:
        """NodePrepareResources; returns the response message."""
        pb, stub = self._dra(version)
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return await stub.NodePrepareResources(request, timeout=self.timeout)

    async def unprepare(self, claims: Iterable[ClaimTuple], version: str = "v1") -> Any:
        """NodeUnprepareResources; returns the response message."""
        pb, stub = self._dra(version)
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        return await stub.NodeUnprepareResources(request, timeout=self.timeout)

    async def watch_health(self) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        """The NodeWatchResources stream (cancel the iteration to stop it)."""
        if self.dra_socket is None:
            raise RuntimeError("no DRA socket: call get_info() first or pass dra_socket")
        stub = health_grpc.DRAResourceHealthStub(self._channel(self.dra_socket))
        async for message in stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest()):
            yield message


def devices_of(response: Any, uid: str) -> list[tuple[tuple[str, ...], str, str]]:
    """``[(request_names, pool, device), ...]`` of one claim in a prepare response."""
    return [(tuple(d.request_names), d.pool_name, d.device_name) for d in response.claims[uid].devices]
