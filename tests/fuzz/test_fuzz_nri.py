"""The NRI wire from a hostile runtime: random bytes into the mux, random ttrpc frames and random
protobuf payloads into our plugin's real method table. Property: every complete request gets
exactly one response (an error status for garbage), then the connection ends cleanly whatever
follows; never an unexpected exception."""

from __future__ import annotations

import struct

from hypothesis import example, given
from hypothesis import strategies as st

from dranet_proto import nri_v1alpha1_pb2 as api
from dranet_proto import ttrpc_pb2
from driver.nri import ttrpc
from driver.nri.mux import MAX_PAYLOAD, MuxDecoder, MuxError
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


def _responses(data: bytes) -> list[ttrpc_pb2.Response]:
    out = []
    while data:
        length, _stream, kind, _flags = ttrpc.HEADER.unpack_from(data)
        assert kind == ttrpc.TYPE_RESPONSE
        resp = ttrpc_pb2.Response()
        resp.ParseFromString(data[ttrpc.HEADER.size : ttrpc.HEADER.size + length])
        out.append(resp)
        data = data[ttrpc.HEADER.size + length :]
    return out


def _feed(decoder: ttrpc.FrameDecoder, wire: bytes, cuts: list[int]) -> list[ttrpc.Frame | ttrpc.Oversized]:
    """``wire`` fed in pieces cut at ``cuts``."""
    out: list[ttrpc.Frame | ttrpc.Oversized] = []
    at = 0
    for cut in sorted(c % (len(wire) + 1) for c in cuts) + [len(wire)]:
        out += decoder.feed(wire[at:cut])
        at = max(at, cut)
    return out


@FUZZ
@given(st.binary(max_size=200), st.lists(st.integers(0, 2**32 - 1), max_size=3), st.lists(st.integers(0, 400)))
def test_random_bytes_as_ttrpc_frames(data: bytes, lengths: list[int], cuts: list[int]) -> None:
    """Random bytes, and headers announcing any length, cut anywhere: no message is larger than a
    message may be (an oversized one is skipped, never held), and the decoder holds at most one."""
    wire = b"".join(ttrpc.HEADER.pack(n, 1, ttrpc.TYPE_REQUEST, 0) for n in lengths) + data
    decoder = ttrpc.FrameDecoder()
    for message in _feed(decoder, wire, cuts):
        if isinstance(message, ttrpc.Frame):
            assert len(message.data) <= ttrpc.MESSAGE_LENGTH_MAX
        else:
            assert message.length > ttrpc.MESSAGE_LENGTH_MAX
    assert len(decoder._buffer) <= ttrpc.HEADER.size + ttrpc.MESSAGE_LENGTH_MAX


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
@given(st.lists(requests, max_size=6), st.binary(max_size=16), st.lists(st.integers(0, 2000), max_size=4))
@example(frames=[], tail=b"\x00@\x00\x01\x00\x00\x00\x00\x01\x00", cuts=[])  # an oversized request's header
def test_random_requests_to_the_plugin_methods(frames: list, tail: bytes, cuts: list[int]) -> None:
    """Real NRIPlugin method table (protobuf parsing, dispatch to a recording handler): every
    request answered exactly once, with a status the runtime understands."""
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
    decoder = ttrpc.FrameDecoder()
    methods = plugin._methods()

    def answers(messages: list[ttrpc.Frame | ttrpc.Oversized]) -> list[ttrpc_pb2.Response]:
        return _responses(b"".join(a for m in messages if (a := ttrpc.serve(m, methods)) is not None))

    got = answers(_feed(decoder, wire, cuts))
    assert len(got) == expected
    for answer in got:
        assert answer.status.code in (ttrpc.OK, ttrpc.INVALID_ARGUMENT, ttrpc.UNIMPLEMENTED, ttrpc.UNKNOWN)
    # Whatever follows is answered or held, never a crash; a header announcing more than a message
    # may hold is refused at once (its bytes are skipped as they come).
    for answer in answers(decoder.feed(tail)):
        assert answer.status.code in (
            ttrpc.OK,
            ttrpc.INVALID_ARGUMENT,
            ttrpc.UNIMPLEMENTED,
            ttrpc.UNKNOWN,
            ttrpc.RESOURCE_EXHAUSTED,
        )


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.binary(max_size=60)) | st.binary(max_size=12).map(lambda b: (-1, b)),
        max_size=8,
    ),
    st.lists(st.integers(0, 600), max_size=5),
)
def test_random_mux_frames(chunks: list[tuple[int, bytes]], cuts: list[int]) -> None:
    """The multiplexer's trunk: well-framed payloads on random connection ids, and raw garbage, cut
    anywhere: only the opened connections' payloads come out, or a MuxError ends the trunk; data for
    the others is counted as dropped; at most one frame is held."""
    wire = b"".join(raw if conn < 0 else struct.pack(">II", conn, len(raw)) + raw for conn, raw in chunks)
    decoder = MuxDecoder((1, 2))
    at = 0
    try:
        for cut in sorted(c % (len(wire) + 1) for c in cuts) + [len(wire)]:
            for conn, _payload in decoder.feed(wire[at:cut]):
                assert conn in (1, 2)
            at = max(at, cut)
            assert len(decoder._buffer) <= 8 + MAX_PAYLOAD
    except MuxError:
        pass


@FUZZ
@given(st.lists(st.tuples(st.integers(1, 40), st.binary(max_size=300)), max_size=30))
def test_mux_drops_exactly_the_unopened_connections(frames: list[tuple[int, bytes]]) -> None:
    """Well-formed frames on random connection ids: the opened ones' payloads come out in order, the
    bytes of every other one are counted as dropped, nothing is left buffered."""
    wire = b"".join(struct.pack(">II", conn, len(raw)) + raw for conn, raw in frames)
    decoder = MuxDecoder((1, 2))
    out = decoder.feed(wire)
    assert out == [(conn, raw) for conn, raw in frames if conn in (1, 2)]
    assert decoder.dropped == sum(len(raw) for conn, raw in frames if conn not in (1, 2))
    assert not decoder._buffer
