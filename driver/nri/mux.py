"""NRI's socket multiplexer (containerd/nri ``pkg/net/multiplex``) on asyncio.

One unix socket carries several virtual connections. Every write is a frame: an
8-byte header (ConnID uint32 BE, payload length uint32 BE) then the payload.
Frames are *not* aligned with the ttrpc messages inside them (the Go side writes
through a buffered writer), so each connection is exposed as a byte stream
(:class:`MuxConn`) and the ttrpc layer re-assembles its own messages.
"""

from __future__ import annotations

import asyncio
import logging
import struct

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


class MuxConn:
    """One virtual connection: a byte stream in, framed writes out."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.conn_id = conn_id
        self._mux = mux
        self.reader = asyncio.StreamReader(limit=2 * MAX_PAYLOAD)

    async def readexactly(self, n: int) -> bytes:
        """Read exactly ``n`` bytes; raises ``asyncio.IncompleteReadError`` at end of stream."""
        return await self.reader.readexactly(n)

    async def write(self, data: bytes) -> None:
        """Send ``data``, split into as many mux frames as its size requires."""
        await self._mux.send(self.conn_id, data)


class Mux:
    """Demultiplexes one stream pair into :class:`MuxConn` byte streams.

    Call :meth:`run` (a task) to pump incoming frames; it returns when the trunk
    closes, after signalling end-of-stream on every connection.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, MuxConn] = {}
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()

    def conn(self, conn_id: int) -> MuxConn:
        """The connection with ``conn_id`` (created on first use; opening is virtual)."""
        if conn_id == 0:
            raise MuxError("mux connection id 0 is reserved")
        if conn_id not in self._conns:
            self._conns[conn_id] = MuxConn(self, conn_id)
        return self._conns[conn_id]

    async def send(self, conn_id: int, data: bytes) -> None:
        """Write ``data`` on ``conn_id`` as frames of at most :data:`MAX_PAYLOAD` bytes."""
        if self.closed.is_set():
            raise ConnectionError("NRI mux trunk is closed")
        view = memoryview(data)
        # One lock so frames of concurrent writers never interleave mid-message.
        async with self._write_lock:
            for off in range(0, max(len(view), 1), MAX_PAYLOAD):
                chunk = view[off : off + MAX_PAYLOAD]
                self._writer.write(HEADER.pack(conn_id, len(chunk)) + bytes(chunk))
            await self._writer.drain()

    async def run(self) -> None:
        """Read frames until the trunk closes, feeding each payload to its connection."""
        try:
            while True:
                try:
                    header = await self._reader.readexactly(HEADER.size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                conn_id, length = HEADER.unpack(header)
                if length > MAX_PAYLOAD:
                    raise MuxError(f"mux frame for conn {conn_id} too large: {length} bytes")
                try:
                    payload = await self._reader.readexactly(length)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if conn_id == 0:
                    raise MuxError("mux frame on reserved connection id 0")
                self.conn(conn_id).reader.feed_data(payload)
        finally:
            self.close()

    def close(self) -> None:
        """Close the trunk and end every connection's stream (idempotent)."""
        if self.closed.is_set():
            return
        self.closed.set()
        for conn in self._conns.values():
            conn.reader.feed_eof()
        self._writer.close()
