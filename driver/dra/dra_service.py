"""The DRA gRPC service (v1 and v1beta1): NodePrepareResources / NodeUnprepareResources.

Both proto versions carry the same messages and go to the driver's
:class:`~driver.dra.protocol.ClaimPreparer`; this module only converts between the protobuf
messages and the driver's results, counts errors and times each call (:class:`RequestMetrics`).

The calls are answered on the DRA server's own threads (:mod:`driver.dra.plugin`): a driver that
prepares without the event loop (:class:`~driver.dra.protocol.BlockingPreparer`) runs start to end
on the call's thread, with no hand-off; another one's coroutines are run on the daemon's loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from driver.dra.protocol import ClaimPreparer, ClaimRef, PrepareResult

log = logging.getLogger(__name__)

PREPARE, UNPREPARE = "PrepareResourceClaims", "UnprepareResourceClaims"
"""The ``method`` of :meth:`RequestMetrics.observe_request` (the names of Go's ``DRAPlugin`` methods)."""


class RequestMetrics(Protocol):
    """Where the kubelet's calls are counted and timed."""

    def observe_request(self, method: str, ok: bool, seconds: float, claim_errors: int = 0) -> None:
        """One call of ``method``: whether every claim succeeded, its duration, how many claims failed."""
        ...


@dataclass(frozen=True)
class Unparsable:
    """Request bytes that are not the method's message (answered INVALID_ARGUMENT, not a traceback)."""

    message: str


def _tolerant(message_type: Any) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: grpc would log a traceback and answer UNKNOWN."""

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as exc:
            return Unparsable(f"the request is not a {message_type.DESCRIPTOR.full_name}: {exc}")

    return parse


def add_to_server(service: DRAService, server: grpc.Server) -> None:
    """Register ``service`` under its proto version's DRAPlugin name, as the generated
    ``add_DRAPluginServicer_to_server`` does, but with :func:`_tolerant` deserializers."""
    pb = service.pb
    handlers = {
        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
            service.NodePrepareResources,
            request_deserializer=_tolerant(pb.NodePrepareResourcesRequest),
            response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
        ),
        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
            service.NodeUnprepareResources,
            request_deserializer=_tolerant(pb.NodeUnprepareResourcesRequest),
            response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
        ),
    }
    name = pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


def _refuse_unparsable(request: Any, context: grpc.ServicerContext) -> None:
    if isinstance(request, Unparsable):
        log.info("unparsable DRA request", extra={"kv": {"error": request.message}})
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def _claim_refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def _prepare_response(pb: ModuleType, results: Mapping[str, PrepareResult], share_ids: bool) -> Any:
    response = pb.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = response.claims[uid]
        if result.error:
            entry.error = result.error
            continue
        for d in result.devices:
            device = entry.devices.add(
                request_names=d.request_names, pool_name=d.pool, device_name=d.device, cdi_device_ids=d.cdi_device_ids
            )
            if share_ids and d.share_id:
                device.share_id = d.share_id
    return response


def blocking(
    driver: ClaimPreparer, method: str, loop: asyncio.AbstractEventLoop | None
) -> Callable[[Sequence[ClaimRef]], Any]:
    """The driver's ``method`` (``prepare``, ``unprepare``) as a call that blocks its thread: its
    ``<method>_now`` when it has one, else its coroutine run on ``loop``."""
    now = getattr(driver, f"{method}_now", None)
    if now is not None:
        return now  # type: ignore[no-any-return]
    coroutine = getattr(driver, method)
    if loop is None:
        raise ValueError(f"the driver has no {method}_now: its coroutine needs the daemon's event loop")

    def run(claims: Sequence[ClaimRef]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine(claims), loop).result()

    return run


class DRAService:
    """NodePrepare/NodeUnprepare for one proto version; both versions share the driver."""

    def __init__(
        self,
        pb: ModuleType,
        driver: ClaimPreparer,
        metrics: RequestMetrics | None,
        version: str,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.pb = pb
        self.driver = driver
        self.metrics = metrics
        self.version = version
        self._prepare = blocking(driver, "prepare", loop)
        self._unprepare = blocking(driver, "unprepare", loop)

    def _observe(self, method: str, ok: bool, start: float, claim_errors: int = 0) -> None:
        if self.metrics is not None:
            self.metrics.observe_request(method, ok, time.perf_counter() - start, claim_errors)

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        _refuse_unparsable(request, context)
        start = time.perf_counter()
        ok, failed = False, 0
        try:
            results = self._prepare(_claim_refs(request))
            failed = sum(1 for r in results.values() if r.error)
            ok = not failed  # the Go driver: any claim error fails the call
            return _prepare_response(self.pb, results, share_ids=self.version == "v1")
        except Exception as exc:  # never let a bug kill the call without per-claim answers
            log.exception("NodePrepareResources failed")
            return _prepare_response(
                self.pb, {c.uid: PrepareResult(error=f"internal error: {exc}") for c in request.claims}, share_ids=False
            )
        finally:
            self._observe(PREPARE, ok, start, failed)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        _refuse_unparsable(request, context)
        start = time.perf_counter()
        ok = False
        response = self.pb.NodeUnprepareResourcesResponse()
        errors: Mapping[str, str]
        try:
            errors = self._unprepare(_claim_refs(request))
            ok = not any(errors.values())
        except Exception as exc:
            log.exception("NodeUnprepareResources failed")
            errors = {c.uid: f"internal error: {exc}" for c in request.claims}
        finally:
            self._observe(UNPREPARE, ok, start)
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response
