"""The training example's MPIJobs (``examples/distributed_training/mpi-job-4gpu-4nic-numa-*.yaml``), unchanged,
under the real MPI Operator on the cluster's real nodes: images, the training example's objects, reports.

What is real and what stands in:

* the MPI Operator ``v0.8.2`` (``devcluster.cluster.mpi_operator``), built from its Go module, runs as
  upstream's standalone overlay deploys it (``devcluster up`` installs it);
* the training example's MPIJob, ResourceClaimTemplate and DeviceClass files are applied exactly as they are
  (``kubectl apply -k examples/distributed_training``, ``kubectl apply -f mpi-job-*.yaml``); the
  ConfigMap ``ddp-benchmark-scripts`` comes from the training example's ``kustomization.yaml``;
* the image: the training example's ``registry.example.com/dranet/pytorch-mpi:25.09`` (NGC PyTorch, CUDA)
  cannot be pulled here. :func:`worker_image` builds the same tools from Debian packages
  (``devcluster/cluster/mpi-worker.Dockerfile``: PyTorch's CPU build, Open MPI, OpenSSH, numactl), and
  ``devcluster up`` tags it under the training example's name in every node's containerd, so the unchanged
  manifests start it (``IfNotPresent``). Without a GPU the benchmark runs on the CPU over gloo and
  says so; the GPUs the claims allocate come from the GPU driver test double.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster.builders.binaries import Progress, _print_progress
from devcluster.builders.driver_image import base_key, bud, build_base, build_once
from devcluster.builders.images import ImageArchive, images_dir
from devcluster.cluster import mpi_operator
from devcluster.cluster.controlplane import load_yaml_docs, wait_for
from devcluster.cluster.mpi_operator import apply
from devcluster.doubles import gpu_double
from driver.config import DRIVER_NAME
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, NotFound

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO / "examples" / "distributed_training"
MPIJOB_FILES = {
    "aligned": EXAMPLE_DIR / "mpi-job-4gpu-4nic-numa-aligned.yaml",
    "unaligned": EXAMPLE_DIR / "mpi-job-4gpu-4nic-numa-unaligned.yaml",
}
WORKER_DOCKERFILE = Path(__file__).resolve().parent / "mpi-worker.Dockerfile"
WORKER_REPO = "localhost/dranet/mpi-worker"
MPIJOBS_API = f"/apis/{mpi_operator.API_VERSION}"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"


# -- images ---------------------------------------------------------------------------------------


def worker_image(progress: Progress = _print_progress) -> ImageArchive:
    """The training example's image for this machine (``mpi-worker.Dockerfile`` on the driver image's Debian
    base), built with buildah on first use (apt inside: ~160 MB of packages) and cached by
    content hash."""
    key = hashlib.sha256(base_key().encode() + WORKER_DOCKERFILE.read_bytes()).hexdigest()[:16]
    ref = f"{WORKER_REPO}:{key}"
    out = images_dir() / f"mpi-worker-{key}.tar"

    def build() -> ImageArchive:
        base = build_base(progress)
        progress(
            f"[mpi worker image] buildah bud {WORKER_DOCKERFILE.name} -> {ref} "
            "(apt: python3-torch, openmpi-bin, openssh-server, numactl)"
        )
        with tempfile.TemporaryDirectory(prefix="dn-mpiw-") as context:
            return bud(WORKER_DOCKERFILE, Path(context), ref, out, progress, "mpi worker image", {"DEBIAN_IMAGE": base})

    return build_once(ref, out, build, WORKER_REPO, "mpi-worker-*.tar")


def seed_images() -> list[str]:
    """Every container image the training example's MPIJobs name (read from the files, not assumed)."""
    images = set()
    for path in MPIJOB_FILES.values():
        job = yaml.safe_load(path.read_text())
        for spec in job["spec"]["mpiReplicaSpecs"].values():
            images |= {c["image"] for c in spec["template"]["spec"]["containers"]}
    return sorted(images)


# -- the training example's objects ------------------------------------------------------------------


def scripts_configmap(namespace: str) -> dict[str, Any]:
    """``ddp-benchmark-scripts`` as the training example's kustomization.yaml generates it (same name, files)."""
    kustomization = yaml.safe_load((EXAMPLE_DIR / "kustomization.yaml").read_text())
    gen = next(g for g in kustomization["configMapGenerator"] if g["name"] == "ddp-benchmark-scripts")
    data = {Path(f).name: (EXAMPLE_DIR / f).read_text() for f in gen["files"]}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": gen["name"], "namespace": namespace},
        "data": data,
    }


def apply_seed(kube: KubeClient, namespace: str) -> None:
    """The training example's ResourceClaimTemplates (unchanged) and the scripts ConfigMap in ``namespace``."""
    for d in load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml"):
        d["metadata"]["namespace"] = namespace
        apply(kube, d)
    apply(kube, scripts_configmap(namespace))


def load_mpijob(which: str, namespace: str) -> dict[str, Any]:
    """The training example's MPIJob ``which`` ("aligned" or "unaligned") as written, placed in ``namespace``."""
    job: dict[str, Any] = yaml.safe_load(MPIJOB_FILES[which].read_text())
    job["metadata"]["namespace"] = namespace
    return job


@dataclass
class ClaimView:
    """One worker's claim: which devices of which node, with their NUMA nodes."""

    name: str
    node: str
    gpus: list[tuple[str, int | None]]  # (device, NUMA)
    nics: list[tuple[str, int | None, str]]  # (device, NUMA, ifName)


@dataclass
class PodReport:
    """One pod the operator created."""

    name: str
    role: str
    node: str
    phase: str
    ready: bool
    claim: ClaimView | None = None
    why_not_running: str = ""


@dataclass
class JobReport:
    """What the operator and the cluster made of one MPIJob."""

    job: str
    template: str
    pods: list[PodReport] = field(default_factory=list)
    launcher: str = ""
    conditions: list[str] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)  # ConfigMaps, Secrets, Services it created


def _attrs(kube: KubeClient, node: str, driver: str) -> dict[str, dict[str, Any]]:
    items = kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}
    )["items"]
    out = {}
    for s in items:
        for d in s["spec"].get("devices") or []:
            out[d["name"]] = {k: next(iter(v.values())) for k, v in (d.get("attributes") or {}).items()}
    return out


def claim_view(kube: KubeClient, claim: dict[str, Any]) -> ClaimView:
    """The allocation of ``claim`` with NUMA nodes from the slices of the node it landed on."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    terms = (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or [{}]
    fields = terms[0].get("matchFields") or []
    node = next((f["values"][0] for f in fields if f["key"] == "metadata.name"), "")
    gpus, nics = [], []
    attrs = {drv: _attrs(kube, node, drv) for drv in (DRIVER_NAME, gpu_double.GPU_DRIVER)}
    for r in (alloc.get("devices") or {}).get("results") or []:
        a = attrs.get(r["driver"], {}).get(r["device"], {})
        if r["driver"] == DRIVER_NAME:
            nics.append((r["device"], a.get(f"{DRIVER_NAME}/numaNode"), str(a.get(f"{DRIVER_NAME}/ifName", ""))))
        else:
            gpus.append((r["device"], a.get(f"{gpu_double.GPU_DRIVER}/numaNode")))
    return ClaimView(claim["metadata"]["name"], node, sorted(gpus), sorted(nics))


def job_pods(kube: KubeClient, namespace: str, job: str) -> list[dict[str, Any]]:
    """The pods the operator made for ``job`` (by its labels), sorted by name."""
    items = kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"{JOB_NAME_LABEL}={job}"}
    )["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def report(kube: KubeClient, namespace: str, job: dict[str, Any]) -> JobReport:
    """Everything about one running MPIJob."""
    name = job["metadata"]["name"]
    template = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"
    ]
    out = JobReport(name, template)
    current = kube.request("GET", f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs/{name}")
    out.conditions = [
        f"{c['type']}={c['status']} ({c.get('reason', '')})"
        for c in (current.get("status") or {}).get("conditions", [])
    ]
    for kind, path in (("ConfigMap", "configmaps"), ("Secret", "secrets"), ("Service", "services")):
        for o in kube.request("GET", f"/api/v1/namespaces/{namespace}/{path}")["items"]:
            owners = o["metadata"].get("ownerReferences") or []
            if any(r.get("kind") == "MPIJob" and r.get("name") == name for r in owners):
                out.objects.append(f"{kind} {o['metadata']['name']}")
    for p in job_pods(kube, namespace, name):
        conds = {c["type"]: c for c in p["status"].get("conditions") or []}
        pr = PodReport(
            p["metadata"]["name"],
            p["metadata"]["labels"].get(JOB_ROLE_LABEL, ""),
            p["spec"].get("nodeName", ""),
            p["status"].get("phase", ""),
            conds.get("Ready", {}).get("status") == "True",
        )
        for s in p["status"].get("resourceClaimStatuses") or []:
            claim = kube.read_namespaced_resource_claim(namespace, s["resourceClaimName"])
            pr.claim = claim_view(kube, claim)
        out.pods.append(pr)
    jobs = kube.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs")["items"]
    launcher = [j for j in jobs if j["metadata"]["name"] == f"{name}-launcher"]
    out.launcher = "created" if launcher else "not created"
    return out


def wait_scheduled(kube: KubeClient, namespace: str, job: str, workers: int, timeout: float = 180) -> None:
    """Until the operator made ``workers`` worker pods and the scheduler bound each to a node."""

    def bound() -> bool:
        pods = [p for p in job_pods(kube, namespace, job) if p["metadata"]["labels"].get(JOB_ROLE_LABEL) == "worker"]
        return len(pods) == workers and all(p["spec"].get("nodeName") for p in pods)

    wait_for(bound, timeout, 0.5, f"{workers} worker pods of MPIJob {job} bound to nodes")


@contextlib.contextmanager
def seed_namespace(kube: KubeClient, namespace: str) -> Iterator[str]:
    """``namespace`` with the training example's templates and scripts; deleted (and emptied) on exit."""
    with contextlib.suppress(Conflict):
        kube.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    wait_for(
        lambda: kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
        30,
        0.2,
        f"namespace {namespace} service account",
    )
    apply_seed(kube, namespace)
    try:
        yield namespace
    finally:
        delete_namespace(kube, namespace)


def delete_namespace(kube: KubeClient, namespace: str, timeout: float = 180) -> None:
    """Delete ``namespace`` (its MPIJobs first) and wait until no pod or claim of it is left."""
    with contextlib.suppress(NotFound):
        kube.request(
            "DELETE", f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs", query={"propagationPolicy": "Background"}
        )
    with contextlib.suppress(NotFound):
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}")

    def emptied() -> bool:
        pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        claims = kube.request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")["items"]
        return not pods and not claims

    wait_for(emptied, timeout, 0.5, f"namespace {namespace} emptied")


def delete_job(kube: KubeClient, namespace: str, job: str, timeout: float = 180) -> float:
    """Delete the MPIJob; the garbage collector deletes its pods, the resourceclaim controller
    their claims, the kubelets unprepare them. Returns seconds until no pod or claim is left."""
    t0 = time.monotonic()
    with contextlib.suppress(NotFound):
        kube.request(
            "DELETE",
            f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs/{job}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )

    def gone() -> bool:
        pods = job_pods(kube, namespace, job)
        claims = kube.request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")["items"]
        try:
            kube.request("GET", f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs/{job}")
            exists = True
        except NotFound:
            exists = False
        return not pods and not claims and not exists

    wait_for(gone, timeout, 0.5, f"MPIJob {job}, its pods and claims gone")
    return time.monotonic() - t0


def format_report(r: JobReport) -> list[str]:
    """Human-readable lines (``make demo`` and the test's output)."""
    lines = [f"MPIJob {r.job} (workers' claims from template {r.template})"]
    lines.append(f"  operator made: {', '.join(sorted(r.objects)) or '-'}; launcher Job: {r.launcher}")
    lines.append(f"  MPIJob conditions: {'; '.join(r.conditions) or '-'}")
    for p in r.pods:
        state = "Ready" if p.ready else p.phase
        lines.append(f"  pod {p.name:<34} {p.role:<8} node {p.node or '-':<14} {state}")
        if p.claim:
            gpu_numa = sorted({n for _, n in p.claim.gpus if n is not None})
            nic_numa = sorted({n for _, n, _ in p.claim.nics if n is not None})
            lines.append(f"      claim {p.claim.name}: GPUs {', '.join(d for d, _ in p.claim.gpus)} on NUMA {gpu_numa}")
            lines.append(
                f"      NICs {', '.join(f'{d} ({i})' if i else d for d, _, i in p.claim.nics)} on NUMA {nic_numa}: "
                + ("aligned with the GPUs" if nic_numa == gpu_numa else "the other NUMA node than the GPUs")
            )
        if p.why_not_running:
            lines.append(f"      {p.why_not_running}")
    return lines


def main() -> int:
    """CLI: build (or reuse) the training example's image for this machine and print it."""
    img = worker_image()
    print(f"{img.ref} {img.path} (tagged as {', '.join(seed_images())} on every node)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
