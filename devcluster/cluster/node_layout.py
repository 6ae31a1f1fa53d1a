"""Every path, address and name of one local cluster, derived from one base directory and one name.

A cluster has one control plane (host network namespace) and ``nodes`` real nodes. Each node
(:class:`NodeSpec`) is isolated the way a kind node is, without a container engine: its own
network namespace (``eth0`` on the cluster network, ``ib0``..``ib7`` on the rails, its pods'
bridge), its own mount namespace (the standard node paths below, bind-mounted from the node's
directory under the base), its own cgroup root. Inside a node the paths are the standard ones
(:class:`InNode`), so the chart's defaults apply unchanged; from the host, every node file is
under ``<base>/nodes/n<i>/``.

A test cluster and a person's ``devcluster up`` cluster use different names and address
ranges, so they share no directory, cgroup, network namespace, host link, route or port.
Unix socket paths must stay under 108 bytes, so the default base is short.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE = Path("/var/lib/dranet-dev")
DEFAULT_NAME = "dev"
DEFAULT_NODES = 2
DEFAULT_CIDR = "10.88.0.0/20"
MAX_NODES = 14  # one /24 of the cluster's /20 for the node network, one per node for pods
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# ND H100 v5: the 8 InfiniBand NICs the sysfs fixture describes (ib0..ib7 on NUMA 0 and 1).
ND_H100_NICS: tuple[str, ...] = tuple(f"ib{i}" for i in range(8))
# The rails: NIC i of every node is on rail i, one L2 segment each (as on a rail-optimized fabric).
RAIL_NET = "172.16.0.0/16"


class LayoutError(ValueError):
    """A cluster name, address range or base directory that cannot be used; names the field."""


@dataclass(frozen=True)
class InNode:
    """Where things are inside every node's mount namespace: the chart's default paths."""

    kubelet_root: str = "/var/lib/kubelet"
    driver_state_dir: str = "/var/lib/dranet"
    cni_state_dir: str = "/var/lib/cni"
    log_dir: str = "/var/log"
    run_dir: str = "/run"
    driver_runtime_dir: str = "/run/dranet"
    nri_socket: str = "/var/run/nri/nri.sock"
    netns_dir: str = "/var/run/netns"
    containerd_state: str = "/run/containerd"
    containerd_socket: str = "/run/containerd/containerd.sock"
    cdi_dir: str = "/var/run/cdi"
    # The node's fixture sysfs tree (PCI, NUMA, RDMA facts of an ND H100 v5), as the driver reads it.
    fixture_sysfs: str = "/run/dranet-fixture/sys"
    # Host directories the node's own are bind-mounted over (created when missing, never removed:
    # a directory removed on the host would detach the mounts other clusters' nodes hold on it).
    host_mountpoints: tuple[str, ...] = ("/var/lib/kubelet", "/var/lib/dranet", "/var/lib/cni")


IN_NODE = InNode()


@dataclass(frozen=True)
class NodeLayout:
    """One cluster's names and paths. ``name``: 1-8 lower-case letters/digits (it goes into link
    names); ``cluster_cidr``: a /20 holding the node network and one pod /24 per node."""

    name: str = DEFAULT_NAME
    root: Path = DEFAULT_BASE
    nodes: int = DEFAULT_NODES
    topology: str = "nd-h100-v5"
    cluster_cidr: str = DEFAULT_CIDR
    nic_prefix: str = "ib"
    node_prefix: str = "nd-h100-v5"

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise LayoutError(f"name: {self.name!r} must be 1-8 lower-case letters or digits, starting with a letter")
        if not re.match(r"^[a-z]{1,8}$", self.nic_prefix):
            raise LayoutError(f"nic_prefix: {self.nic_prefix!r} must be 1-8 lower-case letters")
        if not 1 <= self.nodes <= MAX_NODES:
            raise LayoutError(f"nodes: {self.nodes} must be between 1 and {MAX_NODES}")
        if not self.root.is_absolute():
            raise LayoutError(f"root: {self.root} must be an absolute path")
        try:
            net = ipaddress.ip_network(self.cluster_cidr)
        except ValueError as exc:
            raise LayoutError(f"cluster_cidr: {self.cluster_cidr!r} is not an IPv4 network: {exc}") from None
        if net.version != 4 or net.prefixlen > 20:
            raise LayoutError(f"cluster_cidr: {self.cluster_cidr} must be an IPv4 network of /20 or larger")
        if len(str(self.node(MAX_NODES - 1).run_dir / "containerd" / "containerd.sock.ttrpc")) > 100:
            raise LayoutError(f"root: {self.root} is too long for unix socket paths (108 bytes)")

    # -- the cluster ------------------------------------------------------------------------
    @property
    def base(self) -> Path:
        """Everything of this cluster lives below here."""
        return self.root / self.name

    @property
    def state_file(self) -> Path:
        """What `up` started (pids, ports), read by `down` and by a second `up`."""
        return self.base / "cluster.json"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "admin.kubeconfig"

    @property
    def values_file(self) -> Path:
        """The dev-only Helm values `up` installs the chart with."""
        return self.base / "values-dev.yaml"

    @property
    def ns_dir(self) -> Path:
        """The nodes' mount namespace files (a private mount: ``unshare --mount=<file>`` needs one)."""
        return self.base / "ns"

    @property
    def corefile(self) -> Path:
        return self.base / "Corefile"

    @property
    def cgroup_root(self) -> str:
        """Every node's cgroups (daemons, pods) are below this, in every hierarchy."""
        return f"/dranet-{self.name}"

    @property
    def fabric_netns(self) -> str:
        """The switches: the cluster network's bridge and one bridge per rail."""
        return f"dn-{self.name}-fabric"

    @property
    def host_link(self) -> str:
        """The host's one link into the cluster network (the control plane's address)."""
        return f"dn{self.name}"

    @property
    def _net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.cluster_cidr)

    @property
    def node_network(self) -> ipaddress.IPv4Network:
        """The cluster network the nodes' ``eth0`` and the host link are on (first /24)."""
        return next(self._net.subnets(new_prefix=24))

    @property
    def gateway(self) -> str:
        """The host link's address: apiserver, cluster DNS, and the nodes' default route."""
        return str(self.node_network.network_address + 1)

    @property
    def nics(self) -> tuple[str, ...]:
        """The NIC names of every node (``ib0``..``ib7`` by default)."""
        return tuple(n.replace("ib", self.nic_prefix, 1) for n in ND_H100_NICS)

    def node(self, index: int) -> NodeSpec:
        """Node ``index`` (0-based)."""
        return NodeSpec(self, index)

    @property
    def all_nodes(self) -> list[NodeSpec]:
        return [self.node(i) for i in range(self.nodes)]

    @property
    def node_name(self) -> str:
        """The first node's name (where single-node tests and the MPI Operator run)."""
        return self.node(0).name


@dataclass(frozen=True)
class NodeSpec:
    """One node of a cluster: its names, addresses and (host-side) paths."""

    layout: NodeLayout
    index: int

    @property
    def name(self) -> str:
        return f"{self.layout.node_prefix}-{self.index}"

    @property
    def netns(self) -> str:
        return f"dn-{self.layout.name}-n{self.index}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def mnt_ns_file(self) -> Path:
        return self.layout.ns_dir / f"n{self.index}.mnt"

    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot`` (its pods) and, in ``system``, the node's daemons."""
        return f"{self.layout.cgroup_root}/n{self.index}"

    # -- addresses ----------------------------------------------------------------------------
    @property
    def ip(self) -> str:
        """``eth0``'s address: the Node's InternalIP, where its kubelet listens."""
        return str(self.layout.node_network.network_address + 10 + self.index)

    @property
    def pod_subnet(self) -> str:
        subnets = list(ipaddress.IPv4Network(self.layout.cluster_cidr).subnets(new_prefix=24))
        return str(subnets[1 + self.index])

    @property
    def pod_gateway(self) -> str:
        """The node's address on its pods' bridge."""
        return str(ipaddress.IPv4Network(self.pod_subnet).network_address + 1)

    def rail_address(self, rail: int) -> str:
        """The host address of NIC ``rail`` (as IPoIB NICs carry one), with its prefix length."""
        net = ipaddress.IPv4Network(RAIL_NET)
        return f"{net.network_address + rail * 256 + 1 + self.index}/24"

    # -- fabric-side link names ---------------------------------------------------------------
    @property
    def uplink_peer(self) -> str:
        """The far end of the node's ``eth0`` (a port of the cluster network's bridge)."""
        return f"n{self.index}"

    def peer(self, nic: str) -> str:
        """The far end of the node's ``nic`` (a port of the rail's bridge, in the fabric netns)."""
        return f"n{self.index}{nic}"

    # -- host-side paths ----------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.layout.base / "nodes" / f"n{self.index}"

    @property
    def run_dir(self) -> Path:
        """The node's ``/run`` (wiped when the node is powered on again, as a tmpfs would be)."""
        return self.dir / "run"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def driver_state_dir(self) -> Path:
        return self.dir / "dranet"

    @property
    def cni_state_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def sysfs(self) -> Path:
        """The node's ND H100 v5 fixture sysfs tree (at `InNode.fixture_sysfs` inside)."""
        return self.dir / "sysfs"

    @property
    def etc_dir(self) -> Path:
        return self.dir / "etc"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd"

    @property
    def containerd_config(self) -> Path:
        return self.etc_dir / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.etc_dir / "kubelet.yaml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.etc_dir / "cni"

    @property
    def resolv_conf(self) -> Path:
        return self.etc_dir / "resolv.conf"

    def host_path(self, in_node: str) -> Path:
        """The host path of an in-node path below one of the node's bind mounts."""
        for inside, outside in sorted(self.mounts(), key=lambda m: len(m[0]), reverse=True):
            if in_node == inside or in_node.startswith(inside.rstrip("/") + "/"):
                return outside / in_node[len(inside) :].lstrip("/")
        if in_node.startswith("/var/run/"):
            return self.host_path("/run/" + in_node[len("/var/run/") :])
        raise ValueError(f"{in_node} is not below a mount of node {self.name}")

    def mounts(self) -> list[tuple[str, Path]]:
        """(in-node path, host path) of every bind mount of the node's mount namespace, deepest last."""
        return [
            (IN_NODE.run_dir, self.run_dir),
            (IN_NODE.kubelet_root, self.kubelet_root),
            (IN_NODE.driver_state_dir, self.driver_state_dir),
            (IN_NODE.cni_state_dir, self.cni_state_dir),
            (IN_NODE.log_dir, self.log_dir),
            (IN_NODE.fixture_sysfs, self.sysfs),
        ]

    @property
    def containerd_socket(self) -> Path:
        return self.host_path(IN_NODE.containerd_socket)

    @property
    def driver_runtime_dir(self) -> Path:
        return self.host_path(IN_NODE.driver_runtime_dir)

    @property
    def cdi_dir(self) -> Path:
        return self.host_path(IN_NODE.cdi_dir)
