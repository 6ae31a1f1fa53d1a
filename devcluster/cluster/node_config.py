"""Configuration files of a real node: containerd (config v3), kubelet, CNI (pure functions).

Facts from /work/shared/reference/real-cluster.md §4 as verified on this VM: cgroupfs driver
(PID 1 is not systemd), containerd 2.x config version 3 with NRI on (CDI is always on), the
sandbox image pinned to a locally imported name, a bridge + host-local CNI network without IP
masquerading (no iptables rules anywhere). Every path inside a node is the standard one
(`devcluster.cluster.node_layout.InNode`): the node's mount namespace maps them to its own directory.
The kubelet serves on the node IP (``eth0``); pods resolve names through the cluster DNS at the
cluster network's gateway.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import yaml

from devcluster.builders.components import NodeBinaries
from devcluster.builders.images import PAUSE_IMAGE
from devcluster.cluster.node_layout import IN_NODE, NodeSpec
from driver.nri.step_clock import RUNTIME_CALL_TIMEOUT_S

CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250  # inside the node's network namespace: no other kubelet there
KUBELET_HEALTHZ_PORT = 10248


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # TOML basic strings share JSON's escaping


NRI_REQUEST_TIMEOUT_S = int(RUNTIME_CALL_TIMEOUT_S)
"""What a node gives the driver's hooks: containerd's own default time for one NRI plugin call."""


def containerd_config(
    node: NodeSpec, binaries: NodeBinaries, nri_request_timeout_s: int = NRI_REQUEST_TIMEOUT_S
) -> str:
    """containerd 2.x config (version 3): standard in-node paths, NRI on, runc, the node's CNI."""
    q = _toml_str
    return f"""version = 3
root = {q(node.containerd_root / "root")}
state = {q(IN_NODE.containerd_state)}

[grpc]
  address = {q(IN_NODE.containerd_socket)}

[ttrpc]
  address = {q(IN_NODE.containerd_socket + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = {q(node.containerd_root / "opt")}

  # NRI is on by default in containerd 2.x; its socket at the standard path (the chart's default).
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    disable_connections = false
    socket_path = {q(IN_NODE.nri_socket)}
    plugin_path = {q(node.containerd_root / "nri" / "plugins")}
    plugin_config_path = {q(node.containerd_root / "nri" / "conf.d")}
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "{nri_request_timeout_s}s"

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(PAUSE_IMAGE)}

  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = [{q(IN_NODE.cdi_dir)}]
    # This VM's root lacks CAP_SYS_RESOURCE, so nobody may lower an oom_score_adj (the kubelet
    # asks -998 for sandboxes, -997 for critical pods): clamp at containerd's own value (0).
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {q(binaries.runc)}
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{q(binaries.cni_bin_dir)}]
      conf_dir = {q(node.cni_conf_dir)}
      max_conf_num = 1
      # lo is brought up by containerd itself: no loopback plugin.
      use_internal_loopback = true

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""


def cni_conflist(node: NodeSpec) -> str:
    """bridge + host-local on the node's pod /24: no masquerade, so no iptables rules."""
    conf = {
        "cniVersion": "1.0.0",
        "name": "dranet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                # Pods reach other nodes' pods, the apiserver and the cluster DNS through the node.
                "isDefaultGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    # One range set per IP version: a dual-stack pod gets one address of each.
                    "ranges": [
                        [{"subnet": node.pod_subnet_of(v), "gateway": node.pod_gateway_of(v)}]
                        for v in node.layout.versions
                    ],
                },
            },
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def resolv_conf(node: NodeSpec) -> str:
    """The node's resolver: the cluster DNS (pods with ``dnsPolicy: Default`` get it too)."""
    return "".join(f"nameserver {gw}\n" for gw in node.layout.gateways)


def kubelet_config(
    node: NodeSpec, fail_cgroup_v1: bool | None = None, feature_gates: Mapping[str, bool] | None = None
) -> str:
    """KubeletConfiguration of one dev node on this VM (cgroupfs, cgroup v1, its own netns)."""
    cfg: dict[str, object] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "failSwapOn": False,
        # No CAP_SYS_RESOURCE here: the kubelet cannot lower its own score to -999.
        "oomScoreAdj": 0,
        # One address, so a dual-stack kubelet listens on both families ("::" is v4-mapped too).
        "address": node.ip if len(node.ips) == 1 else "::",
        "port": KUBELET_PORT,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "readOnlyPort": 0,
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": node.layout.gateways,
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node.resolv_conf),
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # No KUBE-* chains, not even in the node's own network namespace.
        "makeIPTablesUtilChains": False,
        # The kubelet reacts to pod changes quickly (benchmarks and churn).
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "nodeStatusUpdateFrequency": "5s",
        "maxPods": 110,
        "containerLogMaxSize": "1Mi",
        "containerLogMaxFiles": 2,
    }
    if fail_cgroup_v1 is not None:
        # From 1.35 the kubelet refuses cgroup v1 unless told otherwise; this machine has no v2.
        cfg["failCgroupV1"] = fail_cgroup_v1
    if feature_gates:
        cfg["featureGates"] = dict(feature_gates)
    return yaml.safe_dump(cfg, sort_keys=False)


def write_node_configs(
    node: NodeSpec,
    binaries: NodeBinaries,
    fail_cgroup_v1: bool | None = None,
    feature_gates: Mapping[str, bool] | None = None,
    nri_request_timeout_s: int = NRI_REQUEST_TIMEOUT_S,
) -> None:
    """Write containerd's config, the CNI conflist, the resolver and the kubelet config."""
    node.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(containerd_config(node, binaries, nri_request_timeout_s))
    (node.cni_conf_dir / "10-dranet.conflist").write_text(cni_conflist(node))
    node.resolv_conf.write_text(resolv_conf(node))
    node.kubelet_config.write_text(kubelet_config(node, fail_cgroup_v1, feature_gates))
