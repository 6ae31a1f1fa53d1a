"""The seed's MPIJobs (``examples/distributed_training/mpi-job-4gpu-4nic-numa-*.yaml``), unchanged,
under the real MPI Operator, on the real node plus one Node object without a kubelet.

What is real and what is not:

* the MPI Operator ``v0.8.2`` (``devcluster.mpi_operator``), built from its Go module, runs as
  upstream's standalone overlay deploys it: a Deployment in namespace ``mpi-operator`` with its
  own ServiceAccount and ClusterRole, here from a local image and on the real node;
* the seed's MPIJob and ResourceClaimTemplate files are applied exactly as they are (only the
  namespace is chosen), and the ConfigMap ``ddp-benchmark-scripts`` is made from the seed's
  ``kustomization.yaml`` ``configMapGenerator`` (the same files, the same name);
* the image: the seed's ``registry.example.com/dranet/pytorch-mpi:25.09`` cannot be pulled here.
  :func:`map_seed_images` tags a stand-in (``devcluster/mpi-worker.Dockerfile``: Debian with bash
  and OpenSSH's sshd, what the seed's ``worker.sh`` runs) under that very name in the node's
  containerd (namespace ``k8s.io``), so the unchanged manifests start it (``IfNotPresent``);
* the seed asks for 2 workers with required anti-affinity on ``kubernetes.io/hostname``; there is
  one real node, so :class:`KubeletlessNode` adds a second Node object with the same GPUs and
  NICs published (the dra.net slice made by the driver's own discovery from the same ND H100 v5
  sysfs fixture, the GPU double's slice) and NO kubelet: the scheduler allocates the second
  worker's claim there and binds it, but nothing ever starts it. It stays Pending, so with the
  seed's ``launcherCreationPolicy: WaitForWorkersReady`` the operator never creates the launcher.
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

from devcluster import gpu_double, mpi_operator
from devcluster.binaries import Progress, _print_progress
from devcluster.controlplane import load_yaml_docs, wait_for
from devcluster.driver_image import base_key, bud, build_base, build_once
from devcluster.images import ImageArchive, images_dir, import_image, tag_image
from devcluster.node_layout import NodeLayout
from driver.config import DEFAULT_FILTER, DRIVER_NAME
from driver.dra.slices import build_slices
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, NotFound

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
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
    """The stand-in for the seed's image (``mpi-worker.Dockerfile`` on the driver image's Debian
    base), built with buildah on first use and cached by content hash."""
    key = hashlib.sha256(base_key().encode() + WORKER_DOCKERFILE.read_bytes()).hexdigest()[:16]
    ref = f"{WORKER_REPO}:{key}"
    out = images_dir() / f"mpi-worker-{key}.tar"

    def build() -> ImageArchive:
        base = build_base(progress)
        progress(f"[mpi worker image] buildah bud {WORKER_DOCKERFILE.name} -> {ref} (apt inside)")
        with tempfile.TemporaryDirectory(prefix="dn-mpiw-") as context:
            return bud(WORKER_DOCKERFILE, Path(context), ref, out, progress, "mpi worker image", {"DEBIAN_IMAGE": base})

    return build_once(ref, out, build, WORKER_REPO, "mpi-worker-*.tar")


def seed_images() -> list[str]:
    """Every container image the seed's MPIJobs name (read from the files, not assumed)."""
    images = set()
    for path in MPIJOB_FILES.values():
        job = yaml.safe_load(path.read_text())
        for spec in job["spec"]["mpiReplicaSpecs"].values():
            images |= {c["image"] for c in spec["template"]["spec"]["containers"]}
    return sorted(images)


def map_seed_images(ctr: Path, address: str, stand_in: ImageArchive) -> list[str]:
    """Import the stand-in and tag it under each seed image name in the node's containerd."""
    import_image(ctr, address, stand_in)
    names = seed_images()
    for name in names:
        tag_image(ctr, address, stand_in.ref, name)
    return names


# -- the operator ---------------------------------------------------------------------------------


def operator_objects(
    built: mpi_operator.OperatorBuild, api_env: list[dict[str, str]], node: str
) -> list[dict[str, Any]]:
    """Upstream's standalone overlay (``manifests/overlays/standalone``) done in Python: namespace
    ``mpi-operator``, ``--lock-namespace=mpi-operator``; plus what this cluster needs: the local
    image (never pulled), the apiserver address (no service proxy), the real node."""
    ns = mpi_operator.NAMESPACE
    docs = mpi_operator.load_manifests(built)
    for d in docs:
        if d["kind"] in ("ServiceAccount", "Deployment"):
            d["metadata"]["namespace"] = ns
        if d["kind"] == "ClusterRoleBinding":
            for s in d["subjects"]:
                s["namespace"] = ns
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            c = pod["containers"][0]
            c["args"] = [*c.get("args", []), f"--lock-namespace={ns}"]
            c["image"], c["imagePullPolicy"] = mpi_operator.IMAGE, "Never"
            c["env"] = [*c.get("env", []), *api_env]
            pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, *docs]


def _plural_path(obj: dict[str, Any]) -> str:
    kind, api = obj["kind"], obj["apiVersion"]
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    plural = {
        "Namespace": "namespaces",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "CustomResourceDefinition": "customresourcedefinitions",
        "Deployment": "deployments",
        "ConfigMap": "configmaps",
        "MPIJob": "mpijobs",
        "ResourceClaimTemplate": "resourceclaimtemplates",
    }[kind]
    ns = obj["metadata"].get("namespace")
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


def apply(kube: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Create ``obj``, or replace it if it exists (``kubectl apply`` for these few kinds)."""
    path = _plural_path(obj)
    try:
        return kube.request("POST", path, obj)
    except Conflict:
        name = obj["metadata"]["name"]
        current = kube.request("GET", f"{path}/{name}")
        body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        return kube.request("PUT", f"{path}/{name}", body)


def install_operator(
    kube: KubeClient, ctr: Path, address: str, api_env: list[dict[str, str]], node: str, progress: Progress
) -> mpi_operator.OperatorBuild:
    """Build (or reuse) and run the MPI Operator; returns once its Deployment is available."""
    built = mpi_operator.build(progress=progress)
    import_image(ctr, address, mpi_operator.operator_image(built))
    for obj in operator_objects(built, api_env, node):
        apply(kube, obj)
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/mpijobs.kubeflow.org"

    def established() -> bool:
        conds = kube.request("GET", crd).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, 60, 0.2, "the MPIJob CRD established")
    dep = f"/apis/apps/v1/namespaces/{mpi_operator.NAMESPACE}/deployments/mpi-operator"
    wait_for(lambda: kube.request("GET", dep).get("status", {}).get("availableReplicas"), 180, 0.5, "the MPI Operator")
    return built


def uninstall_operator(kube: KubeClient) -> None:
    """Remove the operator, its RBAC and the CRD (with every MPIJob)."""
    paths = [
        f"/api/v1/namespaces/{mpi_operator.NAMESPACE}",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/mpi-operator",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/mpi-operator",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/kubeflow-mpijobs-admin",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/kubeflow-mpijobs-edit",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/kubeflow-mpijobs-view",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/mpijobs.kubeflow.org",
    ]
    for path in paths:
        with contextlib.suppress(NotFound):
            kube.request("DELETE", path)


# -- the second node ------------------------------------------------------------------------------


class KubeletlessNode:
    """A Node object with no kubelet, publishing the same GPUs and NICs as the real node."""

    def __init__(self, kube: KubeClient, layout: NodeLayout, name: str = "nd-h100-v5-1") -> None:
        self.kube = kube
        self.layout = layout
        self.name = name

    def create(self) -> None:
        """The Node (status set as a kubelet would: allocatable pods), then its two slices."""
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        res = {"pods": "110", "cpu": "96", "memory": "1800Gi"}
        status = {
            "capacity": res,
            "allocatable": res,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NoKubelet",
                    "message": "a Node object without a kubelet: pods bound here are never started",
                }
            ],
        }
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels}}
        node = self.kube.request("POST", "/api/v1/nodes", body)
        self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": status},
            content_type="application/merge-patch+json",
        )
        uid = node["metadata"]["uid"]
        # What dranet publishes for an ND H100 v5 (the same fixture the real node's driver reads),
        # made by the driver's own discovery and slice code; and the GPU double's slice.
        scanner = Scanner(str(self.layout.sysfs), netlink=False, exclude_interfaces=["eth0"])
        devices = DeviceFilter(DEFAULT_FILTER).apply(scanner.scan())
        for body in build_slices(devices, DRIVER_NAME, self.name, uid):
            self.kube.create_resource_slice(body)
        self.kube.request("POST", f"{RESOURCE_API}/resourceslices", gpu_double.gpu_slice(self.name, uid))

    def pods(self) -> list[dict[str, Any]]:
        """Every pod bound to this node."""
        items: list[dict[str, Any]] = self.kube.request(
            "GET", "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={self.name}"}
        )["items"]
        return items

    def reap(self) -> int:
        """Do the one thing a kubelet does for a deleted pod: confirm it is gone (grace 0).
        Returns how many terminating pods were removed."""
        n = 0
        for pod in self.pods():
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                with contextlib.suppress(NotFound):
                    self.kube.request(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                    )
                    n += 1
        return n

    def delete(self) -> None:
        """Remove its pods (grace 0), slices and the Node."""
        for pod in self.pods():
            meta = pod["metadata"]
            with contextlib.suppress(NotFound):
                self.kube.request(
                    "DELETE",
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                )
        self.kube.request(
            "DELETE", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={self.name}"}
        )
        with contextlib.suppress(NotFound):
            self.kube.request("DELETE", f"/api/v1/nodes/{self.name}")


# -- the seed's objects ---------------------------------------------------------------------------


def scripts_configmap(namespace: str) -> dict[str, Any]:
    """``ddp-benchmark-scripts`` as the seed's kustomization.yaml generates it (same name, files)."""
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
    """The seed's ResourceClaimTemplates (unchanged) and the scripts ConfigMap in ``namespace``."""
    for d in load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml"):
        d["metadata"]["namespace"] = namespace
        apply(kube, d)
    apply(kube, scripts_configmap(namespace))


def load_mpijob(which: str, namespace: str) -> dict[str, Any]:
    """The seed's MPIJob ``which`` ("aligned" or "unaligned") as written, placed in ``namespace``."""
    job: dict[str, Any] = yaml.safe_load(MPIJOB_FILES[which].read_text())
    job["metadata"]["namespace"] = namespace
    return job


# -- what happens ---------------------------------------------------------------------------------


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


def delete_job(kube: KubeClient, namespace: str, job: str, reaper: KubeletlessNode, timeout: float = 180) -> float:
    """Delete the MPIJob; the garbage collector deletes its pods, the resourceclaim controller
    their claims; the real node's kubelet unprepares. Returns seconds until no pod or claim is
    left (the kubelet-less node's pod confirmed gone by :meth:`KubeletlessNode.reap`)."""
    t0 = time.monotonic()
    with contextlib.suppress(NotFound):
        kube.request(
            "DELETE",
            f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs/{job}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )

    def gone() -> bool:
        reaper.reap()
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


@dataclass
class MPISetup:
    """Everything the seed's MPIJobs need on a running real-node cluster (see :func:`mpi_setup`)."""

    kube: KubeClient
    namespace: str
    second_node: KubeletlessNode
    operator: mpi_operator.OperatorBuild
    seed_images: list[str]


@contextlib.contextmanager
def mpi_setup(
    kube: KubeClient,
    layout: NodeLayout,
    ctr: Path,
    api_env: list[dict[str, str]],
    namespace: str,
    progress: Progress = _print_progress,
) -> Iterator[MPISetup]:
    """The operator running, the seed's image mapped, the kubelet-less node, the namespace with the
    seed's templates and scripts; everything removed again on exit (also on failure)."""
    address = str(layout.containerd_socket)
    second = KubeletlessNode(kube, layout)
    try:
        images = map_seed_images(ctr, address, worker_image(progress))
        built = install_operator(kube, ctr, address, api_env, layout.node_name, progress)
        second.create()
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
        yield MPISetup(kube, namespace, second, built, images)
    finally:
        _teardown(kube, namespace, second)


def _teardown(kube: KubeClient, namespace: str, second: KubeletlessNode) -> None:
    with contextlib.suppress(NotFound):
        kube.request(
            "DELETE", f"{MPIJOBS_API}/namespaces/{namespace}/mpijobs", query={"propagationPolicy": "Background"}
        )
    with contextlib.suppress(NotFound):
        kube.request("DELETE", f"/api/v1/namespaces/{namespace}")

    def emptied() -> bool:
        second.reap()
        pods = kube.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        claims = kube.request("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")["items"]
        return not pods and not claims

    try:
        wait_for(emptied, 180, 0.5, f"namespace {namespace} emptied")
    finally:
        second.delete()
        uninstall_operator(kube)


def main() -> int:
    """CLI: build (or reuse) the seed image's stand-in and print it."""
    img = worker_image()
    print(f"{img.ref} {img.path} (tagged as {', '.join(seed_images())} on the node)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
