"""The gRPC server's own cost: an empty NodePrepareResources through each server kind and option.

``python -m bench.bench_grpc_server [--calls 2000] [--rounds 5] [--gap 0.05]``. Each variant serves the DRA v1
``NodePrepareResources`` on a unix socket in a process of its own (the driver's layout: one
interpreter, its GIL to itself) and answers every call with an empty response, as a driver with
nothing to prepare does; one client (the kubelet's role: a unary call at a time over one
channel) times each call. Variants run interleaved, round by round (A B C ... then back), so
drift hits them alike. Printed: each variant's median and p99 per call, and the ratio to the
aio server the driver ran with before. ``--gap S``: the client sleeps S seconds before each call, as
the kubelet's calls come (a server idle between calls wakes its threads for each; back to back,
they are warm).

Variants: ``aio`` (``grpc.aio.server()``, the driver's kind until now), ``aio-options`` (the same
with SO_REUSEPORT off, compression off, message limits set), ``aio-service`` (the driver's own
``DRAService`` over a driver whose prepare returns at once), ``sync-1`` / ``sync-4`` (the
thread-pool server with 1 and 4 workers, the handler answering on the pool's thread), ``sync-service``
(``DRAService`` run synchronously on the pool's thread). The protobuf runtime is printed (upb is
the C one).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.internal import api_implementation

from bench.stats import pct
from dranet_proto import dra_v1_pb2 as pb

METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.default_compression_algorithm", 0),
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.max_send_message_length", 16 << 20),
]
VARIANTS = ("aio", "aio-options", "aio-service", "sync-1", "sync-4", "sync-service")


def _empty(_request: Any, _context: Any) -> Any:
    return pb.NodePrepareResourcesResponse()


async def _aempty(_request: Any, _context: Any) -> Any:
    return pb.NodePrepareResourcesResponse()


class _Nothing:
    """A driver with nothing to prepare."""

    async def prepare(self, claims: Any) -> dict[str, Any]:
        return {}

    async def unprepare(self, claims: Any) -> dict[str, str]:
        return {}


def _handlers(fn: Any) -> grpc.GenericRpcHandler:
    handler = grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=pb.NodePrepareResourcesRequest.FromString,
        response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
    )
    name = pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
    return grpc.method_handlers_generic_handler(name, {"NodePrepareResources": handler})


async def _serve_aio(variant: str, socket_path: str, ready: Any) -> None:
    server = grpc.aio.server(options=OPTIONS if variant == "aio-options" else None)
    if variant == "aio-service":
        from driver.dra.dra_service import DRAService, add_to_server

        add_to_server(DRAService(pb, _Nothing(), None, "v1"), server)  # type: ignore[arg-type]
    else:
        server.add_generic_rpc_handlers((_handlers(_aempty),))
    server.add_insecure_port(f"unix://{socket_path}")
    await server.start()
    ready.set()
    await server.wait_for_termination()


def _serve_sync(variant: str, socket_path: str, ready: Any) -> None:
    workers = 4 if variant == "sync-4" else 1
    server = grpc.server(futures.ThreadPoolExecutor(workers))
    if variant == "sync-service":
        from driver.dra.dra_service import DRAService

        service = DRAService(pb, _Nothing(), None, "v1")  # type: ignore[arg-type]
        loop = asyncio.new_event_loop()

        def call(request: Any, context: Any) -> Any:
            return loop.run_until_complete(service.NodePrepareResources(request, context))

        server.add_generic_rpc_handlers((_handlers(call),))
    else:
        server.add_generic_rpc_handlers((_handlers(_empty),))
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    ready.set()
    server.wait_for_termination()


def _serve(variant: str, socket_path: str, ready: Any) -> None:
    if variant.startswith("aio"):
        asyncio.run(_serve_aio(variant, socket_path, ready))
    else:
        _serve_sync(variant, socket_path, ready)


def _time_calls(socket_path: str, calls: int, gap: float = 0.0) -> list[float]:
    request = pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace="ns", name="c", uid="u")]).SerializeToString()
    out = []
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        call = channel.unary_unary(METHOD)
        for _ in range(50):  # warm-up: the connection, the server's first calls
            call(request, timeout=5)
        for _ in range(calls):
            if gap:
                time.sleep(gap)
            t0 = time.perf_counter()
            call(request, timeout=5)
            out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (each variant once per round, order alternating)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--gap", type=float, default=0.0, help="seconds the client waits before each call")
    a = ap.parse_args(argv)
    variants = a.variants.split(",")
    ctx = multiprocessing.get_context("spawn")
    folder = Path(tempfile.mkdtemp(prefix="dn-grpc-"))
    servers = {}
    try:
        for v in variants:
            ready = ctx.Event()
            path = str(folder / f"{v}.sock")
            proc = ctx.Process(target=_serve, args=(v, path, ready), daemon=True)
            proc.start()
            if not ready.wait(30):
                raise SystemExit(f"{v}: the server did not start")
            servers[v] = (proc, path)
        times: dict[str, list[float]] = {v: [] for v in variants}
        for r in range(a.rounds):
            for v in variants if r % 2 == 0 else list(reversed(variants)):
                times[v] += _time_calls(servers[v][1], a.calls, a.gap)
        print(
            f"empty NodePrepareResources, {a.rounds} x {a.calls} calls per variant, {a.gap * 1e3:.0f} ms apart "
            f"(protobuf: {api_implementation.Type()}, grpcio {grpc.__version__}, load {os.getloadavg()[0]:.2f}):"
        )
        base = statistics.median(times[variants[0]])
        for v in variants:
            med, p99 = statistics.median(times[v]), pct(times[v], 99)
            print(
                f"  {v:<14} median {med * 1e3:6.3f} ms   p99 {p99 * 1e3:6.3f} ms"
                f"   median / {variants[0]}: {med / base:4.2f}"
            )
        return 0
    finally:
        for proc, _ in servers.values():
            proc.kill()
        for p in folder.iterdir():
            p.unlink()
        folder.rmdir()


if __name__ == "__main__":
    raise SystemExit(main())
