"""The daemon's configuration (`dranet run` flags) and the one definition of each default.

:class:`DriverConfig` is passed to every component; its field defaults are the flags' defaults
(``driver.cli`` reads them from here, the chart's values and docs/reference.md are checked
against them by tests).
"""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field, fields

DRIVER_NAME = "dra.net"
"""Driver name; the DeviceClass ``dranet.net`` selects ``device.driver == "dra.net"``."""

DEVICE_CLASS = "dranet.net"
"""The DeviceClass the chart creates (``deviceClass.name``) and claims name: every device of the driver."""
STATE_DAMAGED_EVENT = "DranetStateDamaged"
"""The reason of the Warning event a driver posts on its Node when it found its prepared claims
damaged at start (``kubectl dranet doctor`` lists them)."""
FILES_MENDED_EVENT = "DranetFilesMended"
"""The reason of the Warning event a driver posts on its Node when it wrote again a device metadata
file or CDI spec it found missing or damaged (at most one a minute, with the count since the last)."""

HOST_NETNS = "/proc/self/ns/net"
"""The host network namespace NICs return to: the daemon's own, opened at start (a hostNetwork
pod is in the host netns; ``/proc/1/ns/net`` would also need hostPID)."""

UNHEALTHY_TAINT_KEY = f"{DRIVER_NAME}/unhealthy"
"""Key of the device taint on a device whose link is down or whose RDMA port is not ACTIVE; the
value says why (``LinkDown``, ``PortNotActive``, ``NetdevMissing``)."""

DEFAULT_FILTER = f'!has(device.attributes["{DRIVER_NAME}"].type) || device.attributes["{DRIVER_NAME}"].type != "veth"'
"""Admin filter (CEL, DeviceClass syntax): drop veth by default like the Go driver."""


FEATURE_GATES: dict[str, bool] = {
    "DRAListTypeAttributes": False,
    "PersistentResourceSliceAttributes": False,
}
"""``--feature-gates`` this driver knows, with their defaults (the Go driver's gates, same names).

``DRAListTypeAttributes``: publish ``resource.kubernetes.io/numaNode`` as an int list (KEP-5491;
the apiserver must have the gate too: checked at start, see ``dra.field_support.list_attributes_accepted``).
``PersistentResourceSliceAttributes``: accepted for compatibility; this driver always keeps
allocated devices published with their last attributes."""

INSTANCE_SOCKET_CHARS = 8
"""How much of ``--instance-id`` (the pod UID) goes into the kubelet socket names."""

TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
"""``--unhealthy-taint-effect`` values: the DeviceTaint effect put on an unhealthy device in the
ResourceSlice (``None``: publish no taints)."""

CLOUD_PROVIDER_AUTO = "auto"
"""``--cloud-provider`` default: detect GCE, AWS, Azure, OKE, Alibaba in the Go driver's order."""


PROFILE_PROVIDERS = ("cloud", "none", "webhook")
"""``--profile-provider`` values (dranet's). ``cloud`` (the default) and ``none``: no profile
provider here (no cloud provider of this driver resolves profiles), so a claim naming a
``profile`` is refused at prepare; ``webhook``: ``--webhook-url`` answers (dranet's API)."""

PROFILE_WEBHOOK_TIMEOUT = 5.0
"""Seconds one call to the ``--webhook-url`` profile provider may take (connect, send, each read)."""

DHCP_TIMEOUT = 1.0
"""Seconds the DHCP exchanges of a pod's ``interface.dhcp`` NICs may take in RunPodSandbox: the
runtime gives the whole NRI hook 2 s, and the NICs must still go back to the host if no lease comes."""


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``--feature-gates A=true,B=false`` (Kubernetes syntax) -> every known gate's value.

    Raises ``ValueError`` naming the flag, the gate and the reason (unknown gate, value not a bool).
    """
    gates = dict(FEATURE_GATES)
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if not sep or value not in ("true", "false"):
            raise ValueError(f"--feature-gates: {item!r}: expected <gate>=true|false")
        if name not in FEATURE_GATES:
            raise ValueError(f"--feature-gates: unrecognized feature gate {name!r} (known: {', '.join(FEATURE_GATES)})")
        gates[name] = value == "true"
    return gates


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


SHARING_POOLS_ANNOTATION = f"{DRIVER_NAME}/sharing-pools"
"""The Node annotation giving this node's own address pools (``ib0=10.77.5.0/26,...``, the syntax of
``--sharing-pools``), over the flag's: a range per node, which a DaemonSet-wide flag cannot give.
The driver watches its Node: a change is in effect for the next lease, without a restart."""
SUBNET_POOL = "subnet"
"""A pool entry naming the subnet of the NIC's host address (right when no other node is on it)."""
NODE_SETTING_REFUSED_EVENT = "DranetNodeSettingRefused"
"""The reason of the Warning event a driver posts on its Node for an annotation of its own it cannot
use (the message names the annotation, the entry and why, and what stays in effect)."""
LEASE_OUTSIDE_POOL_EVENT = "DranetLeaseOutsidePool"
"""The reason of the Warning event a driver posts on its Node when running shares hold addresses
outside their NIC's pool as it is now (a range changed or removed under them): they keep them."""
VF_COUNT_REFUSED_EVENT = "DranetVfCountRefused"
"""The reason of the Warning event a driver posts on its Node for a PF whose VF count ``sriov.vfs``
asks for it could not set at start (the message names the entry, the PF and why; the count stays)."""
NODE_WATCH_SECONDS = 300
"""Seconds one watch of the driver's own Node lasts before the API server ends it and the driver
resumes it from the last resourceVersion it saw (no GET: nothing is missed between the two)."""
NODE_WATCH_RETRY_MAX = 30.0
"""Most seconds between two attempts to watch the driver's Node while the API server cannot answer
or refuses (from 1 s, doubling); the Node's settings stay as last read meanwhile."""


def parse_sharing_pools(text: str, what: str = "--sharing-pools") -> dict[str, IPNetwork | None]:
    """``ib0=10.77.5.0/26,ib1=subnet`` -> {interface: network, or None for the NIC's subnet};
    ``ValueError`` naming ``what`` (the flag or the annotation), the entry and the reason."""
    pools: dict[str, IPNetwork | None] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, cidr = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{what}: {item!r}: expected <interface>=<CIDR> or <interface>={SUBNET_POOL}")
        if cidr.strip() == SUBNET_POOL:
            pools[name.strip()] = None
            continue
        try:
            pools[name.strip()] = ipaddress.ip_network(cidr.strip(), strict=True)
        except ValueError as exc:
            raise ValueError(f"{what}: {name.strip()}: {exc}") from None
    return pools


@dataclass
class DriverConfig:
    """Settings of a running node driver. CLI flags map 1:1 onto these fields."""

    node_name: str
    driver_name: str = DRIVER_NAME
    sysfs_root: str = "/sys"
    kubelet_root: str = "/var/lib/kubelet"
    # Prepared claims: tmpfs, as their kernel objects (see driver/checkpoint/location.py).
    state_dir: str = "/run/dranet/claims"
    # Older drivers' claims on disk: used while written during this boot, else retired.
    legacy_state_dir: str = "/var/lib/dranet"
    runtime_dir: str = "/run/dranet"  # pod network state (tmpfs: cleared by a reboot, like the netns)
    host_netns: str = HOST_NETNS
    nri_socket: str = "/var/run/nri/nri.sock"
    nri_enabled: bool = True
    # Device metadata files in the containers (KEP-5304), bind-mounted by CDI specs in cdi_dir.
    device_metadata: bool = True
    cdi_dir: str = "/var/run/cdi"
    kubeconfig: str | None = None  # None: in-cluster config
    filter: str = DEFAULT_FILTER  # empty string disables filtering
    # Shared NICs: CEL in --filter's syntax; empty shares none (see driver/inventory/sharing.py).
    sharing_filter: str = ""
    sharing_max_interfaces: int = 16  # sub-interfaces one shared NIC carries (its dra.net/interfaces)
    # Address pools of sub-interfaces whose claim sets no address: "ib0=10.77.5.0/26,..."; a NIC
    # without one uses the subnet of its IPv4 host address (see driver/nri/address_pool.py).
    sharing_pools: str = ""
    # VF counts made at start, by PF selector (the chart's sriov.vfs, JSON; see
    # driver/inventory/vf_counts.py): empty leaves every PF's count to the admin.
    sriov_vfs: str = ""
    # Treated like the default-route uplink: never published, nor anything enslaved to them.
    exclude_interfaces: list[str] = field(default_factory=list)
    bind_address: str = ":9177"  # /healthz and /metrics
    # Written while this instance serves the probe port: a file of the container's own (the chart's
    # exec startup probe), since with hostNetwork an HTTP probe may reach the other instance.
    probe_port_file: str = ""
    publish_interval: float = 2.0  # coalescing window for ResourceSlice writes (s)
    resync_interval: float = 60.0  # periodic full rescan (s)
    cloud_provider: str = CLOUD_PROVIDER_AUTO  # auto | none | gce | aws | azure | oke | alibaba
    cloud_metadata_url: str | None = None  # replaces every metadata service's host (tests, proxies)
    feature_gates: dict[str, bool] = field(default_factory=lambda: dict(FEATURE_GATES))
    profile_provider: str = "cloud"  # cloud | none | webhook (PROFILE_PROVIDERS)
    webhook_url: str | None = None  # the webhook profile provider (http://, https://, unix://)
    log_level: str = "info"
    log_format: str = "auto"  # json | text | auto (text on a terminal, JSON in a pod or a pipe)
    # This instance's id (the pod UID in the chart): per-instance kubelet socket names, so a new
    # driver pod registers beside the old one during a rolling update (kubelet >= 1.33).
    # Empty: the fixed names <driver>-reg.sock / dra.sock (one instance per node).
    instance_id: str = ""
    health_interval: float = 1.0  # seconds between link/port health checks of every device
    unhealthy_taint_effect: str = "NoSchedule"  # TAINT_EFFECTS; taint key UNHEALTHY_TAINT_KEY

    @property
    def plugin_dir(self) -> str:
        """Directory of the DRA socket (must be the same path inside and outside the container)."""
        return f"{self.kubelet_root}/plugins/{self.driver_name}"

    @property
    def dra_socket(self) -> str:
        """The DRA gRPC socket the kubelet dials (``dra-<instance>.sock`` with an instance id, the
        naming of k8s.io/dynamic-resource-allocation/kubeletplugin's rolling updates)."""
        return f"{self.plugin_dir}/dra{self._instance_part}.sock"

    @property
    def registration_socket(self) -> str:
        """The plugin-registration socket the kubelet watches for (``<driver>-<instance>-reg.sock``)."""
        return f"{self.kubelet_root}/plugins_registry/{self.driver_name}{self._instance_part}-reg.sock"

    @property
    def _instance_part(self) -> str:
        # The first INSTANCE_SOCKET_CHARS characters only: a unix socket path has 107 bytes, and
        # the kubelet's root dir may be long. Two pods of one DaemonSet on one node with the same
        # 8 random hex digits of their UIDs: one chance in 4 billion.
        return f"-{self.instance_id[:INSTANCE_SOCKET_CHARS]}" if self.instance_id else ""

    @property
    def list_numa_attribute(self) -> bool:
        """Whether ``resource.kubernetes.io/numaNode`` is published in its list form."""
        return self.feature_gates.get("DRAListTypeAttributes", False)

    @property
    def host_sysfs(self) -> bool:
        """True when discovery reads the host's own /sys, so netlink facts apply to it."""
        return self.sysfs_root.rstrip("/") in ("", "/sys")


def default(name: str) -> object:
    """The default of :class:`DriverConfig` field ``name`` (the CLI's flag defaults)."""
    for f in fields(DriverConfig):
        if f.name == name:
            return f.default_factory() if callable(f.default_factory) else f.default
    raise KeyError(name)


def config_from_args(args: argparse.Namespace) -> DriverConfig:
    """The daemon configuration from ``dranet run`` arguments (each flag's dest is a field name)."""
    values = {f.name: getattr(args, f.name) for f in fields(DriverConfig) if hasattr(args, f.name)}
    values["exclude_interfaces"] = [i for i in args.exclude_interfaces.split(",") if i]
    return DriverConfig(**values)
