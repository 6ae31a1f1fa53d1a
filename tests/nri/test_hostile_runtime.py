"""A hostile peer on the NRI socket against the real plugin process: what it sends is bounded.

The runtime side is a hand-framed peer (:class:`tests.nri.test_protocol.FakeRuntime`: mux and
ttrpc headers packed with ``struct``); the driver is ``python -m harness.nri``, our
NRIPlugin and NRIHooks in their own process, whose peak resident memory (``VmHWM``) is read from
``/proc``. After each flood a normal call must still be answered: the connection stays usable.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dranet_proto import nri_v1alpha1_pb2 as api
from dranet_proto import ttrpc_pb2
from harness.nri import DriverProcess
from tests.nri.test_protocol import PLUGIN, FakeRuntime, Peer

pytestmark = [pytest.mark.root, pytest.mark.slow]

MIB = 1 << 20
FLOOD = 160 * MIB
BOUND = 48 * MIB
"""Peak memory growth allowed for a flood of :data:`FLOOD` bytes (what the plugin may buffer, with room)."""
MUX_CHUNK = 4 * MIB  # the largest mux frame the Go side writes


def _vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


@pytest.fixture
def sock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="dn-nrih-", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def _session(sock_dir: str, state: Path, procs: list[DriverProcess]) -> tuple[FakeRuntime, Peer, DriverProcess]:
    rt = FakeRuntime(os.path.join(sock_dir, "nri.sock"))
    await rt.start()
    drv = DriverProcess.start(rt.path, str(state))
    procs.append(drv)
    peer = await rt.next_peer()
    await peer.accept_registration()
    resp, _ = await peer.call("Configure", api.ConfigureRequest(runtime_name="hostile"), api.ConfigureResponse)
    assert resp.status.code == 0
    return rt, peer, drv


async def _still_answers(peer: Peer) -> None:
    resp, _ = await asyncio.wait_for(
        peer.call("StopPodSandbox", api.StopPodSandboxRequest(pod=api.PodSandbox(uid="after")), api.Empty), 30
    )
    assert resp.status.code == 0, resp.status.message


async def _send(peer: Peer, conn: int, total: int, chunk: int = MUX_CHUNK) -> None:
    zeros = bytes(chunk)
    left = total
    while left:
        n = min(left, chunk)
        peer.writer.write(struct.pack(">II", conn, n) + zeros[:n])
        await peer.writer.drain()
        left -= n


def test_an_oversized_message_is_refused_before_its_bytes_are_held(
    sock_dir: str, tmp_path: Path, driver_procs: list[DriverProcess]
) -> None:
    """A ttrpc header announcing far more than the 4 MiB limit, then that many bytes: answered
    RESOURCE_EXHAUSTED, the bytes skipped as they come, never held."""

    async def run() -> None:
        rt, peer, drv = await _session(sock_dir, tmp_path, driver_procs)
        try:
            before = _vm_kib(drv.proc.pid, "VmHWM")
            peer.writer.write(struct.pack(">II", 1, 10) + struct.pack(">IIBB", FLOOD, 101, 1, 0))
            await _send(peer, 1, FLOOD)
            sid, mtype, data = await asyncio.wait_for(peer.read_msg(1), 60)
            resp = ttrpc_pb2.Response.FromString(data)
            assert (sid, mtype, resp.status.code) == (101, 2, 8), resp.status.message  # RESOURCE_EXHAUSTED
            await _still_answers(peer)
            grown = (_vm_kib(drv.proc.pid, "VmHWM") - before) * 1024
            assert grown < BOUND, f"peak memory grew by {grown / MIB:.0f} MiB for a {FLOOD / MIB:.0f} MiB message"
        finally:
            await rt.close()

    asyncio.run(run())


def test_data_for_connections_never_opened_is_dropped(
    sock_dir: str, tmp_path: Path, driver_procs: list[DriverProcess]
) -> None:
    """Mux frames for thousands of connection ids the plugin never opened: dropped, not buffered."""

    async def run() -> None:
        rt, peer, drv = await _session(sock_dir, tmp_path, driver_procs)
        try:
            before = _vm_kib(drv.proc.pid, "VmHWM")
            ids = 20_000
            per = FLOOD // ids
            frame = bytes(per)
            for i in range(ids):
                peer.writer.write(struct.pack(">II", 3 + i, per) + frame)
                if i % 500 == 0:
                    await peer.writer.drain()
            await peer.writer.drain()
            await _still_answers(peer)
            grown = (_vm_kib(drv.proc.pid, "VmHWM") - before) * 1024
            assert grown < BOUND, f"peak memory grew by {grown / MIB:.0f} MiB for {FLOOD / MIB:.0f} MiB on unknown ids"
        finally:
            await rt.close()

    asyncio.run(run())


def test_a_payload_of_the_wrong_type_is_an_invalid_argument_without_a_traceback(
    sock_dir: str, tmp_path: Path, driver_procs: list[DriverProcess]
) -> None:
    """A ConfigureRequest's bytes sent as Synchronize: INVALID_ARGUMENT naming the type, one WARNING line."""

    async def run() -> None:
        rt, peer, drv = await _session(sock_dir, tmp_path, driver_procs)
        try:
            wrong = api.ConfigureRequest(config="x" * 8, runtime_name="containerd")
            req = ttrpc_pb2.Request(service=PLUGIN, method="Synchronize", payload=wrong.SerializeToString())
            peer.send_mux(1, peer.ttrpc(201, 1, req.SerializeToString()))
            await peer.writer.drain()
            sid, _mtype, data = await asyncio.wait_for(peer.read_msg(1), 10)
            resp = ttrpc_pb2.Response.FromString(data)
            assert (sid, resp.status.code) == (201, 3), resp.status  # INVALID_ARGUMENT
            assert "SynchronizeRequest" in resp.status.message
            await _still_answers(peer)
        finally:
            await rt.close()
        log = drv.log()
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
        assert any(" WARNING " in ln and "SynchronizeRequest" in ln for ln in log.splitlines()), log[-3000:]

    asyncio.run(run())
