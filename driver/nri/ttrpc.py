"""ttrpc (containerd/ttrpc) framing, a unary server and a unary client on a byte stream.

A ttrpc message is a 10-byte header (data length uint32 BE, stream id uint32 BE,
type uint8, flags uint8) followed by the data: a ``ttrpc.Request`` (type 1) or a
``ttrpc.Response`` (type 2) protobuf envelope. Clients use odd stream ids. Only
unary calls are implemented: NRI uses nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from dranet_proto import ttrpc_pb2

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IIBB")
MESSAGE_LENGTH_MAX = 4 << 20
TYPE_REQUEST = 0x1
TYPE_RESPONSE = 0x2

# grpc status codes used here (google.golang.org/grpc/codes).
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12

Handler = Callable[[bytes], Awaitable[bytes]]
"""A unary method: serialized request in, serialized response out."""


class ByteStream(Protocol):
    """What ttrpc needs from a transport (a :class:`driver.nri.mux.MuxConn`)."""

    async def readexactly(self, n: int) -> bytes: ...

    async def write(self, data: bytes) -> None: ...


class RPCError(Exception):
    """A call failed with a ttrpc/grpc status; raise it from a handler to choose the code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"rpc error: code = {code} desc = {message}")
        self.code = code
        self.message = message


@dataclass
class Frame:
    """One ttrpc message."""

    stream_id: int
    type: int
    flags: int
    data: bytes


def encode_frame(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    """Header + data; refuses data over ttrpc's 4 MiB limit like the Go channel does."""
    if len(data) > MESSAGE_LENGTH_MAX:
        raise RPCError(RESOURCE_EXHAUSTED, f"message length {len(data)} exceeds maximum {MESSAGE_LENGTH_MAX}")
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


DISCARD_CHUNK = 64 << 10


async def read_frame(stream: ByteStream) -> Frame:
    """Read one message. One announcing more than :data:`MESSAGE_LENGTH_MAX` is refused before its
    data is read: the data is skipped in small pieces (never held, as the Go channel discards it)
    and the message raised as RESOURCE_EXHAUSTED."""
    length, stream_id, msg_type, flags = HEADER.unpack(await stream.readexactly(HEADER.size))
    if length > MESSAGE_LENGTH_MAX:
        left = length
        while left:
            left -= len(await stream.readexactly(min(left, DISCARD_CHUNK)))
        raise _Oversized(stream_id, length)
    return Frame(stream_id, msg_type, flags, await stream.readexactly(length))


class _Oversized(Exception):
    def __init__(self, stream_id: int, length: int) -> None:
        super().__init__(f"message length {length} exceeds maximum {MESSAGE_LENGTH_MAX}")
        self.stream_id = stream_id


def _response(code: int, message: str, payload: bytes = b"") -> bytes:
    resp = ttrpc_pb2.Response(payload=payload)
    resp.status.code = code
    resp.status.message = message
    return resp.SerializeToString()


MAX_PENDING_BYTES = 2 * MESSAGE_LENGTH_MAX
"""Request bytes a server holds in calls not answered yet; past that it reads no more until some are."""


class Server:
    """Serves unary methods, keyed by (fully qualified service, method), on one stream.

    Each request runs in its own task so a slow hook never blocks reading, up to
    :data:`MAX_PENDING_BYTES` of requests in flight; an unknown method answers UNIMPLEMENTED and a
    handler exception answers an error status for that call only.
    """

    def __init__(self, stream: ByteStream, methods: dict[tuple[str, str], Handler]) -> None:
        self._stream = stream
        self._methods = methods
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending = 0
        self._drained = asyncio.Event()
        self._drained.set()

    async def serve(self) -> None:
        """Answer requests until the stream ends."""
        try:
            while True:
                await self._drained.wait()
                try:
                    frame = await read_frame(self._stream)
                except _Oversized as exc:
                    await self._send(exc.stream_id, _response(RESOURCE_EXHAUSTED, str(exc)))
                    continue
                if frame.type != TYPE_REQUEST:
                    log.warning(
                        "ttrpc: ignoring non-request message",
                        extra={"kv": {"type": frame.type, "stream": frame.stream_id}},
                    )
                    continue
                task = asyncio.create_task(self._handle(frame))
                self._tasks.add(task)
                size = len(frame.data)
                self._hold(size)
                task.add_done_callback(functools.partial(self._release, size))
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            for task in list(self._tasks):
                task.cancel()

    def _hold(self, n: int) -> None:
        self._pending += n
        if self._pending >= MAX_PENDING_BYTES:
            self._drained.clear()

    def _release(self, n: int, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._pending -= n
        if self._pending < MAX_PENDING_BYTES:
            self._drained.set()

    async def _handle(self, frame: Frame) -> None:
        req = ttrpc_pb2.Request()
        try:
            req.ParseFromString(frame.data)
        except Exception as exc:  # noqa: BLE001 - any decode failure is the caller's fault
            await self._send(frame.stream_id, _response(INVALID_ARGUMENT, f"bad ttrpc request: {exc}"))
            return
        method = self._methods.get((req.service, req.method))
        if method is None:
            await self._send(frame.stream_id, _response(UNIMPLEMENTED, f"{req.service}.{req.method} not implemented"))
            return
        try:
            payload = await method(req.payload)
            body = _response(OK, "", payload)
        except RPCError as exc:
            if exc.code == INVALID_ARGUMENT:  # the caller's mistake: no traceback
                log.warning("ttrpc: invalid request", extra={"kv": {"method": req.method, "error": exc.message}})
            body = _response(exc.code, exc.message)
        except Exception as exc:
            log.exception("ttrpc: handler failed", extra={"kv": {"method": req.method}})
            body = _response(UNKNOWN, str(exc) or type(exc).__name__)
        await self._send(frame.stream_id, body)

    async def _send(self, stream_id: int, body: bytes) -> None:
        try:
            await self._stream.write(encode_frame(stream_id, TYPE_RESPONSE, body))
        except RPCError as exc:
            await self._stream.write(encode_frame(stream_id, TYPE_RESPONSE, _response(exc.code, exc.message)))
        except ConnectionError:
            log.info("ttrpc: connection closed before response", extra={"kv": {"stream": stream_id}})


class Client:
    """Unary ttrpc client; :meth:`run` must be running to receive responses."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._closed: BaseException | None = None

    async def call(self, service: str, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        """Call ``service.method``; returns the response payload or raises :class:`RPCError`."""
        if self._closed is not None:
            raise ConnectionError(f"ttrpc client closed: {self._closed}")
        stream_id = self._next_id
        self._next_id += 2  # client streams are odd
        req = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9) if timeout else 0
        )
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = fut
        try:
            await self._stream.write(encode_frame(stream_id, TYPE_REQUEST, req.SerializeToString()))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(stream_id, None)

    async def run(self) -> None:
        """Dispatch responses to waiting calls until the stream ends; then fail them all."""
        try:
            while True:
                frame = await read_frame(self._stream)
                fut = self._pending.get(frame.stream_id)
                if fut is None or fut.done() or frame.type != TYPE_RESPONSE:
                    continue
                resp = ttrpc_pb2.Response()
                resp.ParseFromString(frame.data)
                if resp.status.code != OK:
                    fut.set_exception(RPCError(resp.status.code, resp.status.message))
                else:
                    fut.set_result(resp.payload)
        except (asyncio.IncompleteReadError, ConnectionError, _Oversized) as exc:
            self._closed = exc
        finally:
            if self._closed is None:
                self._closed = ConnectionError("ttrpc client stopped")
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("NRI connection closed during call"))
