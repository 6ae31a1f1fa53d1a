"""ttrpc (containerd/ttrpc) framing and unary calls, decoded as bytes arrive.

A ttrpc message is a 10-byte header (data length uint32 BE, stream id uint32 BE, type uint8,
flags uint8) followed by the data: a ``ttrpc.Request`` (type 1) or a ``ttrpc.Response`` (type 2)
protobuf envelope. Clients use odd stream ids. Only unary calls are implemented: NRI uses nothing
else.

No I/O here: :class:`FrameDecoder` turns one connection's bytes into messages, :func:`serve`
answers a request with a method table, :class:`Calls` matches responses to the calls this side
made. The plugin's connection (:mod:`driver.nri.plugin`) reads and writes the socket.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

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

Handler = Callable[[bytes], bytes]
"""A unary method: serialized request in, serialized response out."""


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


@dataclass
class Oversized:
    """A message announcing more than :data:`MESSAGE_LENGTH_MAX`: its bytes were skipped, never held."""

    stream_id: int
    type: int
    length: int

    @property
    def message(self) -> str:
        return f"message length {self.length} exceeds maximum {MESSAGE_LENGTH_MAX}"


def encode_frame(stream_id: int, msg_type: int, data: bytes, flags: int = 0) -> bytes:
    """Header + data; refuses data over ttrpc's 4 MiB limit like the Go channel does."""
    if len(data) > MESSAGE_LENGTH_MAX:
        raise RPCError(RESOURCE_EXHAUSTED, f"message length {len(data)} exceeds maximum {MESSAGE_LENGTH_MAX}")
    return HEADER.pack(len(data), stream_id, msg_type, flags) + data


class FrameDecoder:
    """One connection's byte stream into ttrpc messages.

    A message announcing more than :data:`MESSAGE_LENGTH_MAX` is skipped as its bytes come (as the
    Go channel discards it) and given as :class:`Oversized`, so the decoder holds at most one
    message of the allowed size.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0  # bytes of an oversized message still to drop

    def feed(self, data: bytes) -> list[Frame | Oversized]:
        """The messages ``data`` completes, in order."""
        out: list[Frame | Oversized] = []
        view = memoryview(data)
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            view = view[dropped:]
        buf = self._buffer
        buf += view
        at = 0
        while len(buf) - at >= HEADER.size:
            length, stream_id, msg_type, flags = HEADER.unpack_from(buf, at)
            if length > MESSAGE_LENGTH_MAX:
                out.append(Oversized(stream_id, msg_type, length))
                at += HEADER.size
                dropped = min(length, len(buf) - at)
                at += dropped
                self._skip = length - dropped
                continue
            end = at + HEADER.size + length
            if len(buf) < end:
                break
            out.append(Frame(stream_id, msg_type, flags, bytes(buf[at + HEADER.size : end])))
            at = end
        del buf[:at]
        return out


def response(stream_id: int, code: int, message: str, payload: bytes = b"") -> bytes:
    """A response message (header included)."""
    resp = ttrpc_pb2.Response(payload=payload)
    resp.status.code = code
    resp.status.message = message
    return encode_frame(stream_id, TYPE_RESPONSE, resp.SerializeToString())


def serve(message: Frame | Oversized, methods: dict[tuple[str, str], Handler]) -> bytes | None:
    """The response to one message received on the server's connection (None: not a request).

    An oversized request answers RESOURCE_EXHAUSTED, an unknown method UNIMPLEMENTED, a handler's
    :class:`RPCError` its own code and any other exception UNKNOWN, for that call only.
    """
    if message.type != TYPE_REQUEST:
        log.warning(
            "ttrpc: ignoring non-request message", extra={"kv": {"type": message.type, "stream": message.stream_id}}
        )
        return None
    if isinstance(message, Oversized):
        return response(message.stream_id, RESOURCE_EXHAUSTED, message.message)
    req = ttrpc_pb2.Request()
    try:
        req.ParseFromString(message.data)
    except Exception as exc:  # noqa: BLE001 - any decode failure is the caller's fault
        return response(message.stream_id, INVALID_ARGUMENT, f"bad ttrpc request: {exc}")
    method = methods.get((req.service, req.method))
    if method is None:
        return response(message.stream_id, UNIMPLEMENTED, f"{req.service}.{req.method} not implemented")
    try:
        payload = method(req.payload)
    except RPCError as exc:
        if exc.code == INVALID_ARGUMENT:  # the caller's mistake: no traceback
            log.warning("ttrpc: invalid request", extra={"kv": {"method": req.method, "error": exc.message}})
        return response(message.stream_id, exc.code, exc.message)
    except Exception as exc:
        log.exception("ttrpc: handler failed", extra={"kv": {"method": req.method}})
        return response(message.stream_id, UNKNOWN, str(exc) or type(exc).__name__)
    try:
        return response(message.stream_id, OK, "", payload)
    except RPCError as exc:  # the answer itself is over the limit
        return response(message.stream_id, exc.code, exc.message)


class Calls:
    """The unary calls this side made on its client connection, and their answers as they arrive."""

    def __init__(self) -> None:
        self._next_id = 1
        self.pending: set[int] = set()
        self.answers: dict[int, bytes | RPCError] = {}

    def request(self, service: str, method: str, payload: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        """A new call: its stream id and the request message to send."""
        stream_id = self._next_id
        self._next_id += 2  # client streams are odd
        req = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9) if timeout else 0
        )
        self.pending.add(stream_id)
        return stream_id, encode_frame(stream_id, TYPE_REQUEST, req.SerializeToString())

    def receive(self, message: Frame | Oversized) -> None:
        """A message received on the client connection: the answer of a pending call (else ignored)."""
        if message.stream_id not in self.pending or message.type != TYPE_RESPONSE:
            return
        self.pending.discard(message.stream_id)
        if isinstance(message, Oversized):
            self.answers[message.stream_id] = RPCError(RESOURCE_EXHAUSTED, message.message)
            return
        resp = ttrpc_pb2.Response()
        try:
            resp.ParseFromString(message.data)
        except Exception as exc:  # noqa: BLE001 - a garbled answer fails that call only
            self.answers[message.stream_id] = RPCError(UNKNOWN, f"bad ttrpc response: {exc}")
            return
        if resp.status.code != OK:
            self.answers[message.stream_id] = RPCError(resp.status.code, resp.status.message)
        else:
            self.answers[message.stream_id] = resp.payload
