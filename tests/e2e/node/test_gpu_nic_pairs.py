"""GPU-NIC pair templates on two real nodes shaped like a DGX H100 (``devcluster up --topology
dgx-h100``): each H100 shares a PCIe switch with one ConnectX-7, so each GPU has its own NIC under
its PCIe root (PIX), where NCCL uses GPUDirect RDMA by default.

A cluster of its own (name ``pair<hex>``, a random /20 no host route uses), removed at the end; or,
with ``DRANET_E2E_PAIRS_CLUSTER=<name>``, a running one (``python -m devcluster up --topology
dgx-h100 --name <name>``), left running. What it checks, as a user would do it:

* ``dranet templates --pair pcie-root``, run on node 0's fixture sysfs, applied with kubectl: a pod
  with it runs, and in its claim's allocation every ``gpu-i``/``nic-i`` pair has one
  ``resource.kubernetes.io/pcieRoot`` (as the GPU double and dra.net publish it), the pair's path
  on the node is PIX, and the pod has the four NICs;
* ``dranet templates --pair pcie-switch``: PIX/PXB pairs by bus ID, and a pod with the second
  template gets exactly those devices on node 1;
* ``kubectl dranet templates --pair pcie-root`` from the slices asks for the same as the local one,
  and ``kubectl dranet topology`` pairs every GPU with a NIC of its own root.

The Azure ND refusal needs no cluster (last test; tests/inventory/test_topology.py has the rest).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import fabric
from devcluster.cluster.pods import workload_pod
from devcluster.doubles.sysfs_fixture import build
from driver.inventory.topology import PIX, PXB, read_topology
from driver.kube.client import RESOURCE_API
from driver.kubectl.main import main as plugin_main
from tests.e2e.node.realnode import E2E_MARKS, RealNode, cluster_for_tests, random_layout
from tests.e2e.node.support import delete_pod, pod_claim, wait_running

pytestmark = E2E_MARKS
REUSE_ENV = "DRANET_E2E_PAIRS_CLUSTER"
TOPOLOGY = "dgx-h100"
ROOT = Path(__file__).resolve().parents[3]
STANDARD = "resource.kubernetes.io"


def pairs_layout() -> Any:
    """Two dgx-h100 nodes under a name and /20 of this module's own."""
    for _ in range(20):
        layout = dataclasses.replace(
            random_layout(), name="pair" + secrets.token_hex(2), topology=TOPOLOGY, node_prefix=""
        )
        if not layout.base.exists() and not fabric.overlapping_routes(layout):
            return layout
    raise RuntimeError("no free name for the pairs cluster")


@pytest.fixture(scope="module")
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    reuse = os.environ.get(REUSE_ENV)
    with cluster_for_tests(request, pairs_layout, reuse) as node:
        if reuse:  # the state file does not record the topology: the reused cluster must be dgx-h100's
            node.layout = dataclasses.replace(node.layout, topology=TOPOLOGY, node_prefix="")
            names = {n["metadata"]["name"] for n in node.kube.request("GET", "/api/v1/nodes")["items"]}
            if node.layout.node_name not in names:
                pytest.fail(f"{REUSE_ENV}={reuse}: not a {TOPOLOGY} cluster (nodes {sorted(names)})")
        yield node


def dranet_templates(sysfs: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``dranet templates`` on a node's fixture sysfs, as a user runs it on the node."""
    return subprocess.run(
        [sys.executable, "-m", "driver", "--log-format", "text", "templates", "--sysfs-root", str(sysfs), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def slice_attributes(node: RealNode, node_name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """(driver, device) -> attribute -> value, of every slice of ``node_name``."""
    items = node.kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node_name}"}
    )["items"]
    return {
        (s["spec"]["driver"], d["name"]): {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
        for s in items
        for d in s["spec"].get("devices") or []
    }


def allocated(node: RealNode, ns: str, pod: str) -> dict[str, dict[str, Any]]:
    """request -> the allocated device's slice attributes, of the pod's claim."""
    claim = pod_claim(node, ns, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    attrs = slice_attributes(node, results[0]["pool"])
    return {r["request"]: attrs[(r["driver"], r["device"])] for r in results}


def test_pcie_root_pairs_each_gpu_with_the_nic_under_its_root(real_node: RealNode, ns: str) -> None:
    spec = real_node.spec(0)
    out = dranet_templates(spec.sysfs, "--pair", "pcie-root", "--gpus", "4")
    assert out.returncode == 0, out.stderr
    (template,) = [d for d in yaml.safe_load_all(out.stdout) if d]
    real_node.kubectl.run("apply", "-n", ns, "-f", "-", stdin=out.stdout)
    real_node.kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        workload_pod("root", spec.name, template["metadata"]["name"], namespace=ns),
    )
    wait_running(real_node, ns, "root", timeout=120)
    devices = allocated(real_node, ns, "root")
    topo = read_topology(str(spec.sysfs))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}
    gpus, nics = set(), set()
    for i in range(4):
        gpu, nic = devices[f"gpu-{i}"], devices[f"nic-{i}"]
        assert gpu[f"{STANDARD}/pcieRoot"] == nic[f"{STANDARD}/pcieRoot"], (i, gpu, nic)
        assert nic["dra.net/rdma"] is True
        path = topo.relation(by_bus[gpu[f"{STANDARD}/pciBusID"]], by_bus[nic[f"{STANDARD}/pciBusID"]])
        assert path == PIX, (i, path)
        gpus.add(gpu[f"{STANDARD}/pciBusID"])
        nics.add(nic["dra.net/ifName"])
    assert len(gpus) == len(nics) == 4
    links = real_node.kubectl.exec(ns, "root", "ip", "-o", "link")
    assert all(re.search(rf"^\d+: {name}[:@]", links, re.M) for name in nics), (nics, links)
    delete_pod(real_node, ns, "root")


def test_pcie_switch_pairs_by_bus_id_under_one_switch(real_node: RealNode, ns: str) -> None:
    spec = real_node.spec(1)
    out = dranet_templates(spec.sysfs, "--pair", "pcie-switch", "--gpus", "4")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert [d["metadata"]["name"] for d in docs] == ["4gpu-4nic-pcie-switch-0", "4gpu-4nic-pcie-switch-1"]
    topo = read_topology(str(spec.sysfs))
    by_bus = {e.pci_bus_id: e for e in topo.gpus + topo.nics}

    def bus_ids(doc: dict[str, Any]) -> dict[str, str]:
        requests = doc["spec"]["spec"]["devices"]["requests"]
        return {r["name"]: r["exactly"]["selectors"][0]["cel"]["expression"].split('== "')[-1][:-1] for r in requests}

    for doc in docs:
        ids = bus_ids(doc)
        for i in range(4):
            assert topo.relation(by_bus[ids[f"gpu-{i}"]], by_bus[ids[f"nic-{i}"]]) in (PIX, PXB)
    real_node.kubectl.run("apply", "-n", ns, "-f", "-", stdin=out.stdout)
    real_node.kube.request(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        workload_pod("switch", spec.name, "4gpu-4nic-pcie-switch-1", namespace=ns),
    )
    wait_running(real_node, ns, "switch", timeout=120)
    devices = allocated(real_node, ns, "switch")
    assert {r: d[f"{STANDARD}/pciBusID"] for r, d in devices.items()} == bus_ids(docs[1])
    delete_pod(real_node, ns, "switch")


def test_the_kubectl_plugin_pairs_from_the_slices(real_node: RealNode) -> None:
    spec = real_node.spec(0)
    kubeconfig = str(real_node.state.kubeconfig)
    buf = io.StringIO()
    argv = ["--kubeconfig", kubeconfig, "templates", "--node", spec.name, "--pair", "pcie-root", "--gpus", "4"]
    assert plugin_main(argv, out=buf) == 0
    local = dranet_templates(spec.sysfs, "--pair", "pcie-root", "--gpus", "4")
    assert yaml.safe_load(buf.getvalue()) == yaml.safe_load(local.stdout)  # the same claim, comments aside
    buf = io.StringIO()
    assert plugin_main(["--kubeconfig", kubeconfig, "topology", "--node", spec.name, "-o", "json"], out=buf) == 0
    pairs = json.loads(buf.getvalue())["pairs"]
    assert len(pairs) == 8 and all(p["pcieRoot"] for p in pairs), pairs
    assert len({p["nicPciBusID"] for p in pairs}) == 8


def test_azure_nd_refuses_pairs_clearly(tmp_path: Path) -> None:
    root = build("nd-h100-v5", tmp_path / "sys")
    out = dranet_templates(root, "--pair", "pcie-root", "--gpus", "4", "--exclude-interfaces", "eth0")
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
    assert "no RDMA NIC shares a PCIe root with GPU 0001:00:00.0" in out.stderr and "Azure ND" in out.stderr
