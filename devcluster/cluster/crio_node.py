"""A node whose container runtime is CRI-O (``NodeLayout.runtime == "crio"``) instead of containerd.

The same node as containerd's (namespaces, cgroups, kubelet, CNI, GPU double), with CRI-O built
from its Go module (`devcluster.builders.crio`) in the runtime's place:

* CRI-O's disk (image store, persistent version file, configuration) under ``nodes/n<i>/crio``;
  its sockets, exit files and version file under the node's ``/run/crio`` (gone with a reboot);
* the overlay storage driver on the node's ext4 disk, as containerd's overlayfs snapshotter;
* NRI at the standard socket and pod network namespaces pinned under ``/var/run/netns``, the
  chart's defaults, so the chart's values are the containerd node's (but one: see
  `devcluster.cluster.dev_values`);
* the images copied from their docker archives into CRI-O's store with ``skopeo`` (CRI-O has no
  import command), inside the node's namespaces, before CRI-O starts;
* no hugepage sizes for the kubelet (`hide_hugepage_sizes`).

Not handled: after a power cut CRI-O finds no clean-shutdown mark and wipes its store, and
`devcluster.node_daemons.power_on` copies no images (containerd keeps them).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import fields, replace
from pathlib import Path

from devcluster.builders import crio, images
from devcluster.builders.binaries import cache_root
from devcluster.builders.components import NodeBinaries
from devcluster.cluster import node_ns
from devcluster.cluster.node_layout import IN_NODE, NodeSpec

STORAGE_DRIVER = "overlay"
Progress = Callable[[str], None]


class CrioNodeError(RuntimeError):
    """CRI-O cannot run on this node; the message says what is missing."""


def paths(node: NodeSpec) -> crio.CrioPaths:
    """Where the node's CRI-O keeps everything, as seen inside the node."""
    return crio.CrioPaths(
        storage_root=node.crio_dir / "storage",
        run=Path(IN_NODE.crio_run),
        state=node.crio_dir / "state",
        etc=node.crio_dir / "etc",
        namespaces_dir=Path(IN_NODE.crio_namespaces_dir),
        cni_conf_dir=node.cni_conf_dir,
        log_dir=Path(IN_NODE.crio_log_dir),
        cdi_dir=Path(IN_NODE.cdi_dir),
        nri_socket=Path(IN_NODE.nri_socket),
    )


def host_paths(node: NodeSpec) -> crio.CrioPaths:
    """`paths` seen from the host (the node's ``/run`` and ``/var/log`` are its own directories)."""
    inside = paths(node)
    return replace(
        inside,
        **{
            f.name: node.host_path(str(getattr(inside, f.name)))
            for f in fields(inside)
            if not str(getattr(inside, f.name)).startswith(str(node.dir))
        },
    )


def options(binaries: NodeBinaries) -> crio.CrioOptions:
    return crio.CrioOptions(
        storage_driver=STORAGE_DRIVER, pause_image=images.PAUSE_IMAGE, cni_plugin_dir=str(binaries.cni_bin_dir)
    )


def command(node: NodeSpec, binaries: NodeBinaries) -> list[str]:
    """``crio`` for this node (run inside its namespaces)."""
    bin_dir = cache_root() / "crio" / crio.CRIO_VERSION / "bin"
    if not (bin_dir / "crio").is_file():
        raise CrioNodeError(f"CRI-O is not built ({bin_dir / 'crio'} missing): python3 -m devcluster.builders.crio")
    if not shutil.which("conmon") or not shutil.which("skopeo"):
        raise CrioNodeError("a CRI-O node needs conmon and skopeo: make deps (apt-get install conmon skopeo)")
    return crio.crio_command(bin_dir, paths(node), options(binaries))


def prepare(node: NodeSpec) -> None:
    """CRI-O's directories and configuration files on the node's disk."""
    crio.prepare_dirs(host_paths(node))


def hide_hugepage_sizes(node: NodeSpec) -> None:
    """An empty ``/sys/kernel/mm/hugepages`` inside the node, before its kubelet starts.

    The kubelet sends a hugetlb limit per page size listed there; CRI-O passes them to runc when
    the kernel has the hugetlb controller (``/proc/cgroups``), and runc then needs its cgroup v1
    hierarchy, which this VM does not mount, so every container would fail to start. containerd
    drops such limits (``tolerate_missing_hugetlb_controller``); CRI-O has no such setting. With
    no page size listed, no limit is sent. The mount lives in the node's mount namespace only.
    """
    target = "/sys/kernel/mm/hugepages"
    script = f"mountpoint -q {target} || mount -t tmpfs -o ro,size=4k,mode=0555 nohugepages {target}"
    out = subprocess.run(node_ns.enter(node, ["sh", "-c", script]), capture_output=True, text=True)
    if out.returncode != 0:
        raise CrioNodeError(f"{node.name}: hiding {target}: {out.stderr.strip()}")


def _skopeo(node: NodeSpec, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # Inside the node: the store's mounts (if any) stay in the node's mount namespace.
    cmd = node_ns.enter(node, ["skopeo", *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def image_present(node: NodeSpec, ref: str) -> bool:
    """True if the node's CRI-O store has an image named ``ref``."""
    return _skopeo(node, "inspect", "--raw", paths(node).storage_ref(ref, STORAGE_DRIVER), timeout=60).returncode == 0


def load_images(
    node: NodeSpec,
    archives: Iterable[images.ImageArchive],
    tags: Iterable[tuple[str, str]],
    progress: Progress,
) -> None:
    """Copy each archive into CRI-O's store under its name, and under each extra name of ``tags``
    ((source ref, extra name): the same layers, stored once)."""
    by_ref = {a.ref: a for a in archives}
    wanted = [(a, a.ref) for a in by_ref.values()] + [(by_ref[s], t) for s, t in tags if s in by_ref]
    for archive, name in wanted:
        if image_present(node, name):
            continue
        progress(f"[up] {node.name}: copying {name} into CRI-O's store")
        out = _skopeo(
            node,
            "copy",
            "--quiet",
            f"docker-archive:{archive.path}",
            paths(node).storage_ref(name, STORAGE_DRIVER),
        )
        if out.returncode != 0:
            raise images.ImageError(f"skopeo copy {archive.ref} into {node.name}'s CRI-O: {out.stderr.strip()[-500:]}")
