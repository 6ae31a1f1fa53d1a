"""NRI's socket multiplexer (containerd/nri ``pkg/net/multiplex``): frames decoded as bytes arrive.

One unix socket carries several virtual connections. Every write is a frame: an 8-byte header
(ConnID uint32 BE, payload length uint32 BE) then the payload. Frames are *not* aligned with the
ttrpc messages inside them (the Go side writes through a buffered writer), so each connection's
payloads are a byte stream that the ttrpc layer (:class:`driver.nri.ttrpc.FrameDecoder`)
re-assembles into messages.

No I/O here: :class:`MuxDecoder` takes the bytes the plugin's connection read and returns each
frame's payload with its connection, :func:`encode` frames a write. What the peer sends is
bounded: a frame announcing more than :data:`MAX_PAYLOAD` ends the trunk before its payload is
read, so the decoder holds at most one frame; data for a connection this side never opened is
dropped (NRI uses two).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable

log = logging.getLogger(__name__)

PLUGIN_SERVICE_CONN = 1
"""Runtime -> plugin calls: the plugin is the ttrpc server on this connection."""
RUNTIME_SERVICE_CONN = 2
"""Plugin -> runtime calls: the plugin is the ttrpc client on this connection."""

HEADER = struct.Struct(">II")
MAX_PAYLOAD = 10 + (4 << 20)
"""Largest mux payload the Go side accepts: a ttrpc header plus its 4 MiB maximum message."""


class MuxError(Exception):
    """The trunk carried something the multiplexer cannot accept."""


def encode(conn_id: int, data: bytes) -> bytes:
    """``data`` on ``conn_id`` as frames of at most :data:`MAX_PAYLOAD` bytes (one frame for empty data)."""
    if len(data) <= MAX_PAYLOAD:
        return HEADER.pack(conn_id, len(data)) + data
    view = memoryview(data)
    return b"".join(
        HEADER.pack(conn_id, len(view[off : off + MAX_PAYLOAD])) + view[off : off + MAX_PAYLOAD]
        for off in range(0, len(view), MAX_PAYLOAD)
    )


class MuxDecoder:
    """Splits the trunk's bytes into (connection, payload) for the connections in ``conns``."""

    def __init__(self, conns: Iterable[int]) -> None:
        self.conns = frozenset(conns)
        if 0 in self.conns:
            raise MuxError("mux connection id 0 is reserved")
        self.dropped = 0  # bytes received for connections this side never opened
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The payloads of the frames ``data`` completes, in order; raises :class:`MuxError` for a
        frame the trunk cannot carry (the connection must then be closed)."""
        buf = self._buffer
        buf += data
        out: list[tuple[int, bytes]] = []
        at = 0
        while len(buf) - at >= HEADER.size:
            conn_id, length = HEADER.unpack_from(buf, at)
            if length > MAX_PAYLOAD:
                raise MuxError(f"mux frame for conn {conn_id} too large: {length} bytes")
            if conn_id == 0:
                raise MuxError("mux frame on reserved connection id 0")
            end = at + HEADER.size + length
            if len(buf) < end:
                break
            if conn_id in self.conns:
                out.append((conn_id, bytes(buf[at + HEADER.size : end])))
            else:
                if not self.dropped:
                    log.warning("NRI mux: dropping data for a connection never opened", extra={"kv": {"conn": conn_id}})
                self.dropped += length
            at = end
        del buf[:at]
        return out
