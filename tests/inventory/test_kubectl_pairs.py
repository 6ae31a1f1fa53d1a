"""``kubectl dranet topology`` / ``templates --pair`` from ResourceSlices: the slices the driver and
the GPU double would publish for a fixture node, served by a stand-in API client.

Slices carry roots but no PCIe switches, so ``--pair pcie-root`` works from them and gives the same
pairs as the node's own ``dranet templates``; ``--pair pcie-switch`` is refused with the way to get it.
A ConnectX-8 NIC pairs through the Data Direct root it publishes.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.doubles import gpu_double
from driver.dra.slices import build_slices
from driver.inventory.discovery import Scanner
from driver.inventory.topology import PAIR_MODES, pair_templates, read_topology
from driver.kubectl import cluster
from driver.kubectl.main import build_parser, cmd_templates, cmd_topology
from driver.kubectl.topology import topology_of

NODE = "node-a"


class SliceServer:
    """The two reads the commands make: the node's slices and every namespace's claims (none)."""

    def __init__(self, slices: list[dict[str, Any]]) -> None:
        self.slices = slices

    def list_resource_slice(self, selector: str = "") -> dict[str, Any]:
        return {"items": self.slices}

    def list_resource_claim_for_all_namespaces(self, cont: str | None = None) -> dict[str, Any]:
        return {"items": [], "metadata": {}}


def _server(root: Path, exclude: tuple[str, ...] = ()) -> SliceServer:
    devices = Scanner(str(root), exclude_interfaces=exclude, pci_ids_paths=(), replay=False).scan()
    slices = build_slices(devices, "dra.net", NODE, "uid-1")
    slices.append(gpu_double.gpu_slice(NODE, "uid-1", gpu_double.fixture_gpus(str(root))))
    return SliceServer(slices)


def _args(*argv: str) -> argparse.Namespace:
    args = build_parser({}).parse_args(list(argv))
    args.namespace = "default"
    args.gpu_driver = cluster.GPU_DRIVERS
    return args


def _run(server: SliceServer, command: Any, *argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return command(server, _args(*argv), out), out.getvalue()


@pytest.mark.parametrize("topology", ["dgx-h100", "gb300"])
def test_pcie_root_templates_from_slices_pair_as_the_node_does(sysfs_trees: Any, topology: str) -> None:
    root = sysfs_trees.get(topology)
    server = _server(root)
    code, out = _run(server, cmd_templates, "templates", "--node", NODE, "--pair", "pcie-root")
    assert code == 0, out
    (doc,) = list(yaml.safe_load_all(out))
    local = read_topology(str(root))
    gpus = len(local.gpus)
    assert doc["metadata"]["name"] == f"{gpus}gpu-{gpus}nic-pcie-root"  # default: every GPU that pairs
    (expected,) = pair_templates(local, gpus, "pcie-root")
    comments = [line for line in out.splitlines() if line.startswith("#   gpu-")]
    # The same GPU/NIC pairs as the node's own view; the path is a root, not a class (no switches in slices).
    got = [[line.split()[i] for i in (2, 5)] for line in comments]
    assert got == [[p.gpu.pci_bus_id, p.nic.pci_bus_id] for p in expected.pairs]
    assert all(f"same root {p.nic.pcie_root}" in line for line, p in zip(comments, expected.pairs, strict=True))
    assert len(doc["spec"]["spec"]["devices"]["constraints"]) == gpus


def test_pcie_switch_from_slices_is_refused_with_the_way_to_get_it(
    sysfs_trees: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run(
        _server(sysfs_trees.get("dgx-h100")), cmd_templates, "templates", "--node", NODE, "--pair", "pcie-switch"
    )
    assert code == 2 and out == ""
    err = capsys.readouterr().err
    assert "ResourceSlices do not carry" in err and "dranet templates --pair pcie-switch" in err


def test_azure_slices_cannot_pair(sysfs_trees: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = _server(sysfs_trees.get("nd-h100-v5"), ("eth0",))
    code, out = _run(server, cmd_templates, "templates", "--node", NODE, "--pair", "pcie-root", "--gpus", "4")
    assert code == 1 and out == ""
    err = capsys.readouterr().err
    assert f"node {NODE}: no RDMA NIC shares a PCIe root with GPU 0001:00:00.0" in err and "Azure ND" in err
    # Without --pair, the NUMA-aligned templates as before.
    assert _run(server, cmd_templates, "templates", "--node", NODE)[0] == 0


def test_topology_json_from_slices_has_the_pairs(sysfs_trees: Any) -> None:
    server = _server(sysfs_trees.get("gb300"))
    code, out = _run(server, cmd_topology, "topology", "--node", NODE, "-o", "json")
    assert code == 0
    doc = yaml.safe_load(out)
    # gb300: each GPU's NIC is found through the root its Data Direct function gives it.
    assert {p["gpuPciBusID"]: p["nicPciBusID"] for p in doc["pairs"]} == {
        "0008:06:00.0": "0000:01:00.0",
        "0009:06:00.0": "0002:01:00.0",
        "0018:06:00.0": "0010:01:00.0",
        "0019:06:00.0": "0012:01:00.0",
    }
    assert {p["path"] for p in doc["pairs"]} == {"PHB"}  # same root; switches unknown from slices
    view = cluster.node_views(cluster.read_slices(server, NODE), cluster.read_allocations(server, "default"))[0]  # type: ignore[arg-type]
    assert len(topology_of(view).pairs()) == 4


def test_the_plugin_knows_the_pair_modes() -> None:
    sub = next(a for a in build_parser({})._actions if isinstance(a, argparse._SubParsersAction))
    pair = next(a for a in sub.choices["templates"]._actions if a.dest == "pair")
    assert tuple(pair.choices or ()) == PAIR_MODES and pair.default is None
