"""Host-side pieces of a cluster's nodes and their complete removal.

* cgroups: every node's daemons and pods live below the cluster's cgroup root, in every mounted
  hierarchy (cgroup v1 here): ``<root>/n<i>/system`` (containerd, kubelet, plugins) and the
  kubelet's ``<root>/n<i>/kubepods``, so a node's processes can be found, killed all at once by
  a power-off, and removed;
* `sweep`: everything a cluster left behind, found from the layout alone (every process in the
  cgroup root, processes whose command line names the base directory, the nodes' mount and
  network namespaces, the fabric namespace and the host link, mounts below the base), so
  ``down`` also cleans up after a crashed ``up``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.cluster import fabric, node_ns
from devcluster.cluster.node_layout import NodeLayout

log = logging.getLogger(__name__)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {out.stderr.strip()}")
    return out


def link_exists(name: str, netns: str | None = None) -> bool:
    """True if a link named ``name`` exists (in ``netns`` or the host)."""
    args = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", name]
    return subprocess.run(args, capture_output=True).returncode == 0


# -- cgroups -----------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, and cgroup2)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            out.append(Path(pre.split()[4]))
    return out


def create_cgroup(path: str) -> None:
    """``<hierarchy>/<path>`` (and its parents) everywhere; cpuset copies its parent's cpus and mems."""
    for mnt in cgroup_mounts():
        d = mnt
        for part in path.strip("/").split("/"):
            parent, d = d, d / part
            d.mkdir(exist_ok=True)
            for f in ("cpuset.cpus", "cpuset.mems"):
                if (d / f).exists() and not (d / f).read_text().strip():
                    (d / f).write_text((parent / f).read_text())


def join_cgroup(path: str, pid: int = 0) -> None:
    """Move ``pid`` (0: the caller) into ``path`` in every hierarchy (made by `create_cgroup`)."""
    for mnt in cgroup_mounts():
        procs = mnt / path.strip("/") / "cgroup.procs"
        if procs.exists():
            procs.write_text(str(pid or os.getpid()))


def _cgroup_dirs(path: str) -> list[Path]:
    dirs = []
    for mnt in cgroup_mounts():
        top = mnt / path.lstrip("/")
        if top.is_dir():
            dirs += [Path(p) for p, _, _ in os.walk(top)]
    return dirs


def cgroup_pids(path: str) -> set[int]:
    """Every process in the cgroup ``path`` and below (a node's daemons, shims and pods)."""
    pids: set[int] = set()
    for d in _cgroup_dirs(path):
        try:  # processes, not threads (``tasks`` lists thread ids)
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return pids


def kill_cgroup(path: str, timeout: float = 10.0) -> None:
    """SIGKILL everything in ``path`` and below until nothing is left (a power-off)."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(path)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_cgroup(path: str, timeout: float = 10.0) -> list[str]:
    """`kill_cgroup`, then remove the directories deepest first; returns those left."""
    kill_cgroup(path, timeout)
    left = []
    for d in sorted(_cgroup_dirs(path), key=lambda p: len(p.parts), reverse=True):
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            left.append(str(d))
    return left


# -- mounts ------------------------------------------------------------------------------------


def _mounts() -> list[tuple[Path, str]]:
    """(mount point, optional fields) of this mount namespace."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre = line.partition(" - ")[0].split()
        out.append((Path(pre[4].replace("\\040", " ")), " ".join(pre[6:])))
    return out


def unmount_below(base: Path) -> list[str]:
    """Unmount every mount at or below ``base``, deepest first; lazily if busy. Returns failures."""
    failed = []
    for _ in range(3):
        mounts = sorted(
            {p for p, _ in _mounts() if p == base or base in p.parents}, key=lambda p: len(p.parts), reverse=True
        )
        if not mounts:
            return []
        failed = []
        for m in mounts:
            if _run("umount", str(m), check=False).returncode != 0:
                if _run("umount", "-l", str(m), check=False).returncode != 0:
                    failed.append(str(m))
    return failed


# -- processes ---------------------------------------------------------------------------------


def processes_naming(base: Path) -> list[int]:
    """PIDs whose command line mentions ``base`` (our daemons, shims, plugins), never our own."""
    needle = str(base).encode()
    me = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd:
            found.append(int(entry.name))
    return found


def kill_pids(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    alive = set(pids)
    for pid in list(alive):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            alive.discard(pid)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _alive(p)}
        time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# -- the whole sweep ---------------------------------------------------------------------------


@dataclass
class SweepReport:
    """What `sweep` removed and what it could not."""

    killed: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def sweep(layout: NodeLayout, first: list[int] | None = None) -> SweepReport:
    """Remove everything of this cluster from the host; safe to run any number of times.

    Order: the kubelets first (they would restart pods), then every process of every node (the
    cgroup root: daemons, shims, pods), then the rest naming the base (control plane, DNS), then
    the nodes' namespaces (pod network namespaces and NICs go with them), the fabric and the
    host link, mounts, cgroups and files.
    """
    report = SweepReport()
    if first:
        kill_pids([p for p in first if _alive(p)])
        report.killed += first
    kubelets = [
        p
        for p in cgroup_pids(layout.cgroup_root) | set(processes_naming(layout.base))
        if Path(f"/proc/{p}/comm").exists() and "kubelet" in Path(f"/proc/{p}/comm").read_text()
    ]
    kill_pids(kubelets)
    report.killed += kubelets
    kill_cgroup(layout.cgroup_root)
    others = processes_naming(layout.base)
    kill_pids(others)
    report.killed += others
    report.problems += [f"cgroup not removed: {d}" for d in remove_cgroup(layout.cgroup_root)]
    for i in node_ns.node_indexes(layout):
        report.problems += node_ns.destroy(layout.node(i))
    fabric.remove(layout)
    report.problems += [f"mount not removed: {m}" for m in unmount_below(layout.base)]
    if layout.base.exists() and not any(p == layout.base or layout.base in p.parents for p, _ in _mounts()):
        shutil.rmtree(layout.base, ignore_errors=True)
    elif layout.base.exists():
        report.problems.append(f"{layout.base} kept: mounts below it remain")
    return report
