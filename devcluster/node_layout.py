"""Every path, port and name of one local cluster, derived from one base directory and one name.

A test cluster and a person's ``devcluster up`` cluster use different names, so they share no
socket, directory, cgroup, network namespace, CNI bridge or port: kubelet root dir,
containerd root/state/socket, runc state, the NRI socket, CNI config and IPAM state, the CDI
spec dir and the cgroup root all live below ``NodeLayout.base`` (or carry the name).
Unix socket paths must stay under 108 bytes, so the default base is short.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_BASE = Path("/var/lib/dranet-dev")
DEFAULT_NAME = "dev"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
# ND H100 v5: the 8 InfiniBand NICs the sysfs fixture describes (ib0..ib7 on NUMA 0 and 1).
ND_H100_NICS: tuple[str, ...] = tuple(f"ib{i}" for i in range(8))


class LayoutError(ValueError):
    """A cluster name or base directory that cannot be used; names the field."""


@dataclass(frozen=True)
class NodeLayout:
    """One cluster's paths. ``name``: 1-8 lower-case letters/digits (it goes into link names)."""

    name: str = DEFAULT_NAME
    root: Path = DEFAULT_BASE
    node_name: str = "nd-h100-v5-0"
    topology: str = "nd-h100-v5"
    pod_subnet: str = "10.88.0.0/24"
    # Host names of the 8 NICs: ib0..ib7 as on the real machine. Another cluster on the same
    # host (the test suite's) picks another prefix, since link names are host-global.
    nic_prefix: str = "ib"

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise LayoutError(f"name: {self.name!r} must be 1-8 lower-case letters or digits, starting with a letter")
        if not re.match(r"^[a-z]{1,8}$", self.nic_prefix):
            raise LayoutError(f"nic_prefix: {self.nic_prefix!r} must be 1-8 lower-case letters")
        if not self.root.is_absolute():
            raise LayoutError(f"root: {self.root} must be an absolute path")
        if len(str(self.kubelet_root / "plugins_registry" / "gpu.nvidia.com-reg.sock")) > 100:
            raise LayoutError(f"root: {self.root} is too long for unix socket paths (108 bytes)")

    # -- directories ------------------------------------------------------------------------
    @property
    def base(self) -> Path:
        """Everything of this cluster lives below here."""
        return self.root / self.name

    @property
    def state_file(self) -> Path:
        """What `up` started (pids, ports, mounts), read by `down` and by a second `up`."""
        return self.base / "cluster.json"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def control_plane_dir(self) -> Path:
        return self.base / "cp"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "admin.kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet.yaml"

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def nri_socket(self) -> Path:
        return self.base / "nri" / "nri.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    @property
    def sysfs(self) -> Path:
        """The ND H100 v5 fixture sysfs tree the driver pod reads (mounted at the same path)."""
        return self.base / "sysfs"

    @property
    def driver_state_dir(self) -> Path:
        return self.base / "dranet" / "state"

    @property
    def driver_runtime_dir(self) -> Path:
        return self.base / "dranet" / "run"

    @property
    def values_file(self) -> Path:
        """The dev-only Helm values `up` installs the chart with."""
        return self.base / "values-dev.yaml"

    @property
    def netns_dir(self) -> Path:
        """Where containerd bind-mounts pod network namespaces (``netns_mounts_under_state_dir``)."""
        return self.containerd_state / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def node_ip(self) -> str:
        """The CNI bridge's gateway address: node IP, kubelet and apiserver address."""

        return str(next(ipaddress.ip_network(self.pod_subnet).hosts()))

    @property
    def pod_prefixlen(self) -> int:

        return ipaddress.ip_network(self.pod_subnet).prefixlen

    # -- names ------------------------------------------------------------------------------
    @property
    def cgroup_root(self) -> str:
        """The kubelet's ``cgroupRoot``: pods and their containers go below it in every hierarchy."""
        return f"/dranet-{self.name}"

    @property
    def cni_bridge(self) -> str:
        return f"dncni{self.name}"[:15]

    @property
    def cni_network(self) -> str:
        return f"dranet-{self.name}"

    @property
    def fabric_netns(self) -> str:
        """Where the far ends of the node's NIC veths live (the "fabric" the NICs are cabled to)."""
        return f"dn-{self.name}-fabric"

    @property
    def nics(self) -> tuple[str, ...]:
        return tuple(n.replace("ib", self.nic_prefix, 1) for n in ND_H100_NICS)

    def peer(self, nic: str) -> str:
        """Name of the far end of ``nic`` (inside `fabric_netns`)."""
        return f"{nic}p"
