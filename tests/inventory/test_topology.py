"""``dranet topology`` / ``dranet templates`` on sysfs trees shaped like real nodes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.cli import main
from driver.inventory.topology import (
    NODE,
    PHB,
    PIX,
    PXB,
    SYS,
    UNKNOWN,
    NoPairingError,
    PciEndpoint,
    aligned_choices,
    pair_templates,
    read_topology,
    render_template,
)

# Azure ND96isr H100 v5 (shared/reference/topologies.md): NUMA, GPU, NIC, RDMA device.
ND_H100_V5 = [
    (0, "0001:00:00.0", "0101:00:00.0", "mlx5_0"),
    (0, "0002:00:00.0", "0102:00:00.0", "mlx5_1"),
    (0, "0003:00:00.0", "0103:00:00.0", "mlx5_2"),
    (0, "0008:00:00.0", "0104:00:00.0", "mlx5_3"),
    (1, "0009:00:00.0", "0105:00:00.0", "mlx5_4"),
    (1, "000a:00:00.0", "0106:00:00.0", "mlx5_5"),
    (1, "000b:00:00.0", "0107:00:00.0", "mlx5_6"),
    (1, "000c:00:00.0", "0108:00:00.0", "mlx5_7"),
]


@dataclass
class TreeBuilder:
    """Writes a minimal kernel-shaped sysfs tree (real dirs under devices/, symlinks elsewhere).

    Only for PCIe switch hierarchies, which none of devcluster/doubles/topologies/ has; real node
    shapes come from the shared fixtures (harness/sysfs.py).
    """

    root: Path

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, link.parent), link)

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")

    def pci(
        self,
        parents: list[str],
        bdf: str,
        cls: str,
        vendor: str,
        numa: int,
        driver: str | None = None,
        ibdev: str | None = None,
        netdev: str | None = None,
    ) -> Path:
        real = self.root.joinpath("devices", *parents, bdf)
        for name, value in {
            "class": cls,
            "vendor": vendor,
            "device": "0x1021",
            "subsystem_device": "0x0023",
            "numa_node": str(numa),
        }.items():
            self._write(real / name, value)
        self._link(self.root / "bus/pci/devices" / bdf, real)
        if driver:
            (self.root / "bus/pci/drivers" / driver).mkdir(parents=True, exist_ok=True)
            self._link(real / "driver", self.root / "bus/pci/drivers" / driver)
        if ibdev:
            ib = real / "infiniband" / ibdev
            self._write(ib / "ports/1/link_layer", "InfiniBand")
            self._write(ib / "ports/1/rate", "400 Gb/sec (4X NDR)")
            self._write(ib / "ports/1/state", "4: ACTIVE")
            self._link(ib / "device", real)
            self._link(self.root / "class/infiniband" / ibdev, ib)
        if netdev:
            net = real / "net" / netdev
            for name, value in {
                "type": "32",
                "address": "00:00:01:00:fe:80:00:00:00:00:00:00:00:00:00:00",
                "mtu": "2044",
                "operstate": "up",
                "ifindex": "5",
            }.items():
                self._write(net / name, value)
            self._link(net / "device", real)
            self._link(self.root / "class/net" / netdev, net)
        return real

    def numa(self, cpulists: dict[int, str]) -> None:
        for node, cpus in cpulists.items():
            self._write(self.root / f"devices/system/node/node{node}/cpulist", cpus)
        self._write(self.root / "devices/system/node/online", f"0-{max(cpulists)}")


def test_nd_h100_v5_matrix(nd_h100_sysfs: Path) -> None:
    # eth0 is the uplink; its accelerated-networking VF (mlx5_an0) is enslaved to it.
    topo = read_topology(str(nd_h100_sysfs), exclude_interfaces=["eth0"])
    assert [g.pci_bus_id for g in topo.gpus] == [g for _, g, _, _ in ND_H100_V5]
    assert [n.pci_bus_id for n in topo.nics] == [n for _, _, n, _ in ND_H100_V5]
    assert [n.rdma_device for n in topo.nics] == [r for _, _, _, r in ND_H100_V5]
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    gpu0 = by_bus["0001:00:00.0"]
    assert topo.relation(gpu0, by_bus["0101:00:00.0"]) == NODE
    assert topo.relation(gpu0, by_bus["0105:00:00.0"]) == SYS
    assert topo.relation(gpu0, gpu0) == "X"
    assert by_bus["0101:00:00.0"].rdma_device == "mlx5_0"
    assert topo.numa_cpulists == {0: "0-47", 1: "48-95"}


def test_topology_json_output_shape(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "text", "topology", "--sysfs-root", str(nd_h100_sysfs), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"gpus", "nics", "matrix", "pairs", "numaNodes", "legend"}
    # Without netlink (a fixture) the uplink's VF is listed too, as the ninth NIC.
    assert len(doc["gpus"]) == 8 and len(doc["nics"]) == 9
    assert doc["nics"][8]["rdma_device"] == "mlx5_an0"
    gpu0 = doc["gpus"][0]
    assert gpu0["pci_bus_id"] == "0001:00:00.0" and gpu0["numa_node"] == 0
    assert gpu0["pcie_root"] == "pci0001:00"
    nic4 = doc["nics"][4]
    assert nic4["pci_bus_id"] == "0105:00:00.0" and nic4["rdma_device"] == "mlx5_4"
    assert doc["matrix"]["GPU0"]["NIC0"] == "NODE"
    assert doc["matrix"]["GPU0"]["NIC4"] == "SYS"
    assert doc["matrix"]["NIC4"]["GPU0"] == "SYS"
    assert doc["numaNodes"] == {"0": {"cpulist": "0-47"}, "1": {"cpulist": "48-95"}}
    assert "SYS" in doc["legend"] and "NODE" in doc["legend"]


def test_topology_table_output(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "text", "topology", "--sysfs-root", str(nd_h100_sysfs)]) == 0
    out = capsys.readouterr().out
    header, gpu0_row = out.splitlines()[0], out.splitlines()[1]
    assert header.split()[:2] == ["GPU0", "GPU1"] and header.rstrip().endswith("NUMA Affinity")
    # GPU0 row: X to itself, NODE to GPU1..3, SYS to GPU4..7, then NICs, then NUMA 0.
    assert gpu0_row.split() == [
        "GPU0",
        "X",
        "NODE",
        "NODE",
        "NODE",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
        "NODE",
        "NODE",
        "NODE",
        "NODE",
        "SYS",
        "SYS",
        "SYS",
        "SYS",
        "NODE",
        "0",
    ]
    assert "node1: CPUs 48-95" in out
    assert "mlx5_0" in out


def test_templates_emit_one_per_numa_node(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "text", "templates", "--gpus", "4", "--sysfs-root", str(nd_h100_sysfs)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == ["4gpu-4nic-numa0", "4gpu-4nic-numa1"]
    numa0 = docs[0]
    assert numa0["apiVersion"] == "resource.k8s.io/v1" and numa0["kind"] == "ResourceClaimTemplate"
    gpu_req, nic_req = numa0["spec"]["spec"]["devices"]["requests"]
    assert gpu_req["name"] == "gpu" and gpu_req["exactly"]["count"] == 4
    assert gpu_req["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert gpu_req["exactly"]["selectors"][0]["cel"]["expression"] == (
        'device.attributes["resource.kubernetes.io"]["pciBusID"] in '
        '["0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0"]'
    )
    assert nic_req["exactly"] == {
        "deviceClassName": "dranet.net",
        "count": 4,
        "selectors": [
            {
                "cel": {
                    "expression": 'device.attributes["dra.net"]["rdma"] == true && '
                    'device.attributes["dra.net"]["numaNode"] == 0'
                }
            }
        ],
    }
    assert (
        '"0009:00:00.0"'
        in docs[1]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    )


def test_templates_error_when_no_numa_node_fits(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "text", "templates", "--gpus", "5", "--sysfs-root", str(nd_h100_sysfs)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no NUMA node has 5 GPUs and 5 RDMA NICs" in captured.err
    assert "NUMA 0: 4 GPUs, 5 RDMA NICs" in captured.err  # 4 IB + the uplink's VF (no netlink here)
    assert "NUMA 1: 4 GPUs, 4 RDMA NICs" in captured.err


def test_pcie_switch_relations(tmp_path: Path) -> None:
    # Bare-metal shape: one root complex with a PCIe switch holding GPU0 and NIC0 (PIX), a GPU
    # behind a second switch level (PXB), a GPU on its own root port (PHB), a NIC on another
    # root complex of the same NUMA node (NODE), and a NIC whose NUMA node is unknown.
    tree = TreeBuilder(tmp_path / "sys")
    sw = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    tree.pci(sw + ["0000:02:00.0"], "0000:03:00.0", "0x030200", "0x10de", 0, driver="nvidia")
    tree.pci(
        sw + ["0000:02:01.0"],
        "0000:04:00.0",
        "0x020000",
        "0x15b3",
        0,
        driver="mlx5_core",
        ibdev="mlx5_0",
        netdev="eth1",
    )
    tree.pci(
        sw + ["0000:02:02.0", "0000:05:00.0", "0000:06:00.0"], "0000:07:00.0", "0x030200", "0x10de", 0, driver="nvidia"
    )
    tree.pci(["pci0000:00", "0000:00:02.0"], "0000:08:00.0", "0x030200", "0x10de", 0, driver="nvidia")
    tree.pci(
        ["pci0000:80", "0000:80:01.0"],
        "0000:81:00.0",
        "0x020000",
        "0x15b3",
        0,
        driver="mlx5_core",
        ibdev="mlx5_1",
        netdev="eth2",
    )
    tree.pci(
        ["pci0000:c0", "0000:c0:01.0"],
        "0000:c1:00.0",
        "0x020000",
        "0x15b3",
        -1,
        driver="mlx5_core",
        ibdev="mlx5_2",
        netdev="eth3",
    )
    tree.numa({0: "0-7"})
    topo = read_topology(str(tmp_path / "sys"))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    gpu_sw, nic_sw = by_bus["0000:03:00.0"], by_bus["0000:04:00.0"]
    assert topo.relation(gpu_sw, nic_sw) == PIX
    assert topo.relation(by_bus["0000:07:00.0"], nic_sw) == PXB
    assert topo.relation(by_bus["0000:08:00.0"], nic_sw) == PHB
    assert topo.relation(gpu_sw, by_bus["0000:81:00.0"]) == NODE
    assert topo.relation(gpu_sw, by_bus["0000:c1:00.0"]) == UNKNOWN
    assert by_bus["0000:c1:00.0"].numa_node is None


def test_unknown_numa_is_never_guessed(sysfs_trees, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    # A VM whose PCI devices all report numa_node = -1 (the H200 VM of docs/gpu-check.md): no NUMA
    # shown; its one NUMA node holds every device (no GPU in this fixture, so still no template),
    # and a template on it selects no numaNode (its NICs publish none).
    root = str(sysfs_trees.get("vm-no-numa"))
    topo = read_topology(root)
    assert topo.nics and all(n.numa_node is None for n in topo.nics)
    assert main(["--log-format", "text", "templates", "--gpus", "1", "--sysfs-root", root]) == 1
    assert "NUMA 0 (the only node; sysfs numa_node = -1): 0 GPUs, 2 RDMA NICs" in capsys.readouterr().err
    topo.gpus.append(PciEndpoint("GPU0", "0000:00:07.0", None, "pci0000:00", vendor="0x10de"))
    (choice,) = aligned_choices(topo, 1)
    assert not choice.numa_published
    assert "numaNode" not in render_template(choice, 1)


# -- GPU-NIC pairs -------------------------------------------------------------------------------

# dgx-h100.yaml: each GPU and its compute NIC behind one PCIe switch (GPU bus -> NIC bus, RDMA device).
DGX_H100_PAIRS = {
    "0000:1b:00.0": ("0000:18:00.0", "mlx5_0"),
    "0000:43:00.0": ("0000:40:00.0", "mlx5_1"),
    "0000:52:00.0": ("0000:4f:00.0", "mlx5_2"),
    "0000:61:00.0": ("0000:5e:00.0", "mlx5_3"),
    "0000:9d:00.0": ("0000:9a:00.0", "mlx5_4"),
    "0000:c3:00.0": ("0000:c0:00.0", "mlx5_5"),
    "0000:d1:00.0": ("0000:ce:00.0", "mlx5_6"),
    "0000:df:00.0": ("0000:dc:00.0", "mlx5_7"),
}
EXAMPLE = (
    Path(__file__).resolve().parents[2] / "examples/distributed_training/resource-claim-template-gpu-nic-pairs.yaml"
)


def _templates(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> tuple[int, str, str]:
    code = main(["--log-format", "text", "templates", "--sysfs-root", str(root), *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _requests(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["exactly"] for r in doc["spec"]["spec"]["devices"]["requests"]}


def test_dgx_matrix_shows_the_path_class_and_each_gpus_own_nic(
    sysfs_trees: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sysfs_trees.get("dgx-h100")
    topo = read_topology(str(root))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    for gpu, (nic, _) in DGX_H100_PAIRS.items():
        assert topo.relation(by_bus[gpu], by_bus[nic]) == PIX
    assert topo.relation(by_bus["0000:1b:00.0"], by_bus["0000:40:00.0"]) == NODE  # another switch, same socket
    assert topo.relation(by_bus["0000:1b:00.0"], by_bus["0000:9a:00.0"]) == SYS
    assert main(["--log-format", "text", "topology", "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    pairs = out[out.index("Pairs (") :].splitlines()[1:9]
    assert [line.split()[:2] for line in pairs] == [[f"GPU{i}", PIX] for i in range(8)]
    assert all(rdma in line for line, (_, rdma) in zip(pairs, DGX_H100_PAIRS.values(), strict=True))
    assert main(["--log-format", "text", "topology", "--sysfs-root", str(root), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["gpuPciBusID"]: (p["nicPciBusID"], p["rdmaDevice"], p["path"]) for p in doc["pairs"]} == {
        gpu: (nic, rdma, PIX) for gpu, (nic, rdma) in DGX_H100_PAIRS.items()
    }
    assert all(p["pcieRoot"] and p["pcieRoot"].startswith("pci0000:") for p in doc["pairs"])
    assert doc["matrix"]["GPU0"]["NIC0"] == PIX  # the first NIC by bus ID is GPU0's


def test_pcie_root_template_pairs_by_a_constraint_per_pair(
    sysfs_trees: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _templates(capsys, sysfs_trees.get("dgx-h100"), "--gpus", "4", "--pair", "pcie-root")
    assert code == 0, err
    (doc,) = list(yaml.safe_load_all(out))
    assert doc["metadata"]["name"] == "4gpu-4nic-pcie-root"
    devices = doc["spec"]["spec"]["devices"]
    # Each GPU right before its NIC: the scheduler settles a pair before it tries the next.
    assert [r["name"] for r in devices["requests"]] == [f"{k}-{i}" for i in range(4) for k in ("gpu", "nic")]
    assert devices["constraints"] == [
        {"requests": [f"gpu-{i}", f"nic-{i}"], "matchAttribute": "resource.kubernetes.io/pcieRoot"} for i in range(4)
    ]
    for name, req in _requests(doc).items():
        assert req["count"] == 1
        if name.startswith("gpu"):
            assert req == {"deviceClassName": "gpu.nvidia.com", "count": 1}
        else:
            assert req["deviceClassName"] == "dranet.net"
            assert req["selectors"] == [{"cel": {"expression": 'device.attributes["dra.net"]["rdma"] == true'}}]
    assert "pciBusID" not in yaml.safe_dump(devices)  # portable: no bus IDs
    comments = [line for line in out.splitlines() if line.startswith("#   gpu-")]
    assert len(comments) == 4 and all(line.endswith(": PIX") for line in comments)


def test_pcie_switch_templates_pair_by_bus_id_under_one_switch(
    sysfs_trees: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sysfs_trees.get("dgx-h100")
    code, out, err = _templates(capsys, root, "--gpus", "4", "--pair", "pcie-switch")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["metadata"]["name"] for d in docs] == ["4gpu-4nic-pcie-switch-0", "4gpu-4nic-pcie-switch-1"]
    topo = read_topology(str(root))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    seen = set()
    for doc in docs:
        requests = _requests(doc)
        assert "constraints" not in doc["spec"]["spec"]["devices"]
        numa = set()
        for i in range(4):
            gpu_expr = requests[f"gpu-{i}"]["selectors"][0]["cel"]["expression"]
            nic_expr = requests[f"nic-{i}"]["selectors"][0]["cel"]["expression"]
            gpu, nic = (e.split('== "')[-1].rstrip('"') for e in (gpu_expr, nic_expr))
            assert DGX_H100_PAIRS[gpu][0] == nic and 'device.attributes["dra.net"]["rdma"] == true' in nic_expr
            assert topo.relation(by_bus[gpu], by_bus[nic]) in (PIX, PXB)
            numa.add(by_bus[gpu].numa_node)
            seen.add(gpu)
        assert len(numa) == 1  # grouped by NUMA node, like the aligned templates
    assert seen == set(DGX_H100_PAIRS)
    assert sum(1 for line in out.splitlines() if line.startswith("#   gpu-") and line.endswith(": PIX")) == 8


@pytest.mark.parametrize("mode", ["pcie-root", "pcie-switch"])
def test_azure_nd_cannot_pair_and_says_why(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str], mode: str) -> None:
    code, out, err = _templates(capsys, nd_h100_sysfs, "--gpus", "4", "--pair", mode, "--exclude-interfaces", "eth0")
    assert code == 1 and out == ""
    assert "Traceback" not in err
    what = "a PCIe root" if mode == "pcie-root" else "a PCIe switch"
    assert f"dranet templates: no RDMA NIC shares {what} with GPU 0001:00:00.0 (root pci0001:00)" in err
    assert "as on Azure ND VMs" in err and "use the NUMA-aligned templates (without --pair)" in err
    # Without --pair, the same node gets its NUMA-aligned templates as before.
    assert _templates(capsys, nd_h100_sysfs, "--gpus", "4")[0] == 0


def test_pairing_errors_name_the_gpu_and_what_holds_its_nic(tmp_path: Path) -> None:
    """One switch, two GPUs, one NIC: the second GPU's only NIC is the first's."""
    tree = TreeBuilder(tmp_path / "sys")
    sw = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"]
    tree.pci(sw + ["0000:02:00.0"], "0000:03:00.0", "0x030200", "0x10de", 0, driver="nvidia")
    tree.pci(sw + ["0000:02:01.0"], "0000:04:00.0", "0x020000", "0x15b3", 0, "mlx5_core", "mlx5_0", "eth1")
    tree.pci(sw + ["0000:02:02.0"], "0000:05:00.0", "0x030200", "0x10de", 0, driver="nvidia")
    tree.numa({0: "0-7"})
    topo = read_topology(str(tmp_path / "sys"))
    assert [len(t.pairs) for t in pair_templates(topo, 1, "pcie-switch")] == [1]
    with pytest.raises(NoPairingError) as err:
        pair_templates(topo, 2, "pcie-root")
    assert str(err.value) == (
        "only 1 of 2 GPUs pair, --gpus asks for 2; every RDMA NIC that shares a PCIe root with GPU 0000:05:00.0 "
        "is paired with another GPU: NIC 0000:04:00.0 (with GPU 0000:03:00.0)"
    )
    with pytest.raises(NoPairingError, match=r"--gpus 3: this node has 2 GPUs"):
        pair_templates(topo, 3, "pcie-root")
    with pytest.raises(NoPairingError, match="at least 1"):
        pair_templates(topo, 0, "pcie-switch")


def test_the_example_is_what_the_generator_writes(sysfs_trees: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _templates(capsys, sysfs_trees.get("dgx-h100"), "--gpus", "4", "--pair", "pcie-root")
    assert code == 0
    example = EXAMPLE.read_text()
    assert example.endswith(out)  # the example's own header, then the generator's output unchanged
    assert yaml.safe_load(example)["metadata"]["name"] == "4gpu-4nic-pcie-root"


def test_the_cli_knows_the_pair_modes() -> None:
    from driver import cli
    from driver.inventory import topology

    assert cli.PAIR_MODES == topology.PAIR_MODES
