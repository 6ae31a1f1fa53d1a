"""What ``devcluster up`` started and how: the state file, and starting a recorded daemon.

Every daemon of a cluster is started detached (its own session, output to
``logs/<key>.log``), its command line and pid recorded in ``cluster.json`` under a key such as
``kube-apiserver`` or ``n1/kubelet``, so ``down`` and the tests find it and `restart` can start
it again the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devcluster.cluster import node_host
from devcluster.cluster.node_layout import DEFAULT_IP_FAMILY, NodeLayout
from driver.kube.errors import KubeError

REPO = Path(__file__).resolve().parents[2]
_LOCK = threading.Lock()  # node set-ups run in threads and record into one state


@dataclass
class ClusterState:
    """What ``up`` recorded (JSON in ``layout.state_file``), written as it goes."""

    name: str
    nodes: int = 1
    cluster_cidr: str = ""
    k8s_version: str = ""
    runtime: str = "containerd"
    ip_family: str = DEFAULT_IP_FAMILY
    server: str = ""
    kubeconfig: str = ""
    kubectl: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    driver_image: str = ""
    ready: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # How each daemon was started (command, cgroup), so `restart` and a power-on start it again.
    commands: dict[str, list[str]] = field(default_factory=dict)
    cgroups: dict[str, str] = field(default_factory=dict)
    path_env: str = ""
    dns_ready_port: int = 0

    def save(self, layout: NodeLayout) -> None:
        with _LOCK:
            layout.base.mkdir(parents=True, exist_ok=True)
            tmp = layout.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self), indent=1))
            os.replace(tmp, layout.state_file)

    @classmethod
    def load(cls, layout: NodeLayout) -> ClusterState | None:
        try:
            return cls(**json.loads(layout.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists()


def running(layout: NodeLayout) -> ClusterState | None:
    """The state of a fully started, still running cluster of this layout, else None."""
    st = ClusterState.load(layout)
    if not st or not st.ready or not st.pids or not all(pid_alive(p) for p in st.pids.values()):
        return None
    return st


def spawn(
    layout: NodeLayout,
    key: str,
    args: list[str],
    env: dict[str, str] | None = None,
    st: ClusterState | None = None,
    cgroup: str | None = None,
) -> int:
    """Start a detached daemon (own session, output to ``logs/<key>.log``); returns its pid.

    ``cgroup``: the daemon (and everything it starts) goes there in every hierarchy, before it
    runs its first instruction. With ``st``, records the command and the pid.
    """
    if st is not None:
        with _LOCK:
            st.commands[key] = list(args)
            if cgroup:
                st.cgroups[key] = cgroup
    layout.logs.mkdir(parents=True, exist_ok=True)

    def join() -> None:
        if cgroup:
            node_host.join_cgroup(cgroup)

    with open(layout.logs / f"{key.replace('/', '-')}.log", "ab") as out:
        p = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=REPO,
            preexec_fn=join if cgroup else None,
        )
    if st is not None:
        with _LOCK:
            st.pids[key] = p.pid
        st.save(layout)
    return p.pid


def log_tail(layout: NodeLayout, key: str, n: int = 25) -> str:
    try:
        return "\n".join((layout.logs / f"{key.replace('/', '-')}.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def wait_pid(
    layout: NodeLayout, st: ClusterState, key: str, predicate: Callable[[], Any], timeout: float, what: str
) -> Any:
    """Wait for ``predicate``; fail early with the log tail if the process ``key`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(st.pids[key]):
            raise RuntimeError(f"{key} exited while waiting for {what}:\n{log_tail(layout, key)}")
        try:
            v = predicate()
            if v:
                return v
        except (OSError, KubeError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}:\n{log_tail(layout, key)}")
