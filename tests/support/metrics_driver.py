"""A real `dranet run` (no NRI) against the stub API server, for tests that scrape its /metrics."""

from __future__ import annotations

import contextlib
import json
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

from harness.fake_apiserver import FakeAPIServer

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class MetricsDriver:
    """The running driver: its stub API server and its probe/metrics port."""

    api: FakeAPIServer
    port: int
    workdir: Path

    def scrape(self) -> str:
        """One GET of /metrics."""
        return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5).read().decode()


@contextlib.contextmanager
def metrics_driver(sysfs: Path, *extra: str, timeout: float = 30) -> Iterator[MetricsDriver]:
    """``dranet run --no-nri`` on ``sysfs`` with ``extra`` flags until the probe server listens;
    stopped (SIGTERM) and its files removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="dranet-m-"))
    api = FakeAPIServer().start()
    api.write_kubeconfig(d / "kubeconfig")
    log = open(d / "daemon.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "driver", "--log-format", "json", "run", "--no-nri", "--node-name", "n1"]
        + ["--kubeconfig", str(d / "kubeconfig"), "--sysfs-root", str(sysfs)]
        + ["--kubelet-root", str(d / "kubelet"), "--cdi-dir", str(d / "cdi")]
        + ["--state-dir", str(d / "state"), "--runtime-dir", str(d / "run")]
        + ["--bind-address", "127.0.0.1:0", *extra],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            assert time.monotonic() < deadline and proc.poll() is None, (d / "daemon.log").read_text()
            for line in (d / "daemon.log").read_text().splitlines():
                if "probe server listening" in line:
                    port = json.loads(line)["port"]
            time.sleep(0.05)
        yield MetricsDriver(api, port, d)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        api.stop()
        shutil.rmtree(d, ignore_errors=True)
