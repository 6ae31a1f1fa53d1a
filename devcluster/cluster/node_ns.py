"""A node's namespaces: its network namespace and its persistent mount namespace.

The mount namespace is made once per power-on, from inside the node's network namespace
(``nsenter --net`` then ``unshare --mount=<file>``, which keeps it alive through a bind mount of
its ns file), and set up like a kind node's:

* the node's own directories bind-mounted at the standard paths (`NodeSpec.mounts`): ``/run``
  (containerd's state and socket, the NRI socket, pod network namespaces, the driver's runtime
  dir, CDI specs), ``/var/lib/kubelet``, ``/var/lib/dranet``, ``/var/lib/cni``, ``/var/log``, and
  the fixture sysfs tree at `InNode.fixture_sysfs`;
* a sysfs mounted from inside the node's network namespace at ``/sys``, so ``/sys/class/net``
  lists the node's own links (the cgroup hierarchies are moved over from the host's ``/sys``);
* every mount shared within the node (a new peer group, never back to the host), so the chart's
  ``HostToContainer`` mounts (pod network namespaces, ``/dev/infiniband``) see later mounts.

Every node daemon runs through :func:`enter` (``nsenter`` into both namespaces) in the node's
``system`` cgroup, so a power-off finds all of them (and their pods) in the node's cgroup tree.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from devcluster.cluster.node_layout import IN_NODE, NodeLayout, NodeSpec

SYSTEM_CGROUP = "system"  # the node's daemons, next to the kubelet's kubepods


class NodeNsError(RuntimeError):
    """A namespace or mount of a node could not be made; the message has the failing step."""


def _run(args: Sequence[str], what: str) -> None:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if out.returncode != 0:
        raise NodeNsError(f"{what}: `{' '.join(args[:6])}...` failed: {(out.stderr or out.stdout).strip()[-600:]}")


def _mounted(path: Path) -> bool:
    target = str(path)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4] == target:
            return True
    return False


def private_ns_dir(layout: NodeLayout) -> None:
    """``<base>/ns`` as a private bind mount of itself: the kernel refuses to bind a mount
    namespace file onto a shared mount (it could propagate into the namespace it names)."""
    layout.ns_dir.mkdir(parents=True, exist_ok=True)
    # Nodes boot side by side: the check and the bind go under one lock, or a second bind of the
    # directory over itself would hide a node's namespace file already bound there (nsenter then
    # reads an empty file, and the file can be neither unmounted nor removed by its path).
    with open(layout.base / ".ns-dir.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _mounted(layout.ns_dir):
            _run(["mount", "--bind", str(layout.ns_dir), str(layout.ns_dir)], "ns dir")
        _run(["mount", "--make-private", str(layout.ns_dir)], "ns dir")


def _setup_script(node: NodeSpec) -> str:
    """What runs once inside the new mount namespace (``sh -eu``)."""
    lines = []
    for inside, outside in sorted(node.mounts(), key=lambda m: len(m[0])):
        lines += [f"mkdir -p '{inside}'", f"mount --bind '{outside}' '{inside}'"]
    # /sys of this network namespace; the cgroup hierarchies stay where every tool expects them.
    keep = f"{IN_NODE.run_dir}/.host-cgroup"
    lines += [
        f"mkdir -p '{keep}'",
        f"mount --rbind /sys/fs/cgroup '{keep}'",
        "mount -t sysfs sysfs /sys",
        f"mount --move '{keep}' /sys/fs/cgroup",
        f"rmdir '{keep}'",
        "mount --make-rshared /",
    ]
    return "\n".join(lines)


def create(node: NodeSpec) -> None:
    """The node's network namespace and its persistent, set-up mount namespace."""
    for d in (
        node.run_dir,
        node.kubelet_root,
        node.driver_state_dir,
        node.cni_state_dir,
        node.log_dir,
        node.sysfs,
        node.etc_dir,
        node.containerd_root,
    ):
        d.mkdir(parents=True, exist_ok=True)
    for m in IN_NODE.host_mountpoints:
        Path(m).mkdir(parents=True, exist_ok=True)
    if not node.netns_path.exists():
        _run(["ip", "netns", "add", node.netns], f"node {node.name}: network namespace")
    private_ns_dir(node.layout)
    if _mounted(node.mnt_ns_file):
        return
    node.mnt_ns_file.touch()
    _run(
        [
            "nsenter",
            f"--net={node.netns_path}",
            "unshare",
            f"--mount={node.mnt_ns_file}",
            "--propagation",
            "slave",
            "sh",
            "-euc",
            _setup_script(node),
        ],
        f"node {node.name}: mount namespace",
    )


def enter(node: NodeSpec, cmd: Sequence[str], wd: Path | str = "/") -> list[str]:
    """``cmd`` run inside the node's network and mount namespaces."""
    return ["nsenter", f"--net={node.netns_path}", f"--mount={node.mnt_ns_file}", f"--wd={wd}", "--", *cmd]


def destroy(node: NodeSpec) -> list[str]:
    """Drop the node's namespaces (its processes must be gone): the mount namespace with every
    mount in it (pod network namespaces too), then the network namespace with the node's links.
    Returns what could not be removed."""
    problems = []
    if _mounted(node.mnt_ns_file):
        out = subprocess.run(["umount", str(node.mnt_ns_file)], capture_output=True, text=True)
        if out.returncode != 0:
            out = subprocess.run(["umount", "-l", str(node.mnt_ns_file)], capture_output=True, text=True)
            if out.returncode != 0:
                problems.append(f"mount namespace {node.mnt_ns_file}: {out.stderr.strip()}")
    try:
        node.mnt_ns_file.unlink(missing_ok=True)
    except OSError as e:  # still a mount point (one hidden under another mount): the sweep unmounts below the base
        problems.append(f"mount namespace file {node.mnt_ns_file}: {e.strerror}")
    if node.netns_path.exists():
        out = subprocess.run(["ip", "netns", "del", node.netns], capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"netns {node.netns}: {out.stderr.strip()}")
    return problems


def wipe_run(node: NodeSpec) -> None:
    """Empty the node's ``/run`` (a reboot's tmpfs), keeping the directory."""
    if node.run_dir.is_dir():
        for entry in node.run_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def node_indexes(layout: NodeLayout) -> list[int]:
    """Every node of this cluster that has a network namespace or a directory (also of a crashed
    ``up`` with another node count), plus the layout's own."""
    prefix = f"dn-{layout.name}-n"
    found = set(range(layout.nodes))
    try:
        found |= {
            int(n[len(prefix) :])
            for n in os.listdir("/run/netns")
            if n.startswith(prefix) and n[len(prefix) :].isdigit()
        }
    except FileNotFoundError:
        pass
    nodes_dir = layout.base / "nodes"
    if nodes_dir.is_dir():
        found |= {int(d.name[1:]) for d in nodes_dir.iterdir() if d.name[:1] == "n" and d.name[1:].isdigit()}
    return sorted(found)
