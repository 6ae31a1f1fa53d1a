"""Real `dranet run` processes, killed with SIGKILL mid-prepare and restarted; SIGTERM cleanup.

The kubelet is played by harness.kubelet_client over the real unix sockets; the
API server by harness.fake_apiserver (the real one is exercised in the control-plane
tests). State must survive only through the checkpoint file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from driver.checkpoint.store import CheckpointStore
from harness import write_nic_sysfs
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.kubelet_client import KubeletClient, devices_of, wait_for_socket

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-r"
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/"

# Same daemon, but SIGKILLs itself right after the checkpoint write, before the gRPC response.
CRASH_AFTER_COMMIT = """
import asyncio, os, signal, sys
from driver.checkpoint.store import CheckpointStore
from driver.cli import build_parser
from driver.config import config_from_args
from driver.daemon.lifecycle import Daemon
from driver.kube.client import KubeClient
from driver.logs import setup_logging

async def main():
    config = config_from_args(build_parser().parse_args(sys.argv[1:]))
    daemon = Daemon(config, KubeClient.from_kubeconfig(config.kubeconfig), CheckpointStore(config.state_dir))
    daemon.preparer.after_commit = lambda uids: os.kill(os.getpid(), signal.SIGKILL)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, daemon.stopping.set)
    await daemon.run()

setup_logging("info", "json")
asyncio.run(main())
"""


@dataclass
class Env:
    dir: Path
    api: FakeAPIServer
    devices: list[str]
    procs: list[subprocess.Popen[bytes]]

    @property
    def reg_socket(self) -> str:
        return str(self.dir / "kubelet/plugins_registry/dra.net-reg.sock")

    @property
    def dra_socket(self) -> str:
        return str(self.dir / "kubelet/plugins/dra.net/dra.sock")

    def args(self, nri: bool = False) -> list[str]:
        nri_flags = ["--nri-socket", str(self.dir / "no-runtime/nri.sock")] if nri else ["--no-nri"]
        return [
            "run",
            *nri_flags,
            "--node-name",
            NODE,
            "--kubeconfig",
            str(self.dir / "kubeconfig"),
            "--sysfs-root",
            str(self.dir / "sys"),
            "--kubelet-root",
            str(self.dir / "kubelet"),
            "--cdi-dir",
            str(self.dir / "cdi"),
            "--state-dir",
            str(self.dir / "state"),
            "--runtime-dir",
            str(self.dir / "run"),
            "--bind-address",
            "127.0.0.1:0",
            "--publish-interval",
            "0.2",
        ]

    def start(self, crash_after_commit: bool = False, nri: bool = False) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"daemon-{len(self.procs)}.log", "wb")
        cmd = (
            [sys.executable, "-c", CRASH_AFTER_COMMIT]
            if crash_after_commit
            else [sys.executable, "-m", "driver", "--log-format", "json"]
        ) + self.args(nri)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.dir / f"daemon-{self.procs.index(proc)}.log").read_text()

    def stored_claims(self) -> list[str]:
        return sorted(CheckpointStore(self.dir / "state").read(lambda s: list(s.claims)))


@contextlib.contextmanager
def make_env(nics: int = 4) -> Iterator[Env]:
    """A fake apiserver, a sysfs with ``nics`` NICs, a short directory; everything gone afterwards."""
    d = Path(tempfile.mkdtemp(prefix="dranet-dr-"))  # short: AF_UNIX paths are limited to 108 bytes
    api = FakeAPIServer().start()
    api.write_kubeconfig(d / "kubeconfig")
    e = Env(dir=d, api=api, devices=write_nic_sysfs(d / "sys", nics), procs=[])
    try:
        yield e
    finally:
        for proc in e.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        api.stop()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def env() -> Iterator[Env]:
    with make_env() as e:
        yield e


async def _ready(env: Env, proc: subprocess.Popen[bytes]) -> None:
    try:
        await wait_for_socket(env.reg_socket, timeout=20)
        async with KubeletClient(env.reg_socket) as kubelet:
            await kubelet.wait_serving(timeout=20)
    except (TimeoutError, grpc.aio.AioRpcError):
        raise AssertionError(f"daemon did not start: {env.log_of(proc)}") from None


async def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    return await asyncio.to_thread(proc.wait, timeout)


def _healthz_port(log_text: str) -> int:
    for line in log_text.splitlines():
        if "probe server listening" in line:
            return int(json.loads(line)["port"])
    raise AssertionError(f"no probe server line in log: {log_text}")


def _add_claim(env: Env, name: str, uid: str) -> None:
    env.api.add_claim(
        make_claim(
            "ns",
            name,
            uid,
            [result(env.devices[0], NODE, "nic/a"), result(env.devices[1], NODE, "nic/b")],
            pods=["pod-1"],
        )
    )


EXPECTED = [(("nic",), NODE, "pci-0000-8a-00-0"), (("nic",), NODE, "pci-0000-8a-00-1")]


async def test_run_serves_health_and_sigterm_removes_sockets(env: Env) -> None:
    _add_claim(env, "c1", "uid-1")
    proc = env.start()
    await _ready(env, proc)
    async with KubeletClient(env.reg_socket) as kubelet:
        info = await kubelet.register()
        assert info.endpoint == env.dra_socket
        resp = await kubelet.prepare([("ns", "c1", "uid-1")])
        assert resp.claims["uid-1"].error == "" and devices_of(resp, "uid-1") == EXPECTED
    port = _healthz_port(env.log_of(proc))
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status)
    assert body == 200
    deadline = time.monotonic() + 10
    while True:  # the first slice write may still be in flight
        metrics = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        if "dranet_driver_last_published_time_seconds 0.0" not in metrics or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert 'dranet_driver_dra_plugin_requests_total{method="PrepareResourceClaims",status="success"} 1.0' in metrics
    assert 'dranet_driver_published_devices_total{feature="total"} 4.0' in metrics
    # The Go driver's claim gauges, read from the state files: prepared for one pod, not attached
    # (no NRI here).
    assert "dranet_driver_claim_devices_allocated 2.0" in metrics
    assert "dranet_driver_claim_devices_ready 0.0" in metrics
    # The publisher records its last successful write (slices went to the stub apiserver).
    published = [line for line in metrics.splitlines() if line.startswith("dranet_driver_last_published_time_seconds ")]
    assert published and float(published[0].split()[1]) > time.time() - 60
    assert any(s["spec"]["nodeName"] == NODE and len(s["spec"]["devices"]) == 4 for s in env.api.slices.values())
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0
    assert time.monotonic() - started < 5
    assert not os.path.exists(env.reg_socket) and not os.path.exists(env.dra_socket)
    assert env.stored_claims() == ["uid-1"]  # prepared state survives a clean stop too


async def test_kill9_during_claim_get_then_retry(env: Env) -> None:
    _add_claim(env, "c1", "uid-1")
    env.api.claim_delay = 30  # the GET hangs: the kill lands in the middle of the prepare
    proc = env.start()
    await _ready(env, proc)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        call = asyncio.create_task(kubelet.prepare([("ns", "c1", "uid-1")]))
        assert await asyncio.to_thread(env.api.claim_get_started.wait, 10), "prepare never reached the API server"
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError):
            await call
    await _wait_exit(proc, 10)
    assert env.stored_claims() == []
    assert os.path.exists(env.reg_socket)  # a SIGKILLed driver leaves its sockets behind

    env.api.claim_delay = 0
    proc2 = env.start()
    await _ready(env, proc2)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c1", "uid-1")])
        assert resp.claims["uid-1"].error == "" and devices_of(resp, "uid-1") == EXPECTED
        un = await kubelet.unprepare([("ns", "c1", "uid-1")])
        assert un.claims["uid-1"].error == ""
    assert env.stored_claims() == []
    proc2.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc2, 10) == 0


async def test_kill9_after_checkpoint_write_before_response(env: Env) -> None:
    _add_claim(env, "c1", "uid-1")
    proc = env.start(crash_after_commit=True)
    await _ready(env, proc)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        with pytest.raises(grpc.aio.AioRpcError):
            await kubelet.prepare([("ns", "c1", "uid-1")])
    assert await _wait_exit(proc, 10) == -signal.SIGKILL
    assert env.stored_claims() == ["uid-1"]  # written, but the kubelet never heard back
    gets = env.api.count("GET", CLAIM_PATH + "c1")
    assert gets == 1

    proc2 = env.start()
    await _ready(env, proc2)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c1", "uid-1")])  # the kubelet's retry
        assert resp.claims["uid-1"].error == "" and devices_of(resp, "uid-1") == EXPECTED
        assert env.api.count("GET", CLAIM_PATH + "c1") == gets  # answered from the checkpoint
        un = await kubelet.unprepare([("ns", "c1", "uid-1"), ("ns", "c-never", "uid-never")])
        assert {k: v.error for k, v in un.claims.items()} == {"uid-1": "", "uid-never": ""}
    assert env.stored_claims() == []
    proc2.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc2, 10) == 0


async def test_a_checkpoint_from_a_newer_driver_refuses_to_start(env: Env) -> None:
    """A downgrade: the file is valid, only not ours to read. Kept, and the driver says why.
    (A corrupt file is moved aside instead: tests/daemon/test_state_faults.py.)"""
    (env.dir / "state").mkdir()
    (env.dir / "state/checkpoint.json").write_text('{"version": 99, "claims": {}}')
    proc = env.start()
    assert await _wait_exit(proc, 20) == 1
    assert "cannot load checkpoint" in env.log_of(proc) and "newer driver" in env.log_of(proc)
    assert (env.dir / "state/checkpoint.json").read_text() == '{"version": 99, "claims": {}}'  # kept for a human


async def test_broken_nri_side_never_takes_the_kubelet_plugin_down(env: Env) -> None:
    """NRI enabled but no runtime socket (or no access to the host netns): keep serving the kubelet."""
    _add_claim(env, "c1", "uid-1")
    proc = env.start(nri=True)
    await _ready(env, proc)
    await asyncio.sleep(1.5)  # let the NRI component fail and be retried at least once
    assert proc.poll() is None, env.log_of(proc)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c1", "uid-1")])
        assert resp.claims["uid-1"].error == "" and devices_of(resp, "uid-1") == EXPECTED
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0


async def test_claim_configs_are_validated_at_prepare(env: Env) -> None:
    bad = [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": "jumbo"}}},
        }
    ]
    good = [
        {
            "source": "FromClaim",
            "requests": ["nic"],
            "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 9000}}},
        }
    ]
    env.api.add_claim(make_claim("ns", "bad", "uid-bad", [result(env.devices[0], NODE)], configs=bad))
    env.api.add_claim(make_claim("ns", "good", "uid-good", [result(env.devices[1], NODE)], configs=good))
    proc = env.start()
    await _ready(env, proc)
    async with KubeletClient(env.reg_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "bad", "uid-bad"), ("ns", "good", "uid-good")])
    assert "status.allocation.devices.config[0]" in resp.claims["uid-bad"].error
    assert "mtu" in resp.claims["uid-bad"].error
    assert resp.claims["uid-good"].error == ""
    stored = CheckpointStore(env.dir / "state").read(lambda s: s.claims["uid-good"].devices[0].config)
    assert stored.interface.mtu == 9000  # typed: decoded once, at prepare
    proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(proc, 10) == 0
