"""The NRI wire from a hostile runtime: random bytes into the mux, random ttrpc frames and random
protobuf payloads into our plugin's real method table. Property: every complete request gets
exactly one response (an error status for garbage), then the connection ends cleanly whatever
follows; never an unexpected exception."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given
from hypothesis import strategies as st

from dranet_proto import nri_v1alpha1_pb2 as api
from dranet_proto import ttrpc_pb2
from driver.nri import ttrpc
from driver.nri.mux import Mux, MuxError
from driver.nri.plugin import PLUGIN_SERVICE, NRIPlugin
from tests.fuzz import FUZZ
from tests.nri.test_protocol import FakeHandler

METHODS = [
    "Configure",
    "Synchronize",
    "Shutdown",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "CreateContainer",
    "StateChange",
    "Nope",
]


class BytesStream:
    """A ttrpc ByteStream over fixed input; collects what is written and the largest read asked for."""

    def __init__(self, data: bytes, eof: bool = True) -> None:
        self.reader = asyncio.StreamReader()
        self.reader.feed_data(data)
        if eof:
            self.reader.feed_eof()
        self.written: list[bytes] = []
        self.largest_read = 0

    async def readexactly(self, n: int) -> bytes:
        self.largest_read = max(self.largest_read, n)
        return await self.reader.readexactly(n)

    async def write(self, data: bytes) -> None:
        self.written.append(data)


class Sink:
    """A trunk writer that drops what is written."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


def _responses(written: list[bytes]) -> list[ttrpc_pb2.Response]:
    data, out = b"".join(written), []
    while data:
        length, _stream, kind, _flags = ttrpc.HEADER.unpack_from(data)
        assert kind == ttrpc.TYPE_RESPONSE
        resp = ttrpc_pb2.Response()
        resp.ParseFromString(data[ttrpc.HEADER.size : ttrpc.HEADER.size + length])
        out.append(resp)
        data = data[ttrpc.HEADER.size + length :]
    return out


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(0, 2**32 - 1), max_size=3))
def test_random_bytes_as_ttrpc_frames(data: bytes, lengths: list[int]) -> None:
    """Random bytes, and headers announcing any length: no read is ever larger than a message may be
    (an oversized one is refused before its data is read)."""

    async def run() -> None:
        wire = b"".join(ttrpc.HEADER.pack(n, 1, ttrpc.TYPE_REQUEST, 0) for n in lengths) + data
        stream = BytesStream(wire)
        try:
            while True:
                frame = await ttrpc.read_frame(stream)
                assert len(frame.data) <= ttrpc.MESSAGE_LENGTH_MAX
        except (asyncio.IncompleteReadError, ttrpc._Oversized):
            pass
        assert stream.largest_read <= ttrpc.MESSAGE_LENGTH_MAX

    asyncio.run(run())


requests = st.tuples(
    st.integers(0, 2**32 - 1),  # stream id
    st.sampled_from([ttrpc.TYPE_REQUEST, ttrpc.TYPE_RESPONSE, 0, 7]),
    st.sampled_from(METHODS),
    st.one_of(
        st.binary(max_size=120),  # random protobuf bytes
        st.builds(
            lambda uid, ns: api.RunPodSandboxRequest(
                pod=api.PodSandbox(uid=uid, namespace=ns, linux=api.LinuxPodSandbox())
            ).SerializeToString(),
            st.text(max_size=10),
            st.text(max_size=10),
        ),
    ),
    st.booleans(),  # a garbage envelope instead of a ttrpc.Request
)


@FUZZ
@given(st.lists(requests, max_size=6), st.binary(max_size=16))
def test_random_requests_to_the_plugin_methods(frames: list, tail: bytes) -> None:
    """Real NRIPlugin method table (protobuf parsing, dispatch to a recording handler)."""

    async def run() -> None:
        plugin = NRIPlugin("/nonexistent/nri.sock", FakeHandler())
        wire, expected = b"", 0
        for stream_id, kind, method, payload, garbage in frames:
            envelope = (
                payload
                if garbage
                else ttrpc_pb2.Request(service=PLUGIN_SERVICE, method=method, payload=payload).SerializeToString()
            )
            wire += ttrpc.HEADER.pack(len(envelope), stream_id, kind, 0) + envelope
            expected += kind == ttrpc.TYPE_REQUEST
        stream = BytesStream(b"", eof=False)
        stream.reader.feed_data(wire)
        server = ttrpc.Server(stream, plugin._methods())
        serve = asyncio.create_task(server.serve())
        deadline = asyncio.get_running_loop().time() + 5
        while len(_responses(stream.written)) < expected:  # every request answered, once
            assert asyncio.get_running_loop().time() < deadline, "a request got no answer"
            await asyncio.sleep(0.001)
        stream.reader.feed_data(tail)
        stream.reader.feed_eof()
        await asyncio.wait_for(serve, 5)  # then a clean end, whatever the tail holds
        plugin._worker.shutdown(wait=True)
        answers = _responses(stream.written)
        assert len(answers) == expected
        for answer in answers:
            assert answer.status.code in (ttrpc.OK, ttrpc.INVALID_ARGUMENT, ttrpc.UNIMPLEMENTED, ttrpc.UNKNOWN)

    asyncio.run(run())


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.binary(max_size=60)) | st.binary(max_size=12).map(lambda b: (-1, b)),
        max_size=8,
    )
)
def test_random_mux_frames(chunks: list[tuple[int, bytes]]) -> None:
    """The multiplexer's trunk: well-framed payloads on random connection ids, and raw garbage."""

    async def run() -> None:
        wire = b"".join(raw if conn < 0 else struct.pack(">II", conn, len(raw)) + raw for conn, raw in chunks)
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        reader.feed_eof()

        mux = Mux(reader, Sink())  # type: ignore[arg-type]
        try:
            await asyncio.wait_for(mux.run(), 5)
        except MuxError:
            pass
        assert mux.closed.is_set()

    asyncio.run(run())


@FUZZ
@given(
    st.lists(st.tuples(st.integers(1, 40), st.binary(max_size=300)), max_size=30),
    st.integers(1, 64),
)
def test_mux_buffers_stay_bounded(frames: list[tuple[int, bytes]], bound: int) -> None:
    """Frames on random connection ids against a reader that never reads: data for ids never opened
    is dropped, an opened one holds at most its bound plus one frame, and the trunk then waits."""
    import driver.nri.mux as mux_module

    async def run() -> None:
        wire = b"".join(struct.pack(">II", conn, len(raw)) + raw for conn, raw in frames)
        reader = asyncio.StreamReader()
        reader.feed_data(wire)
        reader.feed_eof()

        old, mux_module.MAX_BUFFERED = mux_module.MAX_BUFFERED, bound
        try:
            mux = Mux(reader, Sink())  # type: ignore[arg-type]
            opened = {1: mux.conn(1), 2: mux.conn(2)}
            pump = asyncio.create_task(mux.run())
            await asyncio.sleep(0)
            for _ in range(len(frames) + 2):
                await asyncio.sleep(0)
            largest = max((len(raw) for _, raw in frames), default=0)
            for conn in opened.values():
                assert conn.buffered <= bound + largest
            unknown = sum(len(raw) for conn, raw in frames if conn not in opened)
            if pump.done():
                assert mux.dropped == unknown
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        finally:
            mux_module.MAX_BUFFERED = old

    asyncio.run(run())
