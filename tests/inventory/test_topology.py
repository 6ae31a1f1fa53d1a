"""``dranet topology`` / ``dranet templates`` on sysfs trees shaped like real nodes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from driver.cli import main
from driver.inventory.topology import NODE, PHB, PIX, PXB, SYS, UNKNOWN, read_topology

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
    assert set(doc) == {"gpus", "nics", "matrix", "numaNodes", "legend"}
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
    # A VM whose PCI devices all report numa_node = -1: no NUMA shown, no template offered.
    root = str(sysfs_trees.get("vm-no-numa"))
    topo = read_topology(root)
    assert topo.nics and all(n.numa_node is None for n in topo.nics)
    assert main(["--log-format", "text", "templates", "--gpus", "1", "--sysfs-root", root]) == 1
    assert "no NUMA information" in capsys.readouterr().err
