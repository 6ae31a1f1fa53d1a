"""NRI wire protocol, pure Python: a hand-rolled runtime peer that frames bytes itself.

The peer below packs mux and ttrpc headers with ``struct`` (not with driver.nri) so that
framing bugs cannot cancel out between the two sides.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from dranet_proto import nri_v1alpha1_pb2 as api
from dranet_proto import ttrpc_pb2
from driver.nri.mux import MAX_PAYLOAD, MuxDecoder, MuxError, encode
from driver.nri.plugin import Backoff, NRIPlugin

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"


class FakeHandler:
    """Records calls; ``block`` makes run_pod_sandbox wait; ``fail`` makes it raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.block: threading.Event | None = None
        self.fail = False

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        self.calls.append(("synchronize", ([p.uid for p in pods], len(containers))))

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("run", pod.uid))
        if self.block is not None:
            self.block.wait(10)
        if self.fail:
            raise RuntimeError(f"device nic0: move failed for {pod.uid}")

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("stop", pod.uid))

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("remove", pod.uid))

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        self.calls.append(("create", container.id))
        adj = api.ContainerAdjustment()
        adj.linux.devices.add(path="/dev/infiniband/uverbs0", type="c", major=231, minor=192)
        return adj

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


class Peer:
    """One accepted plugin connection, seen from the runtime side, framed by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buf: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.next_id = 1

    async def _fill(self, conn: int, n: int) -> None:
        while len(self.buf[conn]) < n:
            cid, length = struct.unpack(">II", await self.reader.readexactly(8))
            self.buf.setdefault(cid, bytearray()).extend(await self.reader.readexactly(length))

    async def read_msg(self, conn: int) -> tuple[int, int, bytes]:
        """(stream id, type, data) of the next ttrpc message on ``conn``."""
        await self._fill(conn, 10)
        length, sid, mtype, _flags = struct.unpack(">IIBB", self.buf[conn][:10])
        await self._fill(conn, 10 + length)
        data = bytes(self.buf[conn][10 : 10 + length])
        del self.buf[conn][: 10 + length]
        return sid, mtype, data

    @staticmethod
    def ttrpc(sid: int, mtype: int, data: bytes) -> bytes:
        return struct.pack(">IIBB", len(data), sid, mtype, 0) + data

    def send_mux(self, conn: int, payload: bytes, chunk: int | None = None) -> None:
        """Write ``payload`` on ``conn`` as mux frames of ``chunk`` bytes (default: one frame)."""
        chunk = chunk or len(payload)
        for off in range(0, len(payload), chunk):
            part = payload[off : off + chunk]
            self.writer.write(struct.pack(">II", conn, len(part)) + part)

    def request(self, method: str, msg: Any, service: str = PLUGIN) -> tuple[int, bytes]:
        req = ttrpc_pb2.Request(service=service, method=method, payload=msg.SerializeToString())
        sid = self.next_id
        self.next_id += 2
        return sid, self.ttrpc(sid, 1, req.SerializeToString())

    async def call(
        self, method: str, msg: Any, resp_type: Any = None, chunk: int | None = None, service: str = PLUGIN
    ) -> tuple[ttrpc_pb2.Response, Any]:
        sid, frame = self.request(method, msg, service)
        self.send_mux(1, frame, chunk)
        await self.writer.drain()
        got_sid, mtype, data = await self.read_msg(1)
        assert (got_sid, mtype) == (sid, 2)
        resp = ttrpc_pb2.Response.FromString(data)
        out = resp_type.FromString(resp.payload) if resp_type is not None and resp.status.code == 0 else None
        return resp, out

    async def accept_registration(self, chunk: int = 3) -> api.RegisterPluginRequest:
        """Read RegisterPlugin on conn 2 and answer OK, the answer split into tiny mux frames."""
        sid, mtype, data = await self.read_msg(2)
        req = ttrpc_pb2.Request.FromString(data)
        assert (mtype, sid % 2, req.service, req.method) == (1, 1, "nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        resp = ttrpc_pb2.Response(payload=api.Empty().SerializeToString())
        self.send_mux(2, self.ttrpc(sid, 2, resp.SerializeToString()), chunk)
        await self.writer.drain()
        return api.RegisterPluginRequest.FromString(req.payload)


class FakeRuntime:
    """A unix socket server handing accepted connections to the test as :class:`Peer`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.peers: asyncio.Queue[Peer] = asyncio.Queue()
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self.peers.put(Peer(r, w))

        self.server = await asyncio.start_unix_server(on_conn, self.path, limit=16 << 20)

    async def next_peer(self) -> Peer:
        return await asyncio.wait_for(self.peers.get(), 10)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
def sock_path() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="dn-nrip-", dir="/tmp")
    try:
        yield os.path.join(d, "nri.sock")
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def _connected(sock_path: str, handler: FakeHandler) -> tuple[FakeRuntime, NRIPlugin, asyncio.Task[None], Peer]:
    rt = FakeRuntime(sock_path)
    await rt.start()
    plugin = NRIPlugin(sock_path, handler, reconnect=Backoff(0.01, 0.05))
    task = asyncio.create_task(plugin.run())
    peer = await rt.next_peer()
    reg = await peer.accept_registration()
    assert (reg.plugin_name, reg.plugin_idx) == ("dra.net", "00")
    await asyncio.wait_for(plugin.registered.wait(), 5)
    return rt, plugin, task, peer


async def _shutdown(rt: FakeRuntime, plugin: NRIPlugin, task: asyncio.Task[None]) -> None:
    plugin.stop()
    await asyncio.wait_for(task, 5)
    await rt.close()


async def test_configure_split_and_merged_frames(sock_path: str) -> None:
    handler = FakeHandler()
    rt, plugin, task, peer = await _connected(sock_path, handler)
    try:
        # Configure split into 5-byte mux frames (header and body cut mid-way).
        resp, conf = await peer.call(
            "Configure", api.ConfigureRequest(runtime_name="fake", request_timeout=2000), api.ConfigureResponse, chunk=5
        )
        assert resp.status.code == 0
        assert conf.events == 0xF  # Run|Stop|Remove PodSandbox + CreateContainer, field 2
        assert conf.failure_policy.fail_request
        raw = resp.payload
        assert raw[0] == (2 << 3) | 0  # field 2, varint: the runtime reads events from field 2
        # Two requests merged into ONE mux frame: both answered, each on its stream.
        sid1, f1 = peer.request("StopPodSandbox", api.StopPodSandboxRequest(pod=api.PodSandbox(uid="p1")))
        sid2, f2 = peer.request(
            "CreateContainer",
            api.CreateContainerRequest(pod=api.PodSandbox(uid="p1"), container=api.Container(id="c1")),
        )
        peer.send_mux(1, f1 + f2)
        await peer.writer.drain()
        answers = {}
        for _ in range(2):
            sid, mtype, data = await peer.read_msg(1)
            answers[sid] = ttrpc_pb2.Response.FromString(data)
        assert set(answers) == {sid1, sid2} and all(a.status.code == 0 for a in answers.values())
        adj = api.CreateContainerResponse.FromString(answers[sid2].payload).adjust
        assert [d.path for d in adj.linux.devices] == ["/dev/infiniband/uverbs0"]
        assert ("stop", "p1") in handler.calls and ("create", "c1") in handler.calls
    finally:
        await _shutdown(rt, plugin, task)


async def test_chunked_synchronize_larger_than_one_frame(sock_path: str) -> None:
    handler = FakeHandler()
    rt, plugin, task, peer = await _connected(sock_path, handler)
    try:
        big = "x" * 2000
        pods1 = [api.PodSandbox(uid=f"a{i}", annotations={"k": big}) for i in range(1500)]  # ~3 MB
        pods2 = [api.PodSandbox(uid=f"b{i}") for i in range(3)]
        # Go's ttrpc writes through a 4 KiB buffer: the message arrives in ~750 mux frames.
        resp, out = await peer.call(
            "Synchronize", api.SynchronizeRequest(pods=pods1, more=True), api.SynchronizeResponse, chunk=4096
        )
        assert resp.status.code == 0 and out.more is True
        assert not [c for c in handler.calls if c[0] == "synchronize"]  # waits for the last chunk
        resp, out = await peer.call(
            "Synchronize", api.SynchronizeRequest(pods=pods2, more=False), api.SynchronizeResponse
        )
        assert resp.status.code == 0 and out.more is False
        syncs = [c[1] for c in handler.calls if c[0] == "synchronize"]
        assert len(syncs) == 1 and len(syncs[0][0]) == 1503 and syncs[0][0][-1] == "b2"
    finally:
        await _shutdown(rt, plugin, task)


async def test_unknown_methods_and_handler_errors(sock_path: str) -> None:
    handler = FakeHandler()
    rt, plugin, task, peer = await _connected(sock_path, handler)
    try:
        resp, _ = await peer.call("UpdateContainer", api.UpdateContainerRequest())
        assert resp.status.code == 12
        resp, _ = await peer.call("Nope", api.Empty(), service="some.Other")
        assert resp.status.code == 12
        handler.fail = True
        resp, _ = await peer.call("RunPodSandbox", api.RunPodSandboxRequest(pod=api.PodSandbox(uid="p9")))
        assert resp.status.code != 0 and "nic0" in resp.status.message
        handler.fail = False
        # Still serving after a failed hook; StateChange (older runtimes) dispatches pod events.
        resp, _ = await peer.call(
            "StateChange", api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=api.PodSandbox(uid="p10"))
        )
        assert resp.status.code == 0 and ("run", "p10") in handler.calls
    finally:
        await _shutdown(rt, plugin, task)


async def test_runtime_disconnects_mid_call_then_plugin_reconnects(sock_path: str) -> None:
    handler = FakeHandler()
    handler.block = threading.Event()
    rt, plugin, task, peer = await _connected(sock_path, handler)
    try:
        _, frame = peer.request("RunPodSandbox", api.RunPodSandboxRequest(pod=api.PodSandbox(uid="p1")))
        peer.send_mux(1, frame[:20])  # half a request, then...
        peer.send_mux(1, frame[20:])
        await peer.writer.drain()
        for _ in range(100):
            if ("run", "p1") in handler.calls:
                break
            await asyncio.sleep(0.01)
        peer.writer.close()  # ...the runtime goes away while the hook runs
        handler.block.set()
        second = await rt.next_peer()
        reg = await second.accept_registration()
        assert reg.plugin_name == "dra.net"
        for _ in range(100):
            if plugin.sessions == 2:
                break
            await asyncio.sleep(0.01)
        assert plugin.sessions == 2
        _, conf = await second.call("Configure", api.ConfigureRequest(), api.ConfigureResponse)
        assert conf.events == 0xF
    finally:
        handler.block.set()
        await _shutdown(rt, plugin, task)


async def test_in_sync_only_while_the_current_connection_is_synchronized(sock_path: str) -> None:
    """Readiness follows the connection: a lost runtime connection is not ready until the next
    one has completed its Synchronize."""
    rt, plugin, task, peer = await _connected(sock_path, FakeHandler())
    try:
        assert not plugin.in_sync
        await peer.call("Synchronize", api.SynchronizeRequest(more=False), api.SynchronizeResponse)
        assert plugin.in_sync and plugin.synchronized == 1
        peer.writer.close()
        second = await rt.next_peer()
        await second.accept_registration()
        assert not plugin.in_sync, "a new connection is not synchronized yet"
        await second.call("Synchronize", api.SynchronizeRequest(more=False), api.SynchronizeResponse)
        assert plugin.in_sync and plugin.synchronized == 2
    finally:
        await _shutdown(rt, plugin, task)
    assert not plugin.in_sync


async def test_plugin_retries_until_runtime_appears(sock_path: str) -> None:
    plugin = NRIPlugin(sock_path, FakeHandler(), reconnect=Backoff(0.01, 0.05))
    task = asyncio.create_task(plugin.run())
    await asyncio.sleep(0.2)  # no socket yet: connection refused, backing off
    rt = FakeRuntime(sock_path)
    await rt.start()
    try:
        peer = await rt.next_peer()
        await peer.accept_registration()
        await asyncio.wait_for(plugin.registered.wait(), 5)
    finally:
        await _shutdown(rt, plugin, task)


def test_mux_splits_payloads_above_max() -> None:
    payload = os.urandom(MAX_PAYLOAD + 100)
    data = encode(1, payload)
    cid, n = struct.unpack(">II", data[:8])
    assert (cid, n) == (1, MAX_PAYLOAD)
    cid2, n2 = struct.unpack(">II", data[8 + n : 16 + n])
    assert (cid2, n2) == (1, 100)
    assert bytes(data[8 : 8 + n]) + bytes(data[16 + n :]) == payload
    assert encode(2, b"") == struct.pack(">II", 2, 0)


def test_mux_decoder_reassembles_frames_cut_anywhere_and_drops_unopened_connections() -> None:
    wire = encode(1, b"abc") + encode(7, b"nobody") + encode(2, b"") + encode(2, b"xyz")
    got: list[tuple[int, bytes]] = []
    dec = MuxDecoder((1, 2))
    for i in range(len(wire)):  # one byte at a time: every header and payload cut
        got += dec.feed(wire[i : i + 1])
    assert got == [(1, b"abc"), (2, b""), (2, b"xyz")]
    assert dec.dropped == len(b"nobody")


def test_mux_decoder_refuses_an_oversized_frame_before_its_payload() -> None:
    with pytest.raises(MuxError, match="too large"):
        MuxDecoder((1,)).feed(struct.pack(">II", 1, MAX_PAYLOAD + 1))
    with pytest.raises(MuxError, match="reserved"):
        MuxDecoder((1,)).feed(struct.pack(">II", 0, 1) + b"x")


def test_plugin_index_validated() -> None:
    with pytest.raises(ValueError, match="two digits"):
        NRIPlugin("/nonexistent", FakeHandler(), idx="5")
