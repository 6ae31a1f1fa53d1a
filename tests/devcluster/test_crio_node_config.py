"""A CRI-O node's configuration (no root, nothing started): where the kubelet, CRI-O and the
chart meet, and that nothing of a node's CRI-O lands outside the node's own directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devcluster.builders import crio
from devcluster.builders.components import NodeBinaries
from devcluster.cluster import crio_node
from devcluster.cluster.cluster_state import ClusterState
from devcluster.cluster.lifecycle import dev_values
from devcluster.cluster.node_config import kubelet_config
from devcluster.cluster.node_layout import LayoutError, NodeLayout

ROOT = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((ROOT / "charts" / "dranet" / "values.yaml").read_text())
_NAMES = ("kubelet", "kubectl", "containerd", "shim", "ctr", "runc", "cni")
BINARIES = NodeBinaries(*(Path("/opt/x") / n for n in _NAMES))


def _layout(runtime: str) -> NodeLayout:
    return NodeLayout(name="t", root=Path("/var/lib/dranet-test"), nodes=2, runtime=runtime)


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_an_unknown_runtime_is_refused_naming_the_field() -> None:
    with pytest.raises(LayoutError, match="runtime: 'cri-o' must be one of containerd, crio"):
        _layout("cri-o")


@pytest.mark.parametrize(
    "runtime,socket", [("containerd", "/run/containerd/containerd.sock"), ("crio", "/run/crio/crio.sock")]
)
def test_the_kubelet_talks_to_the_nodes_runtime(runtime: str, socket: str) -> None:
    cfg = yaml.safe_load(kubelet_config(_layout(runtime).node(1)))
    assert cfg["containerRuntimeEndpoint"] == f"unix://{socket}"


def test_crio_serves_nri_and_pins_netns_where_the_chart_looks_by_default() -> None:
    cmd = crio.crio_command(Path("/opt/crio/bin"), crio_node.paths(_layout("crio").node(1)))
    assert _flag(cmd, "--nri-listen") == VALUES["nri"]["socket"]
    # CRI-O pins a pod's network namespace at <namespaces_dir>/netns/<id>.
    assert str(Path(_flag(cmd, "--namespaces-dir")) / "netns") == VALUES["netnsDir"]
    assert _flag(cmd, "--listen") == _layout("crio").node(1).cri_socket
    assert "--enable-nri" in cmd and _flag(cmd, "--cgroup-manager") == "cgroupfs"


def test_every_path_of_a_nodes_crio_is_the_nodes_own() -> None:
    node = _layout("crio").node(1)
    host = crio_node.host_paths(node)
    for name, path in vars(host).items():
        assert node.dir in Path(path).parents, f"{name}: {path} is outside {node.dir}"
    assert host.nri_socket == node.run_dir / "nri" / "nri.sock"
    assert host.namespaces_dir == node.run_dir
    # Another node's CRI-O shares nothing with this one.
    other = crio_node.host_paths(_layout("crio").node(0))
    assert not set(vars(host).values()) & set(vars(other).values())


def test_skopeo_names_the_store_crio_runs_with() -> None:
    paths = crio_node.paths(_layout("crio").node(0))
    ref = paths.storage_ref("localhost/x:1", crio_node.STORAGE_DRIVER)
    assert ref == f"containers-storage:[overlay@{paths.storage_root}+{paths.storage_run}]localhost/x:1"
    full = crio.crio_command(Path("/b"), paths, crio_node.options(BINARIES))
    assert (_flag(full, "--root"), _flag(full, "--runroot")) == (str(paths.storage_root), str(paths.storage_run))
    assert _flag(full, "--storage-driver") == crio_node.STORAGE_DRIVER
    assert _flag(full, "--pause-image") == "localhost/dranet/pause:dev" and _flag(full, "--pause-command") == ""


@pytest.mark.parametrize("runtime", ["containerd", "crio"])
def test_dev_values_lower_no_oom_score_on_crio(runtime: str) -> None:
    st = ClusterState(name="t", server="https://10.0.0.1:6443")
    values = dev_values(_layout(runtime), st, "localhost/dranet/dranet:dev")
    if runtime == "crio":
        assert values["priorityClassName"] == ""
    else:
        assert "priorityClassName" not in values  # the chart's own (system-node-critical)
