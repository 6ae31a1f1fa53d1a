"""CRI-O built here (devcluster/builders/crio.py) runs on this machine and dranet's NRI plugin registers
with it: the real `crio` (NRI on, its own socket) and a real `dranet run` pointed at that socket.

The quick check, without a cluster; the real-node tests on a CRI-O node are in
tests/e2e/node/test_crio_node.py. `make binaries` builds CRI-O (about 6 minutes cold); run alone,
the test skips, saying how, until `python3 -m devcluster.builders.crio` ran.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devcluster.builders import crio
from devcluster.builders.binaries import cache_root
from harness.fake_apiserver import FakeAPIServer

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]  # the repository: the driver process imports `driver` from there


def _wait(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_dranet_registers_with_crio_nri(nd_h100_sysfs: Path) -> None:
    bin_dir = cache_root() / "crio" / crio.CRIO_VERSION / "bin"
    if not (bin_dir / "crio").is_file() or not shutil.which("conmon"):
        pytest.skip("CRI-O not built: python3 -m devcluster.builders.crio (and apt-get install conmon)")
    if os.geteuid() != 0:
        pytest.skip("CRI-O runs as root")
    base = Path(tempfile.mkdtemp(prefix="dn-crio-"))  # short: unix socket paths
    paths = crio.CrioPaths.under(base)
    crio.prepare_dirs(paths)
    runtime_log = open(base / "crio.log", "wb")
    runtime = subprocess.Popen(
        crio.crio_command(bin_dir, paths), stdout=runtime_log, stderr=subprocess.STDOUT, start_new_session=True
    )
    runtime_log.close()
    driver = None
    api = FakeAPIServer().start()
    try:
        _wait(lambda: paths.nri_socket.exists() and paths.socket.exists(), 60, "CRI-O's sockets")
        version = subprocess.run([str(bin_dir / "crio"), "--version"], capture_output=True, text=True, timeout=30)
        assert f"crio version {crio.CRIO_VERSION.removeprefix('v')}" in version.stdout
        api.write_kubeconfig(base / "kubeconfig")
        driver_log = open(base / "driver.log", "wb")
        driver = subprocess.Popen(
            [sys.executable, "-m", "driver", "--log-format", "text", "run", "--node-name", "n1"]
            + ["--kubeconfig", str(base / "kubeconfig"), "--sysfs-root", str(nd_h100_sysfs)]
            + ["--kubelet-root", str(base / "kubelet"), "--cdi-dir", str(base / "cdi")]
            + ["--state-dir", str(base / "state")]
            + [
                "--runtime-dir",
                str(base / "rt"),
                "--bind-address",
                "127.0.0.1:0",
                "--nri-socket",
                str(paths.nri_socket),
            ],
            cwd=ROOT,
            stdout=driver_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        driver_log.close()
        log = base / "driver.log"
        _wait(lambda: "NRI hooks active" in log.read_text() or driver.poll() is not None, 60, "the NRI handshake")
        text = log.read_text()
        assert "runtime=cri-o version=1.34.0" in text, text[-3000:]
        assert "NRI plugin registered name=dra.net" in text
        # CRI-O's logfmt escapes the quotes around the plugin name. It logs the line once the
        # driver's Synchronize reply is in, which may be a moment after the driver logged its own.
        connected = re.compile(r'plugin \\?"00-dra\.net\\?" connected and synchronized')
        try:
            _wait(lambda: connected.search((base / "crio.log").read_text()), 30, "CRI-O's connected line")
        except AssertionError:
            raise AssertionError((base / "crio.log").read_text()[-2000:]) from None
    finally:
        for proc in (driver, runtime):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=5)
        api.stop()
        shutil.rmtree(base, ignore_errors=True)
