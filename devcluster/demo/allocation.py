"""``make demo-fast`` (``--allocation-only``): the training example allocated on a simulated node.

(``make demo`` without the flag starts the pods for real: `devcluster.demo.nodes`.)

Builds or reuses the binaries, starts a real control plane, builds the ND H100 v5 sysfs
fixture, runs ``dranet run`` on it as a separate process, installs the GPU driver TEST DOUBLE,
applies ``examples/distributed_training/{device-class,resource-claim-template}.yaml``, creates one
pod per template (one after the other: both templates want the same 4 GPUs), and prints which
NICs and GPUs each claim got with their NUMA nodes. Everything is removed at the end, also on
Ctrl-C. The training example's helpers here are reused by tests/e2e/test_seed.py.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devcluster.builders.binaries import ensure_control_plane
from devcluster.cluster.controlplane import ControlPlane, create_objects, load_yaml_docs, wait_for
from devcluster.doubles import gpu_double
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound
from harness.driver_process import DriverProcess

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "examples" / "distributed_training"
ALIGNED, UNALIGNED = "h100-4gpu-4nic-numa-aligned", "h100-4gpu-4nic-numa-unaligned"


def build_fixture(topology: str, out: Path) -> Path:
    """Run the sysfs fixture builder (``python -m devcluster.doubles.sysfs_fixture``) into ``out``."""
    subprocess.run(
        [sys.executable, "-m", "devcluster.doubles.sysfs_fixture", "--topology", topology, "--out", str(out)],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return out


def seed_docs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training example's DeviceClass and ResourceClaimTemplates, read from the example files."""
    return (
        load_yaml_docs(EXAMPLE_DIR / "device-class.yaml"),
        load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml"),
    )


def pod_for_template(name: str, template: str, node: str) -> dict[str, Any]:
    """An unscheduled pod pinned to ``node`` by label, using one claim from ``template``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "devices"}]},
                }
            ],
        },
    }


def allocated_claim(kube: KubeClient, namespace: str, pod: str) -> dict[str, Any] | None:
    """The pod's generated claim once the scheduler allocated it and bound the pod."""
    p = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
    statuses = p.get("status", {}).get("resourceClaimStatuses") or []
    if not p["spec"].get("nodeName") or not statuses or not statuses[0].get("resourceClaimName"):
        return None
    claim = kube.read_namespaced_resource_claim(namespace, statuses[0]["resourceClaimName"])
    return claim if claim.get("status", {}).get("allocation") else None


def slice_devices(kube: KubeClient, node: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(driver, pool, device) -> device attributes, from every slice on ``node``."""
    out = {}
    for s in kube.request("GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node}"})[
        "items"
    ]:
        for d in s["spec"].get("devices") or []:
            out[(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])] = {
                k: next(iter(v.values())) for k, v in (d.get("attributes") or {}).items()
            }
    return out


def allocation_rows(kube: KubeClient, claim: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """One row per allocated device: request, driver, device, interface/PCI, NUMA node."""
    attrs = slice_devices(kube, node)
    rows = []
    for r in claim["status"]["allocation"]["devices"]["results"]:
        a = attrs.get((r["driver"], r["pool"], r["device"]), {})
        rows.append(
            {
                "request": r["request"],
                "driver": r["driver"],
                "device": r["device"],
                "ifName": a.get("dra.net/ifName", ""),
                "rdma": a.get("dra.net/rdmaDevice", ""),
                "pciBusID": a.get("resource.kubernetes.io/pciBusID", ""),
                "numa": a.get("dra.net/numaNode", a.get(f"{gpu_double.GPU_DRIVER}/numaNode", "?")),
            }
        )
    return rows


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    cols = ["request", "driver", "device", "ifName", "rdma", "pciBusID", "numa"]
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(f"\n{title}")
    print("  ".join(c.upper().ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))


def summary(rows: list[dict[str, Any]]) -> str:
    """One line: the NUMA nodes of the claim's GPUs and NICs, and whether they line up."""
    gpus = sorted({r["numa"] for r in rows if r["driver"] == gpu_double.GPU_DRIVER})
    nics = sorted({r["numa"] for r in rows if r["driver"] == "dra.net"})
    verdict = (
        "NUMA-aligned (GPU<->NIC traffic stays on one socket)"
        if gpus == nics and len(gpus) == 1
        else "NOT aligned (GPU<->NIC traffic crosses the inter-socket link)"
    )
    return f"  GPUs on NUMA {gpus}, NICs on NUMA {nics}: {verdict}"


def delete_pod(kube: KubeClient, namespace: str, name: str) -> None:
    """Delete a bound pod at once (no kubelet will ever finalize it)."""
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0})
    except KubeError as exc:
        if not isinstance(exc, NotFound):
            raise


def run_demo() -> int:
    """The whole demo; returns an exit code. Cleans up in ``finally`` blocks (also on Ctrl-C)."""
    logging.basicConfig(level=logging.WARNING)
    t0 = time.monotonic()
    print("1/6 binaries (built from the Go module proxy on first use; progress below)", flush=True)
    binaries = ensure_control_plane()
    work = Path(tempfile.mkdtemp(prefix="dn-demo-"))
    node = "nd-h100-v5-0"
    try:
        print("2/6 control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)", flush=True)
        with ControlPlane(binaries) as cp:
            kube = cp.kube()
            print(f"    ready in {cp.start_seconds:.1f}s at {cp.server}; kubeconfig {cp.kubeconfig}")
            cp.create_node(node)
            print("3/6 ND H100 v5 sysfs fixture + `dranet run` on it", flush=True)
            fixture = build_fixture("nd-h100-v5", work / "sysfs")
            drv = DriverProcess(cp.kubeconfig, node, fixture, work / "driver")
            try:
                drv.start()
                wait_for(lambda: any(k[0] == "dra.net" for k in slice_devices(kube, node)), 30, what="dra.net slices")
                print(
                    "4/6 GPU driver TEST DOUBLE (gpu.nvidia.com slice + DeviceClass) and the seed example", flush=True
                )
                gpu_double.install(kube, node)
                classes, templates = seed_docs()
                create_objects(kube, classes)
                create_objects(kube, templates, "default")
                print("5/6 one pod per template, scheduled by the real scheduler", flush=True)
                for template in (ALIGNED, UNALIGNED):
                    pod = template.replace("h100-4gpu-4nic-", "trainer-")
                    create_objects(kube, [pod_for_template(pod, template, node)], "default")
                    claim = wait_for(
                        lambda pod=pod: allocated_claim(kube, "default", pod), 60, what=f"{pod} allocation"
                    )
                    rows = allocation_rows(kube, claim, node)
                    print_table(f"pod {pod} -> claim {claim['metadata']['name']} (template {template})", rows)
                    print(summary(rows))
                    # Both templates want the same 4 GPUs: free them for the next pod.
                    delete_pod(kube, "default", pod)
                    wait_for(
                        lambda: not kube.request("GET", f"{RESOURCE_API}/namespaces/default/resourceclaims")["items"],
                        60,
                        what="claim released",
                    )
                print(f"\n6/6 done in {time.monotonic() - t0:.0f}s; cleaning up", flush=True)
            finally:
                # Cluster objects vanish with the control plane; only the process needs stopping.
                drv.stop()
        return 0
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(work, ignore_errors=True)
