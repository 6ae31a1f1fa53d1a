"""A node's daemons and its power: containerd, the kubelet and the GPU driver double, each
started inside the node's namespaces and ``system`` cgroup; power off and on.

* `boot`: the node's namespaces, its cables (`devcluster.cluster.fabric`), its configs, containerd (and
  the images, imported once: containerd's root survives a reboot), the kubelet, the GPU double.
* `power_off`: every process of the node killed at once (daemons, shims, pods), then its
  namespaces dropped (its pods' network namespaces and its NICs with them) and ``/run`` wiped,
  as when a machine loses power. Its disks stay: ``/var/lib/kubelet``, ``/var/lib/dranet``,
  containerd's root, the fixture sysfs.
* `power_on`: `boot` again with the same recorded commands, as after a reboot.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders import images
from devcluster.builders.components import NodeBinaries, ensure_node_binaries
from devcluster.builders.versions import K8sRelease
from devcluster.cluster import crio_node, fabric, node_host, node_ns
from devcluster.cluster.cluster_state import REPO, ClusterState, spawn, wait_pid
from devcluster.cluster.node_config import write_node_configs
from devcluster.cluster.node_layout import IN_NODE, NodeLayout, NodeSpec
from devcluster.doubles import sysfs_fixture

NODE_LABEL = "dranet.dev/cluster"  # on every real node (kubelet --node-labels): <cluster name>
DAEMONS = ("containerd", "crio", "kubelet", "gpu-plugin")  # containerd or crio: the layout's runtime
Progress = Callable[[str], None]


def key(node: NodeSpec, daemon: str) -> str:
    """The state key of one node daemon: ``n1/kubelet``."""
    return f"n{node.index}/{daemon}"


@dataclass(frozen=True)
class NodeImages:
    """What every node's containerd holds (``tags``: extra names, e.g. the seed's image name)."""

    archives: tuple[images.ImageArchive, ...]
    tags: tuple[tuple[str, str], ...] = ()  # (source ref, extra name)


def build_fixture(node: NodeSpec) -> Path:
    """The node's ND H100 v5 sysfs tree with the layout's NIC names (``ib0``.. or ``<prefix>0``..)
    and GUIDs of its own (node 0 keeps the topology's): every machine's NICs have unique port
    and node GUIDs, so each node's slices name NICs no other node has."""
    topo = sysfs_fixture.load_topology(node.layout.topology)
    prefix = node.layout.nic_prefix
    guid = f"{0x33 + node.index:02x}"
    for dev in topo.get("pci", []):
        for net in dev.get("net", []):
            if net["name"].startswith("ib"):
                net["name"] = prefix + net["name"][2:]
            if "address" in net:
                net["address"] = net["address"].replace(":fd:33:", f":fd:{guid}:")
        rdma = dev.get("rdma")
        for r in rdma if isinstance(rdma, list) else [rdma] if rdma else []:
            if "node_guid" in r:
                r["node_guid"] = r["node_guid"].replace("fd33", f"fd{guid}")
    shutil.rmtree(node.sysfs, ignore_errors=True)
    return sysfs_fixture.build(topo, node.sysfs)


def node_env(binaries: NodeBinaries) -> dict[str, str]:
    """containerd finds the shim and runc on PATH."""
    return dict(os.environ, PATH=":".join([*binaries.path_dirs, os.environ.get("PATH", "")]))


def _system_cgroup(node: NodeSpec) -> str:
    return f"{node.cgroup_root}/{node_ns.SYSTEM_CGROUP}"


def boot(
    node: NodeSpec,
    st: ClusterState,
    binaries: NodeBinaries,
    release: K8sRelease,
    node_images: NodeImages,
    progress: Progress,
) -> None:
    """Everything of one node up to a kubelet registering (does not wait for Ready)."""
    layout = node.layout
    if not node.sysfs.is_dir() or not any(node.sysfs.iterdir()):
        build_fixture(node)
    node_ns.create(node)
    fabric.add_node(node)
    node_host.create_cgroup(_system_cgroup(node))
    write_node_configs(node, binaries, release.fail_cgroup_v1, release.feature_gates)
    env = node_env(binaries)
    st.path_env = env["PATH"]
    if layout.runtime == "crio":
        start_crio(node, st, binaries, node_images, progress)
    else:
        start_containerd(node, st, binaries, node_images, progress)
    start_kubelet(node, st, binaries)
    start_gpu_plugin(node, st)


def start_containerd(
    node: NodeSpec, st: ClusterState, binaries: NodeBinaries, node_images: NodeImages, progress: Progress
) -> None:
    """containerd, then the images it lacks (``ctr images import``)."""
    k = key(node, "containerd")
    cmd = node_ns.enter(node, [str(binaries.containerd), "--config", str(node.containerd_config)])
    spawn(node.layout, k, cmd, node_env(binaries), st, _system_cgroup(node))
    wait_pid(node.layout, st, k, node.containerd_socket.is_socket, 60, f"{node.name}: containerd's socket")
    address = str(node.containerd_socket)
    present = set(images.image_list(binaries.ctr, address))
    for img in node_images.archives:
        if img.ref not in present:
            progress(f"[up] {node.name}: importing {img.ref}")
            images.import_image(binaries.ctr, address, img)
    for source, target in node_images.tags:
        if target not in present:
            images.tag_image(binaries.ctr, address, source, target)


def start_crio(
    node: NodeSpec, st: ClusterState, binaries: NodeBinaries, node_images: NodeImages, progress: Progress
) -> None:
    """The images CRI-O's store lacks (copied while CRI-O is down), then CRI-O."""
    cmd = node_ns.enter(node, crio_node.command(node, binaries))
    crio_node.prepare(node)
    crio_node.hide_hugepage_sizes(node)
    crio_node.load_images(node, node_images.archives, node_images.tags, progress)
    k = key(node, "crio")
    spawn(node.layout, k, cmd, node_env(binaries), st, _system_cgroup(node))
    socket = node.host_path(node.cri_socket)
    wait_pid(node.layout, st, k, socket.is_socket, 60, f"{node.name}: CRI-O's socket")


def has_image(node: NodeSpec, ref: str) -> bool:
    """True if the node's runtime (containerd or CRI-O) holds an image named ``ref``."""
    if node.layout.runtime == "crio":
        return crio_node.image_present(node, ref)
    return images.image_present(ensure_node_binaries(lambda _m: None).ctr, str(node.containerd_socket), ref)


def start_kubelet(node: NodeSpec, st: ClusterState, binaries: NodeBinaries) -> int:
    args = [
        str(binaries.kubelet),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.layout.kubeconfig}",
        f"--hostname-override={node.name}",
        f"--node-ip={','.join(node.ips)}",
        f"--root-dir={IN_NODE.kubelet_root}",
        f"--node-labels={NODE_LABEL}={node.layout.name}",
        "--v=2",
    ]
    cmd = node_ns.enter(node, args)
    return spawn(node.layout, key(node, "kubelet"), cmd, node_env(binaries), st, _system_cgroup(node))


def start_gpu_plugin(node: NodeSpec, st: ClusterState) -> int:
    args = [
        sys.executable,
        "-m",
        "devcluster.doubles.gpu_plugin",
        "--kubeconfig",
        str(node.layout.kubeconfig),
        "--node-name",
        node.name,
        "--kubelet-root",
        IN_NODE.kubelet_root,
        "--cdi-dir",
        IN_NODE.cdi_dir,
    ]
    cmd = node_ns.enter(node, args, wd=REPO)
    return spawn(node.layout, key(node, "gpu-plugin"), cmd, dict(os.environ), st, _system_cgroup(node))


def restart(layout: NodeLayout, daemon: str, node: int = 0, timeout: float = 30.0) -> int:
    """Stop one node daemon (``kubelet``, ``containerd``, ``gpu-plugin``) with SIGTERM and start it
    again with the same command; returns the new pid. Pods keep running (shims stay)."""
    st = ClusterState.load(layout)
    k = key(layout.node(node), daemon)
    if st is None or k not in st.commands:
        raise RuntimeError(f"cluster {layout.name!r}: no recorded command for {k!r}")
    node_host.kill_pids([st.pids[k]], grace=timeout)
    env = dict(os.environ, PATH=st.path_env or os.environ.get("PATH", ""))
    return spawn(layout, k, st.commands[k], env, st, st.cgroups.get(k))


def power_off(layout: NodeLayout, node: int) -> list[str]:
    """Cut the node's power (see the module docstring); returns what could not be removed."""
    spec = layout.node(node)
    node_host.kill_cgroup(spec.cgroup_root)
    problems = node_host.remove_cgroup(spec.cgroup_root)
    problems += node_ns.destroy(spec)
    fabric.remove_node(spec)
    node_ns.wipe_run(spec)
    return problems


def power_on(
    layout: NodeLayout, node: int, binaries: NodeBinaries, release: K8sRelease, progress: Progress = lambda _m: None
) -> None:
    """Boot the node again after `power_off` (images are still in containerd's root)."""
    st = ClusterState.load(layout)
    if st is None:
        raise RuntimeError(f"cluster {layout.name!r} has no state: is it up?")
    boot(layout.node(node), st, binaries, release, NodeImages(archives=()), progress)


def node_pids(layout: NodeLayout, nodes: Iterable[int]) -> set[int]:
    """Every process of the given nodes (daemons, shims, pods)."""
    out: set[int] = set()
    for i in nodes:
        out |= node_host.cgroup_pids(layout.node(i).cgroup_root)
    return out
