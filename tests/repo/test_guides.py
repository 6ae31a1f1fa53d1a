"""docs/workloads.md and its examples say what works: the manifests are valid Kubernetes 1.34
objects and dra.net configs, the minimal pod is allocated one RDMA NIC by the real scheduler,
the torchrun command uses the flags torchrun has, the UCX line turns the injected list into
device:port pairs (run as written), the SR-IOV selector picks exactly the VFs of a fixture node,
and every mention of the MPI Operator names the version the demo runs."""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import mpi_operator
from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import seed_docs
from driver.dra.publisher import SlicePublisher
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner
from driver.kube.client import RESOURCE_API
from driver.kube.errors import Conflict
from tests.plugins.cluster import delete_if_present, delete_node_and_slices

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "workloads.md"
MINIMAL = ROOT / "examples" / "minimal" / "pod-one-rdma-nic.yaml"
TORCHRUN = ROOT / "examples" / "torchrun" / "torchrun-job.yaml"
SRIOV_EXAMPLES = sorted((ROOT / "examples" / "sriov").glob("claim-*.yaml"))


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("path", [MINIMAL, TORCHRUN, *SRIOV_EXAMPLES], ids=lambda p: p.name)
def test_examples_are_valid_objects_and_configs(path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs_of(path):
        kubernetes_validate.validate(doc, "1.34.0", strict=True)
    out = subprocess.run(
        [sys.executable, "-m", "driver", "validate", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    claims = sum(1 for d in docs_of(path) if d["kind"] in ("ResourceClaim", "ResourceClaimTemplate"))
    configs = sum(
        1
        for d in docs_of(path)
        if d["kind"] == "ResourceClaimTemplate"
        for c in d["spec"]["spec"]["devices"].get("config", [])
        if c["opaque"]["driver"] == "dra.net"
    )
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith(f"ok: {claims} claim"), out.stdout
    assert f", {configs} config" in out.stdout


def test_torchrun_uses_flags_torchrun_has() -> None:
    (job,) = [d for d in docs_of(TORCHRUN) if d["kind"] == "Job"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    assert "--numa-binding=node" in script and '--node-rank="$JOB_COMPLETION_INDEX"' in script
    for wrong in ("--cpu-map", "--mem-map", "--numa_binding"):  # not torchrun flags
        assert wrong not in script and wrong not in GUIDE.read_text()
    assert {e["name"]: e["value"] for e in container["env"]}["NCCL_SOCKET_IFNAME"] == "eth0"
    assert job["spec"]["completionMode"] == "Indexed"
    (service,) = [d for d in docs_of(TORCHRUN) if d["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None" and job["spec"]["template"]["spec"]["subdomain"] == "ddp"


def test_the_ucx_line_makes_device_port_pairs() -> None:
    """The example's UCX_NET_DEVICES line, run by bash as written, on what the driver injects."""
    (job,) = [d for d in docs_of(TORCHRUN) if d["kind"] == "Job"]
    line = next(
        ln.strip()
        for ln in job["spec"]["template"]["spec"]["containers"][0]["args"][0].splitlines()
        if ln.strip().startswith("export UCX_NET_DEVICES=")
    )
    assert "sed -E 's/([^,]+)/\\1:1/g'" in line and "sed -E 's/([^,]+)/\\1:1/g'" in GUIDE.read_text()
    out = subprocess.run(
        ["bash", "-c", f'{line}; echo "$UCX_NET_DEVICES"'],
        env={"DRANET_RDMA_DEVICES": "mlx5_0,mlx5_3,mlx5_10", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.strip() == "mlx5_0:1,mlx5_3:1,mlx5_10:1", out.stderr


def test_the_guide_covers_the_nccl_and_ucx_variables() -> None:
    text = GUIDE.read_text()
    for variable in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES"):
        assert f"| `{variable}` |" in text, variable
    assert "InfiniBand" in text and "RoCE" in text


def test_the_sriov_selector_picks_exactly_the_vfs(sriov_sysfs: Path) -> None:
    """The guide's CEL selector, evaluated like a DeviceClass selector over a fixture node's
    published devices (PFs with VFs, RDMA on both)."""
    text = GUIDE.read_text()
    block = text.split("Select VFs only", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    expression = yaml.safe_load(block)["selectors"][0]["cel"]["expression"]
    devices = Scanner(str(sriov_sysfs), replay=False).scan()
    vfs = {d.name for d in devices if d.attributes.get("dra.net/isSriovVf") is True}
    assert vfs and len(vfs) < len(devices)
    picked = {d.name for d in DeviceFilter(expression).apply(devices)}
    wanted = {
        d.name
        for d in devices
        if d.name in vfs and d.attributes.get("dra.net/rdma") is True and d.attributes.get("dra.net/numaNode") == 0
    }
    assert wanted and picked == wanted


def test_one_mpi_operator_version_everywhere() -> None:
    """Every MPI Operator version the docs and examples name is the one the demo builds."""
    found = []
    for path in [
        ROOT / "README.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("examples/**/*.md"),
        *ROOT.glob("examples/**/*.yaml"),
    ]:
        text = path.read_text()
        found += [(path.name, v) for v in re.findall(r"mpi-operator[^\n]*?[?@=](v\d+\.\d+\.\d+)", text)]
        found += [(path.name, v) for v in re.findall(r"MPI Operator[^\n]{0,40}?\b(v\d+\.\d+\.\d+)", text)]
    assert found, "no MPI Operator version named anywhere"
    assert {v for _, v in found} == {mpi_operator.VERSION}, found


@pytest.mark.cluster
def test_the_minimal_pod_gets_one_rdma_nic(control_plane: ControlPlane, nd_h100_sysfs: Path) -> None:
    """The example applied unchanged (namespaced objects into a fresh namespace) on a node whose
    slices the driver's publisher wrote: the real scheduler allocates one RDMA NIC."""
    kube = control_plane.kube()
    tag = secrets.token_hex(3)
    node, ns = f"guide-{tag}", f"guide-{tag}"
    created_class = None
    try:
        kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        control_plane.create_node(node, labels={"guide": tag})
        publisher = SlicePublisher(kube, "dra.net", node)
        publisher.node_uid = kube.read_node(node)["metadata"]["uid"]
        publisher.update(Scanner(str(nd_h100_sysfs), exclude_interfaces=["eth0"], replay=False).scan())
        publisher.sync()
        (device_class,) = seed_docs()[0]
        try:
            create_objects(kube, [device_class])
            created_class = device_class["metadata"]["name"]
        except Conflict:
            pass
        docs = docs_of(MINIMAL)
        pod = next(d for d in docs if d["kind"] == "Pod")
        pod["spec"]["nodeSelector"] = {"guide": tag}  # this test's node only (others may publish NICs)
        create_objects(kube, docs, ns)
        name = pod["metadata"]["name"]

        def allocated() -> dict[str, Any] | None:
            p = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
            statuses = p.get("status", {}).get("resourceClaimStatuses") or []
            if not statuses or not statuses[0].get("resourceClaimName"):
                return None
            claim = kube.read_namespaced_resource_claim(ns, statuses[0]["resourceClaimName"])
            return claim if claim.get("status", {}).get("allocation") else None

        claim = wait_for(allocated, timeout=60, what="the example pod's claim allocated")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["driver"] == "dra.net" and result["pool"] == node
        published = {
            d["name"]: d
            for s in kube.list_resource_slice(f"spec.nodeName={node}")["items"]
            for d in s["spec"]["devices"]
        }
        assert published[result["device"]]["attributes"]["dra.net/rdma"] == {"bool": True}
        assert claim["spec"]["devices"]["config"][0]["opaque"]["parameters"] == {"interface": {"name": "net0"}}
    finally:
        delete_if_present(kube, f"/api/v1/namespaces/{ns}")
        delete_node_and_slices(kube, node)
        if created_class:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{created_class}")
