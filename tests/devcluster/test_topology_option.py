"""``devcluster up --topology NAME``: the machine every node is. The default stays ND H100 v5 (same
NICs, node names and GPU slice as before); another topology brings its own IPoIB NICs onto the
rails, its node names and, through the GPU double, its GPUs with their ``pciBusID`` and ``pcieRoot``.
Nothing here starts a cluster."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.__main__ import main as devcluster_main
from devcluster.cluster.node_daemons import build_fixture
from devcluster.cluster.node_layout import (
    DEFAULT_TOPOLOGY,
    IN_NODE,
    MAX_NODES,
    ND_H100_NICS,
    LayoutError,
    NodeLayout,
    rail_nics,
)
from devcluster.doubles import gpu_double, gpu_plugin
from devcluster.doubles.sysfs_fixture import load_topology
from driver.inventory.discovery import Scanner


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A base short enough for the nodes' unix socket paths."""
    with tempfile.TemporaryDirectory(prefix="dc", dir="/tmp") as d:
        yield Path(d)


def test_the_default_is_nd_h100_v5_as_before() -> None:
    layout = NodeLayout()
    assert layout.topology == DEFAULT_TOPOLOGY == "nd-h100-v5"
    assert layout.nics == ND_H100_NICS == tuple(f"ib{i}" for i in range(8))
    assert [n.name for n in layout.all_nodes] == ["nd-h100-v5-0", "nd-h100-v5-1"]
    assert NodeLayout(nic_prefix="rail").nics[0] == "rail0"
    # The shortcut names exactly the IPoIB netdevs the YAML has, in its order.
    topo = load_topology(DEFAULT_TOPOLOGY)
    assert ND_H100_NICS == tuple(
        n["name"] for d in topo["pci"] for n in d.get("net") or [] if n["name"].startswith("ib")
    )


def test_dgx_h100_brings_its_nics_and_node_names() -> None:
    layout = NodeLayout(topology="dgx-h100")
    assert (
        layout.nics
        == rail_nics("dgx-h100")
        == (
            "ibp24s0",
            "ibp64s0",
            "ibp79s0",
            "ibp94s0",
            "ibp154s0",
            "ibp192s0",
            "ibp206s0",
            "ibp220s0",
        )
    )
    assert layout.node_name == "dgx-h100-0" and layout.node(1).name == "dgx-h100-1"
    assert NodeLayout(topology="dgx-h100", nic_prefix="r").nics[0] == "rp24s0"
    assert NodeLayout(topology="dgx-h100", node_prefix="gpu").node_name == "gpu-0"
    # Every fabric port name fits (IFNAMSIZ), up to the last node.
    assert all(len(layout.node(MAX_NODES - 1).peer(n)) <= 15 for n in layout.nics)
    # A layout derived from another (as the e2e does) re-reads its topology.
    moved = dataclasses.replace(NodeLayout(name="abc"), topology="dgx-h100", node_prefix="")
    assert moved.nics == layout.nics and moved.node_name == "dgx-h100-0" and moved.name == "abc"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topology": "no-such-machine"}, "topology: topology 'no-such-machine': no such file"),
        ({"topology": "vm-no-numa"}, "topology: 'vm-no-numa' has no InfiniBand netdev (ib*)"),
        (
            {"topology": "dgx-h100", "nic_prefix": "abcdefgh"},
            "nic_prefix: 'abcdefgh' makes NIC 'abcdefghp154s0' too long",
        ),
        ({"topology": "dgx-h100", "node_prefix": "Not_A_Label"}, "node_prefix: 'Not_A_Label' must be a DNS label"),
    ],
)
def test_a_topology_that_cannot_be_used_is_refused_naming_the_field(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(LayoutError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        NodeLayout(**kwargs)  # type: ignore[arg-type]


def test_the_cli_takes_the_topology(capsys: pytest.CaptureFixture[str], short_root: Path) -> None:
    assert devcluster_main(["status", "--topology", "vm-no-numa"]) == 2
    assert "error: topology: 'vm-no-numa' has no InfiniBand netdev" in capsys.readouterr().err
    # A usable one gets as far as asking whether such a cluster runs (it does not).
    code = devcluster_main(["status", "--name", "zq", "--root", str(short_root), "--topology", "dgx-h100"])
    assert code in (1, 2) and "topology" not in capsys.readouterr().err


@pytest.mark.parametrize("topology", ["dgx-h100", "gb300", DEFAULT_TOPOLOGY])
def test_each_nodes_fixture_names_the_nics_the_rails_cable(short_root: Path, topology: str) -> None:
    """The driver moves the netdev the fixture names; the fabric creates a veth of that name: the
    two lists must be the same, on every node and with any prefix."""
    layout = NodeLayout(name="t", root=short_root, topology=topology, nic_prefix="ib" if topology != "gb300" else "xy")
    for node in layout.all_nodes:
        root = build_fixture(node)
        published = {
            d.host.ifname or "" for d in Scanner(str(root), pci_ids_paths=(), replay=False).scan() if d.host.rdma_device
        }
        assert set(layout.nics) <= published, (node.name, sorted(published))


def test_the_gpu_double_publishes_the_fixtures_gpus(sysfs_trees: Any, short_root: Path) -> None:
    nd = gpu_double.fixture_gpus(str(sysfs_trees.get(DEFAULT_TOPOLOGY)))
    assert [g.to_api() for g in nd] == [g.to_api() for g in gpu_double.nd_h100_v5_gpus()]  # unchanged
    assert gpu_double.gpu_slice("n", "u")["spec"]["devices"] == [g.to_api() for g in nd]
    dgx_root = sysfs_trees.get("dgx-h100")
    dgx = gpu_double.fixture_gpus(str(dgx_root))
    nic_roots = {
        d.attributes["resource.kubernetes.io/pcieRoot"]
        for d in Scanner(str(dgx_root), pci_ids_paths=(), replay=False).scan()
        if d.host.ifname and d.host.ifname.startswith("ib")
    }
    api = [g.to_api() for g in dgx]
    assert [a["name"] for a in api] == [f"gpu-{i}" for i in range(8)]
    roots = [a["attributes"]["resource.kubernetes.io/pcieRoot"]["string"] for a in api]
    assert set(roots) == nic_roots and len(set(roots)) == 8  # each GPU's root holds one IB NIC
    assert api[0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"] == "0000:1b:00.0"
    assert api[0]["attributes"]["gpu.nvidia.com/productName"]["string"] == "NVIDIA H100 80GB HBM3"
    assert gpu_double.fixture_gpus(str(short_root / "none")) == gpu_double.nd_h100_v5_gpus()  # no tree: ND's


def test_the_gpu_plugin_reads_the_nodes_own_fixture_by_default() -> None:
    """The plugin runs in the node's mount namespace, where the node's fixture is at InNode.fixture_sysfs;
    node_daemons starts it without --sysfs-root."""
    cfg = gpu_plugin.GpuPluginConfig("n", Path("/k"), Path("/c"))
    assert [g.to_api() for g in cfg.gpus] == [g.to_api() for g in gpu_double.nd_h100_v5_gpus()]
    assert IN_NODE.fixture_sysfs == gpu_plugin.NODE_FIXTURE_SYSFS == "/run/dranet-fixture/sys"
    args = gpu_plugin.parse_args(["--kubeconfig", "k", "--node-name", "n", "--kubelet-root", "/k", "--cdi-dir", "/c"])
    assert args.sysfs_root == IN_NODE.fixture_sysfs
