"""Every path, address and name of one local cluster, derived from one base directory and one name.

A cluster has one control plane (host network namespace) and ``nodes`` real nodes. Each node
(:class:`NodeSpec`) is isolated the way a kind node is, without a container engine: its own
network namespace (``eth0`` on the cluster network, its NICs on the rails: ``ib0``..``ib7`` for
the default ND H100 v5 topology, the topology's IPoIB netdevs for another, its pods'
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
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devcluster.doubles import sysfs_fixture

DEFAULT_BASE = Path("/var/lib/dranet-dev")
DEFAULT_NAME = "dev"
DEFAULT_NODES = 2
# The container runtime of every node: containerd 2.x, or CRI-O (OpenShift's), both with NRI.
RUNTIMES = ("containerd", "crio")
DEFAULT_RUNTIME = "containerd"
DEFAULT_CIDR = "10.88.0.0/20"
MAX_NODES = 14  # one /24 of the cluster's /20 for the node network, one per node for pods
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# ND H100 v5: the 8 InfiniBand NICs the sysfs fixture describes (ib0..ib7 on NUMA 0 and 1).
ND_H100_NICS: tuple[str, ...] = tuple(f"ib{i}" for i in range(8))
# The machine every node is (devcluster/doubles/topologies/<name>.yaml): its fixture sysfs, its
# NICs, its GPUs (the GPU double publishes the fixture's). `up --topology` picks another.
DEFAULT_TOPOLOGY = "nd-h100-v5"
IFNAMSIZ = 15  # the longest interface name: a fabric port is named n<node index><nic>
# The rails: NIC i of every node is on rail i, one L2 segment each (as on a rail-optimized fabric).
RAIL_NET = "172.16.0.0/16"
RAIL_NET6 = "fd16:ac10::/48"  # rail i is its /64 number i
# The address families of the node, pod and service networks and of the rails: IPv4 only,
# IPv6 only, or dual-stack (IPv4 first, as Kubernetes orders a dual-stack cluster by default).
_FAMILY_VERSIONS = {"ipv4": (4,), "ipv6": (6,), "dual": (4, 6)}
IP_FAMILIES = tuple(_FAMILY_VERSIONS)
DEFAULT_IP_FAMILY = "ipv4"
# Virtual: no service proxy runs, so ranges equal across clusters never meet.
SERVICE_RANGES = {4: "10.0.0.0/24", 6: "fd00:10::/112"}


class LayoutError(ValueError):
    """A cluster name, address range or base directory that cannot be used; names the field."""


def rail_nics(topology: str) -> tuple[str, ...]:
    """The NICs a topology puts on the rails: its PCI functions' IPoIB netdevs (``ib*``: the
    compute fabric), in the order the topology lists them. Its Ethernet functions (storage, the
    uplink) stay in the fixture sysfs, so the driver publishes them, but get no cable."""
    if topology == DEFAULT_TOPOLOGY:
        return ND_H100_NICS  # the same names, without reading the YAML on every layout
    topo = sysfs_fixture.load_topology(topology)
    return tuple(n["name"] for dev in topo.get("pci") or [] for n in dev.get("net") or [] if n["name"].startswith("ib"))


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
    crio_run: str = "/run/crio"
    crio_socket: str = "/run/crio/crio.sock"
    # CRI-O pins pod namespaces at <namespaces_dir>/netns/<id>: the chart's netnsDir, as containerd's.
    crio_namespaces_dir: str = "/var/run"
    crio_log_dir: str = "/var/log/crio/pods"
    cdi_dir: str = "/var/run/cdi"
    # The node's fixture sysfs tree (PCI, NUMA, RDMA facts of the layout's topology), as the driver reads it.
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
    topology: str = DEFAULT_TOPOLOGY
    cluster_cidr: str = DEFAULT_CIDR
    nic_prefix: str = "ib"
    node_prefix: str = ""  # empty: the topology's name (nd-h100-v5-0, dgx-h100-0, ...)
    runtime: str = DEFAULT_RUNTIME
    ip_family: str = DEFAULT_IP_FAMILY
    _rails: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        self._check_topology()
        if self.ip_family not in IP_FAMILIES:
            raise LayoutError(f"ip_family: {self.ip_family!r} must be one of {', '.join(IP_FAMILIES)}")
        if self.runtime not in RUNTIMES:
            raise LayoutError(f"runtime: {self.runtime!r} must be one of {', '.join(RUNTIMES)}")
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
        longest = max(self.nics, key=len)
        if len(self.node(MAX_NODES - 1).peer(longest)) > IFNAMSIZ:
            raise LayoutError(
                f"nic_prefix: {self.nic_prefix!r} makes NIC {longest!r} too long for its fabric port "
                f"{self.node(MAX_NODES - 1).peer(longest)!r} ({IFNAMSIZ} bytes at most)"
            )

    def _check_topology(self) -> None:
        """Read the topology's rails and, unless given, name the nodes after it."""
        try:
            rails = rail_nics(self.topology)
        except (ValueError, OSError, KeyError, TypeError, yaml.YAMLError) as exc:
            raise LayoutError(f"topology: {exc}") from None
        if not rails:
            raise LayoutError(f"topology: {self.topology!r} has no InfiniBand netdev (ib*) to put on the rails")
        object.__setattr__(self, "_rails", rails)
        if not self.node_prefix:
            object.__setattr__(self, "node_prefix", Path(self.topology).stem)
        if not re.match(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$", self.node_prefix):
            raise LayoutError(f"node_prefix: {self.node_prefix!r} must be a DNS label of at most 42 characters")

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
    def ranges(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """The cluster's address range of every IP version it uses (the /20, the /48)."""
        return [self._net if v == 4 else self._net6 for v in self.versions]

    @property
    def _net6(self) -> ipaddress.IPv6Network:
        """The cluster's IPv6 range: a ULA /48 named after its IPv4 /20 (10.88.0.0/20 gives
        fd0a:5800::/48), so two clusters' IPv6 ranges differ when their IPv4 ones do."""
        o = self._net.network_address.packed
        return ipaddress.IPv6Network(f"fd{o[0]:02x}:{o[1]:02x}{o[2]:02x}::/48")

    @property
    def versions(self) -> tuple[int, ...]:
        """The IP versions of every network, the primary first: (4,), (6,) or (4, 6)."""
        return _FAMILY_VERSIONS[self.ip_family]

    @property
    def node_network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """The primary cluster network, where the nodes' ``eth0`` and the host link are."""
        return self.node_network_of(self.versions[0])

    def node_network_of(self, version: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """The cluster network of one IP version: the /20's first /24, or the /48's first /64."""
        if version == 4:
            return next(self._net.subnets(new_prefix=24))
        return next(self._net6.subnets(new_prefix=64))

    @property
    def gateway(self) -> str:
        """The host link's primary address: apiserver, cluster DNS, and the nodes' default route."""
        return self.gateways[0]

    @property
    def gateways(self) -> list[str]:
        """The host link's address of every IP version, the primary first."""
        return [str(self.node_network_of(v).network_address + 1) for v in self.versions]

    @property
    def service_ranges(self) -> list[str]:
        """The apiserver's ``--service-cluster-ip-range``, one per IP version, the primary first."""
        return [SERVICE_RANGES[v] for v in self.versions]

    @property
    def nics(self) -> tuple[str, ...]:
        """The NIC names of every node, one rail each: the topology's IPoIB netdevs with ``ib``
        replaced by ``nic_prefix`` (``ib0``..``ib7`` by default; ``ibp24s0``.. on dgx-h100)."""
        return tuple(n.replace("ib", self.nic_prefix, 1) for n in self._rails)

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
        """``eth0``'s primary address: the Node's InternalIP, where its kubelet listens."""
        return self.ip_of(self.layout.versions[0])

    @property
    def ips(self) -> list[str]:
        """``eth0``'s address of every IP version, the primary first (the kubelet's ``--node-ip``)."""
        return [self.ip_of(v) for v in self.layout.versions]

    def ip_of(self, version: int) -> str:
        return str(self.layout.node_network_of(version).network_address + 10 + self.index)

    @property
    def pod_subnet(self) -> str:
        """The node's primary pod range."""
        return self.pod_subnet_of(self.layout.versions[0])

    @property
    def pod_subnets(self) -> list[str]:
        return [self.pod_subnet_of(v) for v in self.layout.versions]

    def pod_subnet_of(self, version: int) -> str:
        """The node's pod range of one IP version: the /20's /24 or the /48's /64 number 1 + index."""
        net = self.layout._net if version == 4 else self.layout._net6
        nets = net.subnets(new_prefix=24 if version == 4 else 64)
        return str(next(itertools.islice(nets, 1 + self.index, None)))

    @property
    def pod_gateway(self) -> str:
        """The node's primary address on its pods' bridge."""
        return self.pod_gateway_of(self.layout.versions[0])

    def pod_gateway_of(self, version: int) -> str:
        return str(ipaddress.ip_network(self.pod_subnet_of(version)).network_address + 1)

    def rail_address(self, rail: int) -> str:
        """The primary host address of NIC ``rail`` (as IPoIB NICs carry one), with its prefix."""
        return self.rail_addresses(rail)[0]

    def rail_addresses(self, rail: int) -> list[str]:
        """Every host address of NIC ``rail``, the primary first: one per IP version."""
        out = []
        for v in self.layout.versions:
            if v == 4:
                out.append(f"{ipaddress.IPv4Network(RAIL_NET).network_address + rail * 256 + 1 + self.index}/24")
            else:
                net = next(itertools.islice(ipaddress.IPv6Network(RAIL_NET6).subnets(new_prefix=64), rail, None))
                out.append(f"{net.network_address + 1 + self.index}/64")
        return out

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
        """The node's fixture sysfs tree of the layout's topology (at `InNode.fixture_sysfs` inside)."""
        return self.dir / "sysfs"

    @property
    def etc_dir(self) -> Path:
        return self.dir / "etc"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd"

    @property
    def crio_dir(self) -> Path:
        """CRI-O's disk: its image store, persistent version file, configuration."""
        return self.dir / "crio"

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
        if in_node == "/var/run" or in_node.startswith("/var/run/"):
            return self.host_path("/run" + in_node[len("/var/run") :])
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
    def cri_socket(self) -> str:
        """The CRI socket of the node's runtime, inside the node (the kubelet's endpoint)."""
        return IN_NODE.crio_socket if self.layout.runtime == "crio" else IN_NODE.containerd_socket

    @property
    def driver_runtime_dir(self) -> Path:
        return self.host_path(IN_NODE.driver_runtime_dir)

    @property
    def driver_claims_dir(self) -> Path:
        """Host side of the driver's prepared claims (the chart's stateDir, under its runtimeDir)."""
        return self.driver_runtime_dir / "claims"

    @property
    def cdi_dir(self) -> Path:
        return self.host_path(IN_NODE.cdi_dir)
