"""Host-side pieces of the real node and their complete removal.

* the node's NICs: veth pairs named like the ND H100 v5's (``ib0``..``ib7``), the host ends
  are the NICs the driver hands out, the far ends live in a "fabric" network namespace this
  cluster makes (never the host's uplink);
* the kubelet's cgroup root in every mounted cgroup hierarchy (cgroup v1 here);
* the one shared mount the node needs: the cluster's base directory is bind-mounted onto itself
  with shared propagation, so pod network namespaces (containerd's ``netns`` under its state
  dir) and plugin sockets created later reach the driver pod's ``HostToContainer`` mounts;
* `sweep`: everything a cluster left behind, found from the layout alone (processes whose
  command line names the base directory, tasks in the cgroup root, mounts below the base, the
  NICs, the fabric namespace, the CNI bridge), so ``down`` also cleans up after a crashed ``up``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.node_layout import NodeLayout

log = logging.getLogger(__name__)

NIC_MTU = 4092  # the IPoIB datagram MTU family; a veth takes any MTU up to 65535


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {out.stderr.strip()}")
    return out


def link_exists(name: str, netns: str | None = None) -> bool:
    """True if a link named ``name`` exists (in ``netns`` or the host)."""
    args = ["ip", *(["-n", netns] if netns else []), "link", "show", "dev", name]
    return subprocess.run(args, capture_output=True).returncode == 0


def nic_mac(layout: NodeLayout, nic: str) -> str:
    """A stable, locally administered MAC per cluster and NIC."""
    h = hashlib.sha256(f"{layout.name}/{nic}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in h[:5])


# -- NICs --------------------------------------------------------------------------------------


def create_nics(layout: NodeLayout) -> list[str]:
    """The fabric namespace and one veth pair per NIC; refuses if a NIC name is already taken."""
    taken = [n for n in layout.nics if link_exists(n)]
    if taken:
        raise RuntimeError(
            f"host links {', '.join(taken)} already exist: another cluster uses these NIC "
            f"names (use another --nic-prefix, or `python -m devcluster down` it first)"
        )
    if not Path(f"/run/netns/{layout.fabric_netns}").exists():
        _run("ip", "netns", "add", layout.fabric_netns)
    for nic in layout.nics:
        peer = layout.peer(nic)
        _run(
            "ip",
            "link",
            "add",
            nic,
            "mtu",
            str(NIC_MTU),
            "address",
            nic_mac(layout, nic),
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            layout.fabric_netns,
        )
        _run("ip", "-n", layout.fabric_netns, "link", "set", peer, "mtu", str(NIC_MTU), "up")
        _run("ip", "link", "set", nic, "up")
    return list(layout.nics)


def remove_nics(layout: NodeLayout) -> None:
    """Delete the NICs (wherever the host still has them) and the fabric namespace."""
    for nic in layout.nics:
        if link_exists(nic):
            _run("ip", "link", "del", nic, check=False)
    if Path(f"/run/netns/{layout.fabric_netns}").exists():
        _run("ip", "netns", "del", layout.fabric_netns, check=False)


def create_bridge(layout: NodeLayout) -> None:
    """The CNI bridge with the node IP, made before anything starts (the bridge plugin reuses it).

    The node IP lives here so the apiserver, the kubelet and hostNetwork pods have an address
    pods can reach that is neither loopback nor the host's uplink.
    """
    if not link_exists(layout.cni_bridge):
        _run("ip", "link", "add", layout.cni_bridge, "type", "bridge")
    _run("ip", "addr", "replace", f"{layout.node_ip}/{layout.pod_prefixlen}", "dev", layout.cni_bridge)
    _run("ip", "link", "set", layout.cni_bridge, "up")


# -- cgroups -----------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, and cgroup2)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            out.append(Path(pre.split()[4]))
    return out


def create_cgroup_root(layout: NodeLayout) -> None:
    """``<hierarchy>/<cgroup root>`` everywhere; cpuset copies its parent's cpus and mems."""
    for mnt in cgroup_mounts():
        d = mnt / layout.cgroup_root.lstrip("/")
        d.mkdir(exist_ok=True)
        for f in ("cpuset.cpus", "cpuset.mems"):
            if (d / f).exists() and not (d / f).read_text().strip():
                (d / f).write_text((mnt / f).read_text())


def _cgroup_dirs(layout: NodeLayout) -> list[Path]:
    dirs = []
    for mnt in cgroup_mounts():
        top = mnt / layout.cgroup_root.lstrip("/")
        if top.is_dir():
            dirs += [Path(p) for p, _, _ in os.walk(top)]
    return dirs


def cgroup_pids(layout: NodeLayout) -> set[int]:
    """Every process in the cluster's cgroup root (pods' containers and sandboxes)."""
    pids: set[int] = set()
    for d in _cgroup_dirs(layout):
        try:  # processes, not threads (``tasks`` lists thread ids)
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return pids


def remove_cgroup_root(layout: NodeLayout, timeout: float = 10.0) -> list[str]:
    """Kill what is left in the cgroup root, then remove its directories deepest first.

    Returns the directories that could not be removed.
    """
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(layout)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    left = []
    for d in sorted(_cgroup_dirs(layout), key=lambda p: len(p.parts), reverse=True):
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


def share_base(layout: NodeLayout) -> None:
    """Bind-mount the base dir onto itself with shared propagation (idempotent)."""
    layout.base.mkdir(parents=True, exist_ok=True)
    if not any(p == layout.base for p, _ in _mounts()):
        _run("mount", "--bind", str(layout.base), str(layout.base))
    _run("mount", "--make-rshared", str(layout.base))


def make_shared(mountpoint: Path) -> bool:
    """Give one existing mount point shared propagation (not recursive); True if it changed.

    The chart mounts ``/dev/infiniband`` with ``HostToContainer`` (RDMA device nodes that
    appear later must reach the driver), which containerd only accepts on a shared or slave
    mount. systemd hosts have every mount shared; this VM's ``/dev`` is private.
    """
    for p, optional in _mounts():
        if p == mountpoint:
            if "shared:" in optional:
                return False
            _run("mount", "--make-shared", str(mountpoint))
            return True
    raise RuntimeError(f"{mountpoint} is not a mount point")


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

    Order matters: the kubelet first (it would restart pods), then the pods (cgroup root),
    then every other process naming the base (containerd, shims, control plane, plugins),
    then network state, mounts, cgroups and files.
    """
    report = SweepReport()
    if first:
        kill_pids([p for p in first if _alive(p)])
        report.killed += first
    kubelets = [
        p
        for p in processes_naming(layout.base)
        if Path(f"/proc/{p}/comm").exists() and "kubelet" in Path(f"/proc/{p}/comm").read_text()
    ]
    kill_pids(kubelets)
    report.killed += kubelets
    left = remove_cgroup_root(layout)  # pods' processes, then the cgroup dirs
    others = processes_naming(layout.base)
    kill_pids(others)
    report.killed += others
    if layout.cgroup_root and left:
        left = remove_cgroup_root(layout)  # shims gone: retry what was busy
    report.problems += [f"cgroup not removed: {d}" for d in left]
    remove_nics(layout)
    if link_exists(layout.cni_bridge):
        _run("ip", "link", "del", layout.cni_bridge, check=False)
    report.problems += [f"mount not removed: {m}" for m in unmount_below(layout.base)]
    for f in Path("/var/lib/cni/results").glob(f"{layout.cni_network}-*"):
        f.unlink(missing_ok=True)  # libcni's result cache (fixed path, not configurable in CRI)
    # Host-wide directories containerd and libcni create at fixed paths (shim sockets, the CNI
    # cache): removed when empty, i.e. when no other runtime on this host uses them.
    for d in (Path("/run/containerd/s"), Path("/run/containerd"), Path("/var/lib/cni/results"), Path("/var/lib/cni")):
        try:
            d.rmdir()
        except OSError:
            pass
    if layout.base.exists() and not any(p == layout.base or layout.base in p.parents for p, _ in _mounts()):
        shutil.rmtree(layout.base, ignore_errors=True)
    elif layout.base.exists():
        report.problems.append(f"{layout.base} kept: mounts below it remain")
    return report
