"""``dranet run`` as a separate process against a control plane: the kubelet plugin on its unix
sockets, the first scan done when ``start()`` returns, SIGTERM or SIGKILL by ``stop()``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.cluster.controlplane import free_port

REPO = Path(__file__).resolve().parents[1]


@dataclass
class DriverProcess:
    """``python -m driver run`` as a separate process against a control plane.

    The kubelet root lives in a short temp dir (unix socket paths are limited to 108 bytes).
    """

    kubeconfig: Path
    node_name: str
    sysfs_root: Path
    workdir: Path
    extra_args: list[str] = field(default_factory=list)  # extra `run` flags
    log_level: str = "info"
    nri_socket: str | None = None  # None: --no-nri (no container runtime in the demo)
    exclude_interfaces: str = "eth0"  # the ND H100 v5 fixture's uplink
    popen: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def state_dir(self) -> Path:
        return self.workdir / "state"

    @property
    def registration_socket(self) -> str:
        return str(self.kubelet_root / "plugins_registry" / "dra.net-reg.sock")

    @property
    def dra_socket(self) -> str:
        return str(self.kubelet_root / "plugins" / "dra.net" / "dra.sock")

    @property
    def log_path(self) -> Path:
        return self.workdir / "driver.log"

    def start(self, timeout: float = 30.0) -> DriverProcess:
        """Start and wait for /healthz (kubelet plugin serving, first scan done)."""
        (self.kubelet_root / "plugins" / "dra.net").mkdir(parents=True, exist_ok=True)
        (self.kubelet_root / "plugins_registry").mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        args = [
            sys.executable,
            "-m",
            "driver",
            "--log-format",
            "text",
            "--log-level",
            self.log_level,
            "run",
            "--node-name",
            self.node_name,
            "--sysfs-root",
            str(self.sysfs_root),
            "--kubelet-root",
            str(self.kubelet_root),
            "--cdi-dir",
            str(self.kubelet_root / "cdi"),
            "--state-dir",
            str(self.state_dir),
            "--runtime-dir",
            str(self.state_dir / "run"),
            "--legacy-state-dir=",  # never the host's /var/lib/dranet
            "--kubeconfig",
            str(self.kubeconfig),
            *(["--nri-socket", self.nri_socket] if self.nri_socket else ["--no-nri"]),
            "--exclude-interfaces",
            self.exclude_interfaces,
            "--bind-address",
            f"127.0.0.1:{self.port}",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"dranet run exited with {self.popen.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"dranet run not healthy within {timeout}s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        """Signal the process group (SIGTERM: clean shutdown; SIGKILL: crash); returns exit code."""
        p, self.popen = self.popen, None
        return stop_group(p, sig, timeout)

    def restart(self) -> DriverProcess:
        """Clean stop, then start again with the same state dir and kubelet root."""
        self.stop()
        return self.start()

    def log(self) -> str:
        """Everything the driver logged so far."""
        return read_log(self.log_path)

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)


def stop_group(p: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal a daemon started with its own process group, SIGKILL after ``timeout``; its exit code."""
    if p is None:
        return None
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=timeout)
        except ProcessLookupError:
            pass
    return p.returncode


def read_log(path: Path) -> str:
    """Everything a daemon logged to ``path`` so far ("" before it wrote any)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, n: int = 40) -> str:
    return "\n".join(read_log(path).splitlines()[-n:])
