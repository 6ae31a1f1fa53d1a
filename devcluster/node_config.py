"""Configuration files of the real node: containerd (config v3), kubelet, CNI (pure functions).

Facts from /work/shared/reference/real-cluster.md §4 as verified on this VM: cgroupfs driver
(PID 1 is not systemd), containerd 2.x config version 3 with NRI and CDI on, the sandbox image
pinned to a locally imported name, a bridge + host-local CNI network without IP masquerading
(no iptables rules on the host). The node IP is the CNI bridge's gateway address (the cluster
creates the bridge before anything starts): the kubelet serves there, the apiserver listens
there, and pods reach the apiserver there, without kube-proxy and without the host's uplink.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path

import yaml

from devcluster.components import NodeBinaries
from devcluster.images import PAUSE_IMAGE
from devcluster.node_layout import NodeLayout


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # TOML basic strings share JSON's escaping


def containerd_config(layout: NodeLayout, binaries: NodeBinaries) -> str:
    """containerd 2.2 config (version 3): every path under the layout, NRI and CDI enabled."""
    q = _toml_str
    return f"""version = 3
root = {q(layout.containerd_root)}
state = {q(layout.containerd_state)}

[grpc]
  address = {q(layout.containerd_socket)}

[ttrpc]
  address = {q(str(layout.containerd_socket) + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = {q(layout.base / "containerd" / "opt")}

  # NRI is on by default in containerd 2.x; the socket is the layout's, not /var/run/nri.
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    disable_connections = false
    socket_path = {q(layout.nri_socket)}
    plugin_path = {q(layout.base / "nri" / "plugins")}
    plugin_config_path = {q(layout.base / "nri" / "conf.d")}
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "2s"

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(PAUSE_IMAGE)}

  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    cdi_spec_dirs = [{q(layout.cdi_dir)}]
    # Pod network namespaces below this cluster's state dir, not the host-wide /var/run/netns.
    netns_mounts_under_state_dir = true
    # This VM's root lacks CAP_SYS_RESOURCE, so nobody may lower an oom_score_adj (the kubelet
    # asks -998 for sandboxes, -997 for critical pods): clamp at containerd's own value (0).
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {q(binaries.runc)}
          Root = {q(layout.runc_root)}
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{q(binaries.cni_bin_dir)}]
      conf_dir = {q(layout.cni_conf_dir)}
      max_conf_num = 1
      # lo is brought up by containerd itself: no loopback plugin, no host-wide CNI cache entry.
      use_internal_loopback = true

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""


def cni_conflist(layout: NodeLayout) -> str:
    """bridge + host-local (+ loopback inside containerd): no masquerade, so no iptables rules."""
    net = ipaddress.ip_network(layout.pod_subnet)
    gateway = layout.node_ip
    conf = {
        "cniVersion": "1.0.0",
        "name": layout.cni_network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": layout.cni_bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_ipam_dir),
                    "ranges": [[{"subnet": str(net), "gateway": gateway}]],
                },
            },
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(
    layout: NodeLayout, port: int, healthz_port: int, feature_gates: Mapping[str, bool] | None = None
) -> str:
    """KubeletConfiguration for a single dev node on this VM (cgroupfs, cgroup v1, loopback)."""
    cfg: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "failSwapOn": False,
        # No CAP_SYS_RESOURCE here: the kubelet cannot lower its own score to -999.
        "oomScoreAdj": 0,
        # The node IP: the CNI bridge's gateway address, which this cluster owns.
        "address": layout.node_ip,
        "port": port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # Host firewall stays untouched: no KUBE-* chains.
        "makeIPTablesUtilChains": False,
        # The kubelet reacts to pod changes quickly (benchmarks and churn).
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "5s",
        "maxPods": 110,
        "containerLogMaxSize": "1Mi",
        "containerLogMaxFiles": 2,
        # Container logs below the cluster's base, not the host-wide /var/log/pods.
        "podLogsDir": str(layout.base / "pod-logs"),
    }
    if feature_gates:
        cfg["featureGates"] = dict(feature_gates)
    return yaml.safe_dump(cfg, sort_keys=False)


def write_node_configs(
    layout: NodeLayout,
    binaries: NodeBinaries,
    kubelet_port: int,
    healthz_port: int,
    feature_gates: Mapping[str, bool] | None = None,
) -> None:
    """Write containerd's config, the CNI conflist and the kubelet config into the layout."""
    for d in (
        layout.containerd_config.parent,
        layout.cni_conf_dir,
        layout.cni_ipam_dir,
        layout.cdi_dir,
        layout.nri_socket.parent,
        layout.runc_root,
        layout.kubelet_root,
    ):
        d.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(containerd_config(layout, binaries))
    (layout.cni_conf_dir / "10-dranet.conflist").write_text(cni_conflist(layout))
    layout.kubelet_config.write_text(kubelet_config(layout, kubelet_port, healthz_port, feature_gates))
