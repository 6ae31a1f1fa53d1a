"""One MPIJob of the training example run from ``kubectl apply`` to its end, measured: when both workers were Ready,
when the first rank started, when the launcher printed ``MFU_RESULT``, how the job ended, and
how many bytes each NIC of each node moved on its rail meanwhile.

Shared by ``make demo``, the two-node tests and the MPIJob start benchmark. Times are wall
clock: the apply is timed here, the launcher's lines by the container runtime's log
timestamps (``kubectl logs --timestamps``), so log polling adds no error.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devcluster.cluster import fabric, mpijobs
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.node_layout import NodeLayout
from devcluster.cluster.pods import Kubectl, KubectlError
from driver.kube.client import KubeClient
from driver.kube.errors import NotFound

FIRST_RANK_RE = re.compile(r"\brank \d+/\d+ local \d+ device ")
GLOO_RE = re.compile(r"gloo interfaces (\S+)")
# Bytes a NIC may move while its rail carries no training traffic (IPv6 neighbour discovery,
# router solicitations when a NIC moves into a pod and comes up).
IDLE_RAIL_BYTES = 64 * 1024


@dataclass
class RunResult:
    """What one MPIJob run did (``None`` for a milestone it never reached)."""

    job: str
    which: str
    workers_ready_s: float | None = None
    first_rank_s: float | None = None
    mfu_s: float | None = None
    ended_s: float | None = None
    outcome: str = ""  # "Succeeded", "Failed", or "" (still running when the run stopped waiting)
    mfu_line: str = ""
    notes: list[str] = field(default_factory=list)  # the benchmark's "benchmark: ..." lines
    gloo_interfaces: str = ""  # what rank 0 said it used
    rdma_check: str = ""  # the launcher's "RDMA check: ..." line: whether the allreduce over RDMA ran
    report: mpijobs.JobReport | None = None  # pods, nodes and claims while the workers ran
    rail_bytes: dict[tuple[int, str], int] = field(default_factory=dict)  # (node, NIC) -> tx + rx
    launcher_log: str = ""

    def busy_nics(self, threshold: int = IDLE_RAIL_BYTES) -> dict[int, list[str]]:
        """node -> NICs that moved more than ``threshold`` bytes during the run."""
        out: dict[int, list[str]] = {}
        for (node, nic), n in sorted(self.rail_bytes.items()):
            if n > threshold:
                out.setdefault(node, []).append(nic)
        return out


def _conditions(kube: KubeClient, ns: str, job: str) -> dict[str, str]:
    obj = kube.request("GET", f"{mpijobs.MPIJOBS_API}/namespaces/{ns}/mpijobs/{job}")
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions", [])}


def _workers_ready(kube: KubeClient, ns: str, job: str, workers: int) -> bool:
    pods = [
        p for p in mpijobs.job_pods(kube, ns, job) if p["metadata"]["labels"].get(mpijobs.JOB_ROLE_LABEL) == "worker"
    ]
    ready = [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    ]
    return len(pods) == workers and len(ready) == workers


def launcher_pod(kube: KubeClient, ns: str, job: str) -> str | None:
    """The launcher pod's name once the operator's Job made it."""
    for p in mpijobs.job_pods(kube, ns, job):
        if p["metadata"]["labels"].get(mpijobs.JOB_ROLE_LABEL) == "launcher":
            return str(p["metadata"]["name"])
    return None


def _timestamped(kubectl: Kubectl, ns: str, pod: str) -> list[tuple[float, str]]:
    """The launcher's log as (epoch seconds, line); empty while the container has not started."""
    try:
        out = kubectl.run("logs", "-n", ns, pod, "--timestamps", "--tail=-1", timeout=30)
    except KubectlError:
        return []
    lines = []
    for raw in out.splitlines():
        stamp, _, text = raw.partition(" ")
        try:
            t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        lines.append((t, text))
    return lines


def rail_bytes(
    before: dict[tuple[int, str], tuple[int, int]], after: dict[tuple[int, str], tuple[int, int]]
) -> dict[tuple[int, str], int]:
    """Bytes sent plus received per (node, NIC) between two `fabric.rail_counters` readings."""
    return {k: (after[k][0] - before[k][0]) + (after[k][1] - before[k][1]) for k in after if k in before}


def apply_job(kubectl: Kubectl, ns: str, which: str) -> float:
    """``kubectl apply -f`` the training example's MPIJob file, unchanged; returns the wall-clock time of the apply."""
    t0 = time.time()
    kubectl.run("apply", "-n", ns, "-f", str(mpijobs.MPIJOB_FILES[which]), timeout=60)
    return t0


def run(
    kube: KubeClient,
    kubectl: Kubectl,
    layout: NodeLayout,
    ns: str,
    which: str,
    timeout: float = 900,
    until: str = "end",
    on_workers_ready: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """``kubectl apply -f`` the training example's MPIJob ``which`` and follow it (see `follow`)."""
    before = fabric.rail_counters(layout)
    t0 = apply_job(kubectl, ns, which)
    job = mpijobs.load_mpijob(which, ns)
    return follow(kube, kubectl, layout, ns, job, t0, before, which, timeout, until, on_workers_ready)


def follow(
    kube: KubeClient,
    kubectl: Kubectl,
    layout: NodeLayout,
    ns: str,
    job: dict[str, Any],
    t0: float,
    before: dict[tuple[int, str], tuple[int, int]],
    which: str = "",
    timeout: float = 900,
    until: str = "end",
    on_workers_ready: Callable[[RunResult], None] | None = None,
) -> RunResult:
    """Follow the MPIJob ``job`` created at wall-clock ``t0`` until ``until``: ``"end"``
    (Succeeded or Failed), ``"first-rank"`` or ``"workers-ready"``; ``on_workers_ready`` runs while
    the workers run (e.g. to look inside one). ``before``: the rail counters at ``t0``. The job
    is left as it is (delete it with `mpijobs.delete_job`)."""
    name = job["metadata"]["name"]
    workers = int(job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])
    res = RunResult(name, which)
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    wait_for(lambda: _workers_ready(kube, ns, name, workers), left(), 0.2, f"MPIJob {name}: {workers} workers Ready")
    res.workers_ready_s = time.time() - t0
    res.report = mpijobs.report(kube, ns, job)
    if on_workers_ready is not None:
        on_workers_ready(res)
    if until == "workers-ready":
        return res
    pod = wait_for(lambda: launcher_pod(kube, ns, name), left(), 0.2, f"MPIJob {name}: the launcher pod")

    def first_rank() -> bool:
        return any(FIRST_RANK_RE.search(text) for _, text in _timestamped(kubectl, ns, pod))

    def ended() -> str:
        conds = _conditions(kube, ns, name)
        return next((c for c in ("Succeeded", "Failed") if conds.get(c) == "True"), "")

    wait_for(lambda: first_rank() or ended(), left(), 0.5, f"MPIJob {name}: the first rank")
    if until == "end":
        res.outcome = wait_for(ended, left(), 0.5, f"MPIJob {name}: Succeeded or Failed")
        res.ended_s = time.time() - t0
    log = _timestamped(kubectl, ns, pod)
    res.launcher_log = "\n".join(text for _, text in log)
    for t, text in log:
        if FIRST_RANK_RE.search(text):
            if res.first_rank_s is None:
                res.first_rank_s = t - t0
            m = GLOO_RE.search(text)
            if m and "rank 0/" in text:
                res.gloo_interfaces = m.group(1)
        if text.startswith("RDMA check: ") and not res.rdma_check:
            res.rdma_check = text
        if text.startswith("benchmark: ") and text not in res.notes:
            res.notes.append(text)
        if text.startswith("MFU_RESULT "):
            res.mfu_line, res.mfu_s = text, t - t0
    res.rail_bytes = rail_bytes(before, fabric.rail_counters(layout))
    return res


def parse_mfu(line: str) -> dict[str, Any]:
    """``MFU_RESULT k=v ...`` -> dict (numbers converted), like the example's ``mfu.parse_result_line``."""
    out: dict[str, Any] = {}
    for part in line.split()[1:]:
        k, _, v = part.partition("=")
        for conv in (int, float):
            with contextlib.suppress(ValueError):
                out[k] = conv(v)
                break
        else:
            out[k] = v
    return out


def job_exists(kube: KubeClient, ns: str, job: str) -> bool:
    try:
        kube.request("GET", f"{mpijobs.MPIJOBS_API}/namespaces/{ns}/mpijobs/{job}")
    except NotFound:
        return False
    return True


def format_rails(layout: NodeLayout, res: RunResult) -> list[str]:
    """Bytes per rail and node, one line per node (the demo prints these)."""
    lines = []
    for node in layout.all_nodes:
        cells = []
        for nic in layout.nics:
            n = res.rail_bytes.get((node.index, nic), 0)
            cells.append(f"{nic} {_human(n):>7}")
        lines.append(f"    {node.name}: " + "  ".join(cells))
    return lines


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)
