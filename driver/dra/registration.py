"""Plugin registration: the kubelet finds our registration socket, asks who we are, and says
whether it accepted us.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc

from dranet_proto import pluginregistration_pb2 as reg_pb
from dranet_proto import pluginregistration_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"


class PluginIdentity(Protocol):
    """What registration tells the kubelet, and where it records the kubelet's verdict."""

    driver_name: str
    dra_socket: str
    supported_versions: list[str]
    registered: bool | None


class RegistrationService(reg_grpc.RegistrationServicer):
    """``pluginregistration.Registration``: tells the kubelet who we are and hears its verdict."""

    def __init__(self, plugin: PluginIdentity) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.aio.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.plugin.driver_name,
            endpoint=self.plugin.dra_socket,
            supported_versions=self.plugin.supported_versions,
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        self.plugin.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"kv": {"driver": self.plugin.driver_name}})
        else:
            log.error("kubelet rejected the plugin registration", extra={"kv": {"error": request.error}})
        return reg_pb.RegistrationStatusResponse()
