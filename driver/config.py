"""The daemon's configuration (`dranet run` flags), one dataclass passed to every component."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_FILTER = '!has(device.attributes["dra.net"].type) || device.attributes["dra.net"].type != "veth"'
"""Admin filter (CEL, DeviceClass syntax): drop veth by default like the Go driver."""


@dataclass
class DriverConfig:
    """Settings of a running node driver. CLI flags map 1:1 onto these fields."""

    node_name: str
    driver_name: str = "dra.net"
    sysfs_root: str = "/sys"
    kubelet_root: str = "/var/lib/kubelet"
    state_dir: str = "/var/lib/dranet"  # prepared claims (disk: survives reboots)
    runtime_dir: str = "/run/dranet"  # pod network state (tmpfs: cleared by a reboot, like the netns)
    host_netns: str = "/proc/self/ns/net"  # opened at start, while the daemon is in the host netns
    nri_socket: str = "/var/run/nri/nri.sock"
    nri_enabled: bool = True
    kubeconfig: str | None = None  # None: in-cluster config
    filter: str = DEFAULT_FILTER  # empty string disables filtering
    # Treated like the default-route uplink: never published, nor anything enslaved to them.
    exclude_interfaces: list[str] = field(default_factory=list)
    bind_address: str = ":9177"  # /healthz and /metrics
    publish_interval: float = 2.0  # coalescing window for ResourceSlice writes (s)
    resync_interval: float = 60.0  # periodic full rescan (s)
    log_level: str = "info"
    log_format: str = "json"  # json | text

    @property
    def plugin_dir(self) -> str:
        """Directory of the DRA socket (must be the same path inside and outside the container)."""
        return f"{self.kubelet_root}/plugins/{self.driver_name}"

    @property
    def dra_socket(self) -> str:
        return f"{self.plugin_dir}/dra.sock"

    @property
    def registration_socket(self) -> str:
        return f"{self.kubelet_root}/plugins_registry/{self.driver_name}-reg.sock"

    @property
    def host_sysfs(self) -> bool:
        """True when discovery reads the host's own /sys, so netlink facts apply to it."""
        return self.sysfs_root.rstrip("/") in ("", "/sys")
