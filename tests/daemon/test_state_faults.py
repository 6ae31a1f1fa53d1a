"""The real `dranet run` with its state directory on a full disk, and started on a corrupt state.

A real tmpfs (a few hundred KB, filled to the last page) holds the state directory; the kubelet
is played over the real gRPC sockets (harness.kubelet_client), the API server by
harness.fake_apiserver. What is checked is what a user would meet: the answers to the
kubelet, the state files, the log, ``/healthz``, and the next start.

The daemon (holding the node lease) appends each batch of claim changes to ``checkpoint.journal``
and folds it into ``checkpoint.json`` once the claims are quiet and at shutdown. What is durable is
what a fresh :class:`CheckpointStore` loads from the directory (the snapshot and the journal's
records on it): it must be exactly what the kubelet was told.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from harness.fake_apiserver import make_claim, result
from harness.kubelet_client import KubeletClient, devices_of
from tests.daemon.test_restart import NODE, Env, _healthz_port, _ready, _wait_exit, make_env
from tests.plugins.tmpfs import TmpfsFactory, fill

CLAIMS = 40
pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def env40() -> Iterator[Env]:
    """An Env with 40 NICs and one claim per NIC (``c0``..``c39``, UIDs ``uid-0``..)."""
    with make_env(CLAIMS) as e:
        for i, device in enumerate(e.devices):
            e.api.add_claim(make_claim("ns", f"c{i}", f"uid-{i}", [result(device, NODE)], pods=[f"pod-{i}"]))
        yield e


def _refs(indices: range) -> list[tuple[str, str, str]]:
    return [("ns", f"c{i}", f"uid-{i}") for i in indices]


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _stored(state: Path) -> list[str]:
    """The claims a restarted driver loads from ``state`` (checkpoint.json and the journal)."""
    store = CheckpointStore(state)
    assert not store.quarantined  # nothing torn, nothing undecodable
    return store.read(lambda s: sorted(s.claims))


def _snapshot(state: Path) -> list[str]:
    """The claims of checkpoint.json alone (what a driver that does not read the journal finds)."""
    data = json.loads((state / "checkpoint.json").read_bytes())  # must always be whole, valid JSON
    return sorted(data["claims"])


def _journal_bytes(state: Path) -> int:
    try:
        return (state / "checkpoint.journal").stat().st_size
    except FileNotFoundError:
        return 0


async def _folded(state: Path, uids: list[str], timeout: float = 15) -> None:
    """Wait until the daemon folded its journal into checkpoint.json (a second of quiet claims)."""
    deadline = time.monotonic() + timeout
    while not ((state / "checkpoint.json").exists() and _snapshot(state) == uids and not _journal_bytes(state)):
        assert time.monotonic() < deadline, "the journal was never folded into checkpoint.json"
        await asyncio.sleep(0.1)


async def test_a_full_state_disk_fails_the_claims_that_need_it_and_loses_nothing(
    env40: Env, tmpfs_factory: TmpfsFactory
) -> None:
    state = tmpfs_factory.mount(env40.dir / "state", "256k")  # the daemon's --state-dir
    proc = env40.start()
    await _ready(env40, proc)
    port = _healthz_port(env40.log_of(proc))
    async with KubeletClient(env40.reg_socket) as kubelet:
        await kubelet.register()
        first = await kubelet.prepare(_refs(range(10)))
        assert all(first.claims[f"uid-{i}"].error == "" for i in range(10))
        assert _stored(state) == sorted(f"uid-{i}" for i in range(10))  # durable when answered
        await _folded(state, sorted(f"uid-{i}" for i in range(10)))
        before = (state / "checkpoint.json").read_bytes()

        filler = fill(state)  # not one free page left
        answers = await asyncio.gather(*(kubelet.prepare(_refs(range(b, b + 10))) for b in (10, 20, 30)))
        errors = {uid: r.error for a in answers for uid, r in a.claims.items()}
        assert sorted(errors) == sorted(f"uid-{i}" for i in range(10, CLAIMS))  # an answer for each claim
        for uid, error in errors.items():
            assert str(state / "checkpoint.journal") in error and "ENOSPC" in error, (uid, error)
            assert not devices_of(next(a for a in answers if uid in a.claims), uid)
        assert (state / "checkpoint.json").read_bytes() == before  # the previous file, whole
        assert not _journal_bytes(state)  # the refused records were cut off
        assert not (state / "checkpoint.tmp").exists()
        unprepared = await kubelet.unprepare(_refs(range(1)))  # needs a write too: refused, nothing lost
        assert str(state / "checkpoint.journal") in unprepared.claims["uid-0"].error
        assert "ENOSPC" in unprepared.claims["uid-0"].error
        assert _stored(state) == sorted(f"uid-{i}" for i in range(10))
        status, body = _healthz(port)
        assert status == 503 and str(state / "checkpoint.journal") in body and "ENOSPC" in body, body
        log = env40.log_of(proc)
        assert "cannot save driver state" in log and "No space left on device" in log
        assert "Traceback" not in log

        # A few pages free again: claims prepared one at a time until the file no longer fits.
        # Whatever the kubelet was told must be exactly what is on disk.
        filler.unlink()
        filler = fill(state, leave=5 * 4096)
        told_ok = []
        for i in range(10, CLAIMS):
            answer = await kubelet.prepare(_refs(range(i, i + 1)))
            if answer.claims[f"uid-{i}"].error == "":
                told_ok.append(f"uid-{i}")
            else:
                assert "ENOSPC" in answer.claims[f"uid-{i}"].error
        assert _stored(state) == sorted([f"uid-{i}" for i in range(10)] + told_ok)
        assert len(told_ok) < CLAIMS - 10, "the disk never filled up: the test proves nothing"

        filler.unlink()  # space again: /healthz recovers without any new claim (periodic retry)
        deadline = time.monotonic() + 15
        while _healthz(port)[0] != 200:
            assert time.monotonic() < deadline, _healthz(port)
            await asyncio.sleep(0.2)
        rest = await kubelet.prepare(_refs(range(10, CLAIMS)))
        assert all(r.error == "" for r in rest.claims.values())
    assert _stored(state) == sorted(f"uid-{i}" for i in range(CLAIMS))
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0
    # Shutdown folds the journal in: checkpoint.json alone holds every claim for the next instance.
    assert _snapshot(state) == sorted(f"uid-{i}" for i in range(CLAIMS))

    gets = env40.api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/")
    proc2 = env40.start()
    await _ready(env40, proc2)
    async with KubeletClient(env40.reg_socket) as kubelet:
        await kubelet.register()
        again = await kubelet.prepare(_refs(range(CLAIMS)))
        assert all(r.error == "" for r in again.claims.values())
    assert env40.api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") == gets  # from disk
    proc2.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc2, 10) == 0


async def test_a_corrupt_checkpoint_is_moved_aside_and_the_claims_rebuilt_from_the_api_server(env40: Env) -> None:
    proc = env40.start()
    await _ready(env40, proc)
    async with KubeletClient(env40.reg_socket) as kubelet:
        await kubelet.register()
        prepared = await kubelet.prepare(_refs(range(3)))
        assert all(r.error == "" for r in prepared.claims.values())
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0
    original = CheckpointStore(env40.dir / "state").read(
        lambda s: {u: c.devices[0].device for u, c in s.claims.items()}
    )
    torn = (env40.dir / "state/checkpoint.json").read_bytes()[:-40]
    (env40.dir / "state/checkpoint.json").write_bytes(torn)
    (env40.dir / "state/checkpoint.tmp").write_bytes(b"{half")  # a write interrupted earlier

    proc2 = env40.start()
    await _ready(env40, proc2)
    log = env40.log_of(proc2)
    assert "state file is corrupt" in log and "rebuilt prepared claims from the API server" in log
    (aside,) = (env40.dir / "state").glob("checkpoint.json.corrupt-*")
    assert aside.read_bytes() == torn  # kept for a human, never deleted
    assert not (env40.dir / "state/checkpoint.tmp").exists()
    # Every claim allocated to this node and reserved for a pod is back, with the same device.
    rebuilt = CheckpointStore(env40.dir / "state").read(lambda s: {u: c.devices[0].device for u, c in s.claims.items()})
    assert rebuilt == {f"uid-{i}": env40.devices[i] for i in range(CLAIMS)}
    assert {u: rebuilt[u] for u in original} == original
    port = _healthz_port(log)
    assert _healthz(port)[0] == 200
    proc2.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc2, 10) == 0


async def test_a_damaged_journal_record_keeps_the_claims_after_it_and_says_so(env40: Env) -> None:
    """One flipped bit inside the second of three journal records (acknowledged claims, the daemon
    killed before it could fold them): not a crash's tear. At the next start the claims of the
    records before and after it are kept, the journal is moved aside for a human, the claim it held
    comes back from the API server, and the driver says so: an ERROR line, a Warning event on the
    Node, ``dranet_driver_state_damage``; ``/healthz`` is 200 once the rebuild is done."""
    proc = env40.start()
    await _ready(env40, proc)
    async with KubeletClient(env40.reg_socket) as kubelet:
        await kubelet.register()
        for i in range(3):  # one batch, one record, each
            assert all(r.error == "" for r in (await kubelet.prepare(_refs(range(i, i + 1)))).claims.values())
    proc.kill()  # no fold at shutdown: the three records stay in the journal
    await _wait_exit(proc, 10)
    journal = env40.dir / "state/checkpoint.journal"
    data = bytearray(journal.read_bytes())
    second = 40 + int.from_bytes(data[4:8], "little")  # the first record's end
    data[second + 60] ^= 0x01  # inside the second record's payload
    journal.write_bytes(bytes(data))

    proc2 = env40.start()
    await _ready(env40, proc2)
    log = env40.log_of(proc2)
    assert "state file is corrupt" in log and "damaged records" in log, log[-3000:]
    assert "rebuilt prepared claims from the API server" in log
    (aside,) = (env40.dir / "state").glob("checkpoint.journal.corrupt-*")
    assert aside.read_bytes() == bytes(data)
    assert set(_stored(env40.dir / "state")) == {f"uid-{i}" for i in range(CLAIMS)}
    port = _healthz_port(log)
    assert _healthz(port)[0] == 200
    assert _metric(port, "dranet_driver_state_damage") == {"checkpoint.journal": 1.0}
    events = [e for ns, e in env40.api.posted_events if e["reason"] == "DranetStateDamaged"]
    assert len(events) == 1 and events[0]["involvedObject"]["kind"] == "Node", env40.api.posted_events
    proc2.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc2, 10) == 0


def _metric(port: int, name: str) -> dict[str, float]:
    """The samples of ``name`` on /metrics, by their ``file`` label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            out[labels.split('file="', 1)[1].split('"', 1)[0]] = float(value)
    return out


async def test_a_read_only_state_disk_is_reported_and_refused_at_start_in_one_line(
    env40: Env, tmpfs_factory: TmpfsFactory
) -> None:
    """The state directory's filesystem turns read-only under the running daemon: each claim that
    needs a write is answered with the file and EROFS, /healthz turns 503 naming them,
    ``dranet_driver_state_write_failures_total{file}`` counts them, nothing is a traceback; writable
    again, it recovers by itself. Started on it read-only: one clear error line, exit 1."""
    state = tmpfs_factory.mount(env40.dir / "state", "1m")
    proc = env40.start()
    await _ready(env40, proc)
    port = _healthz_port(env40.log_of(proc))
    async with KubeletClient(env40.reg_socket) as kubelet:
        await kubelet.register()
        assert all(r.error == "" for r in (await kubelet.prepare(_refs(range(2)))).claims.values())
        await _folded(state, ["uid-0", "uid-1"])
        # The daemon holds no state file open for writing between writes: the remount is not EBUSY.
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        try:
            answer = await kubelet.prepare(_refs(range(2, 4)))
            for uid in ("uid-2", "uid-3"):
                error = answer.claims[uid].error
                assert "EROFS" in error and str(state / "checkpoint.journal") in error, error
            status, body = _healthz(port)
            assert status == 503 and str(state / "checkpoint.journal") in body and "EROFS" in body, body
            assert _metric(port, "dranet_driver_state_write_failures_total").get("checkpoint.journal", 0) >= 1
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
        assert _stored(state) == ["uid-0", "uid-1"]  # the refused claims are not on disk, the others are
        deadline = time.monotonic() + 15
        while _healthz(port)[0] != 200:  # the periodic retry: no claim needed
            assert time.monotonic() < deadline, _healthz(port)
            await asyncio.sleep(0.2)
        assert all(r.error == "" for r in (await kubelet.prepare(_refs(range(2, 4)))).claims.values())
    assert "Traceback" not in env40.log_of(proc)
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0

    subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
    try:
        proc2 = env40.start()
        assert await _wait_exit(proc2, 30) == 1
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(state)], check=True)
    log = env40.log_of(proc2)
    assert "Traceback" not in log
    [error] = [e for e in map(json.loads, log.splitlines()) if e["level"] == "error"]
    assert error["msg"] == "cannot save driver state; refusing to start", error
    assert "Read-only file system (EROFS)" in error["error"] and str(state) in error["error"], error
