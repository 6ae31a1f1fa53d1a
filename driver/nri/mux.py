"""NRI's socket multiplexer (containerd/nri ``pkg/net/multiplex``) on asyncio.

One unix socket carries several virtual connections. Every write is a frame: an
8-byte header (ConnID uint32 BE, payload length uint32 BE) then the payload.
Frames are *not* aligned with the ttrpc messages inside them (the Go side writes
through a buffered writer), so each connection is exposed as a byte stream
(:class:`MuxConn`) and the ttrpc layer re-assembles its own messages.

What the peer sends is bounded: a frame announcing more than :data:`MAX_PAYLOAD` ends the trunk
before its payload is read; data for a connection this side never opened is dropped (NRI uses
two); and a connection holds at most :data:`MAX_BUFFERED` unread bytes: past that the trunk is
not read until its reader catches up (the peer waits, as on any socket).
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
MAX_BUFFERED = 2 * MAX_PAYLOAD
"""Unread bytes one connection may hold before the trunk waits for its reader."""


class MuxError(Exception):
    """The trunk carried something the multiplexer cannot accept."""


class MuxConn:
    """One virtual connection: a bounded byte stream in, framed writes out."""

    def __init__(self, mux: Mux, conn_id: int) -> None:
        self.conn_id = conn_id
        self._mux = mux
        self._buffer = bytearray()
        self._eof = False
        self._data = asyncio.Event()  # set when bytes or the end arrive
        self._room = asyncio.Event()  # set while the buffer is under MAX_BUFFERED
        self._room.set()

    @property
    def buffered(self) -> int:
        """Bytes received and not read yet."""
        return len(self._buffer)

    async def readexactly(self, n: int) -> bytes:
        """Read exactly ``n`` bytes; raises ``asyncio.IncompleteReadError`` at end of stream."""
        while len(self._buffer) < n:
            if self._eof:
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
            self._data.clear()
            await self._data.wait()
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        if len(self._buffer) < MAX_BUFFERED:
            self._room.set()
        return out

    def feed(self, data: bytes) -> None:
        """Bytes from the trunk (see :meth:`room`)."""
        self._buffer += data
        self._data.set()
        if len(self._buffer) >= MAX_BUFFERED:
            self._room.clear()

    async def room(self) -> None:
        """Wait until the buffer is under :data:`MAX_BUFFERED` (or the stream ended)."""
        await self._room.wait()

    def feed_eof(self) -> None:
        """No more bytes will come."""
        self._eof = True
        self._data.set()
        self._room.set()

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
        self.dropped = 0  # bytes received for connections this side never opened

    def conn(self, conn_id: int) -> MuxConn:
        """The connection with ``conn_id`` (opened by this call on first use; opening is virtual: only
        connections opened so receive data)."""
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
                conn = self._conns.get(conn_id)
                if conn is None:
                    if not self.dropped:
                        log.warning(
                            "NRI mux: dropping data for a connection never opened", extra={"kv": {"conn": conn_id}}
                        )
                    self.dropped += len(payload)
                    continue
                conn.feed(payload)
                await conn.room()
        finally:
            self.close()

    def close(self) -> None:
        """Close the trunk and end every connection's stream (idempotent)."""
        if self.closed.is_set():
            return
        self.closed.set()
        for conn in self._conns.values():
            conn.feed_eof()
        self._writer.close()
