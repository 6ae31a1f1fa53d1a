"""The Kubeflow MPI Operator (``kubeflow.org/v2beta1`` MPIJob), built from its Go module.

* ``build()``: ``github.com/kubeflow/mpi-operator/cmd/mpi-operator`` at :data:`VERSION` from the
  module proxy (checked against sum.golang.org like every module), in a wrapper module, cached
  under ``<cache>/mpi-operator/<version>/bin``. The CRD and the RBAC the operator ships
  (``manifests/base/`` of the same module version) are copied next to the binary, so nothing of
  the operator is vendored into this repository (the CRD alone is 670 kB of generated schema).
* ``operator_image()``: a one-layer image holding only the static binary (no registry, no
  Docker), so the operator runs as upstream deploys it: a Deployment, here on the real node with
  the pod network (the operator's health port is a fixed ``:8080``; in a pod it binds the pod's
  own network namespace, never a port of the host).
* ``install()``: the CRD, the upstream ServiceAccount / ClusterRole / ClusterRoleBinding, and the
  upstream Deployment with the image swapped for the local one (the API server address is passed
  in the environment: the cluster has no service proxy); ``devcluster up`` installs it on the
  first node.

    python -m devcluster.cluster.mpi_operator     # build (or reuse) and print the binary and the CRD
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.builders.binaries import GoBuild, Progress, _print_progress, build_go_tool
from devcluster.builders.images import ImageArchive, _tarinfo, docker_archive, images_dir
from devcluster.cluster.controlplane import wait_for
from driver.kube.client import KubeClient
from driver.kube.errors import Conflict, NotFound

MODULE = "github.com/kubeflow/mpi-operator"
VERSION = "v0.8.2"
"""Newest mpi-operator the module proxy serves (v0.8.1, v0.9.x: not published there); its go.mod
says ``go 1.26.0`` and uses the published k8s.io modules (v0.35.x), so the wrapper module needs
no replace lines. Verified against sum.golang.org by ``go mod download``."""
API_VERSION = "kubeflow.org/v2beta1"
IMAGE = f"localhost/dranet/mpi-operator:{VERSION}"
NAMESPACE = "mpi-operator"  # upstream's namespace (also its leader-election lock namespace)
MANIFESTS = (
    "kubeflow.org_mpijobs.yaml",
    "service-account.yaml",
    "cluster-role.yaml",
    "cluster-role-binding.yaml",
    "deployment.yaml",
)


def gomod(version: str = VERSION) -> str:
    """The wrapper module: the operator's main package as a tool of an otherwise empty module."""
    return (
        "module example.invalid/mpioperator\n\ngo 1.26.0\n\n"
        f"tool {MODULE}/cmd/mpi-operator\n\nrequire {MODULE} {version}\n"
    )


def ldflags(version: str = VERSION) -> str:
    """Version stamps as upstream's Makefile sets them (``mpi-operator --version`` is real)."""
    pkg = f"{MODULE}/pkg/version"
    return f"-s -w -X {pkg}.Version={version} -X {pkg}.GitSHA={version} -X {pkg}.Built=1970-01-01T00:00:00Z"


@dataclass(frozen=True)
class OperatorBuild:
    """The built binary and the upstream manifests of the same version."""

    binary: Path
    manifests: Path  # directory holding MANIFESTS
    seconds: float | None  # build time of the cached build, if recorded


def _module_dir(src: Path, version: str) -> Path:
    out = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", f"{MODULE}@{version}"],
        cwd=src,
        capture_output=True,
        text=True,
        env=dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod"),
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"mpi-operator {version}: module directory not found: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def build(version: str = VERSION, progress: Progress = _print_progress) -> OperatorBuild:
    """Build (or reuse) the operator and copy its manifests next to it."""
    b = GoBuild(packages=(f"{MODULE}/cmd/mpi-operator",), ldflags=ldflags(version))
    bin_dir = build_go_tool("mpi-operator", version, gomod(version), [b], expect=("mpi-operator",), progress=progress)
    base = bin_dir.parent
    manifests = base / "manifests"
    if not all((manifests / m).is_file() for m in MANIFESTS):
        src = _module_dir(base / "src", version) / "manifests" / "base"
        tmp = base / "manifests.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for m in MANIFESTS:
            shutil.copyfile(src / m, tmp / m)
        shutil.rmtree(manifests, ignore_errors=True)
        tmp.rename(manifests)
    seconds_file = base / "build-seconds"
    seconds = float(seconds_file.read_text()) if seconds_file.is_file() else None
    return OperatorBuild(bin_dir / "mpi-operator", manifests, seconds)


def operator_image(built: OperatorBuild) -> ImageArchive:
    """``localhost/dranet/mpi-operator:<version>``: the static binary alone (cached by content)."""
    data = built.binary.read_bytes()
    import hashlib

    key = hashlib.sha256(data).hexdigest()[:16]
    out = images_dir() / f"mpi-operator-{VERSION}-{key}.tar"
    if out.is_file():
        return ImageArchive(IMAGE, out)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo("tmp/", mode=0o1777, kind=tarfile.DIRTYPE))
        tar.addfile(_tarinfo("mpi-operator", size=len(data)), io.BytesIO(data))
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in images_dir().glob("mpi-operator-*.tar"):
        old.unlink(missing_ok=True)
    return docker_archive(buf.getvalue(), IMAGE, ["/mpi-operator"], out)


def load_manifests(built: OperatorBuild) -> list[dict[str, Any]]:
    """The upstream CRD and RBAC documents, as they are in the module."""
    docs: list[dict[str, Any]] = []
    for m in MANIFESTS:
        docs += [d for d in yaml.safe_load_all((built.manifests / m).read_text()) if d]
    return docs


def operator_objects(
    built: OperatorBuild, api_env: list[dict[str, str]], node_selector: dict[str, str], replicas: int
) -> list[dict[str, Any]]:
    """Upstream's standalone overlay (``manifests/overlays/standalone``) done in Python: namespace
    ``mpi-operator``, ``--lock-namespace=mpi-operator``; plus what this cluster needs: the local
    image (never pulled), the apiserver address (no service proxy), the cluster's nodes. With
    ``replicas`` > 1, one replica per node: the operator always elects a leader (15 s lease), so
    a lost node's MPIJobs are still followed by the replica on another node."""
    ns = NAMESPACE
    docs = load_manifests(built)
    for d in docs:
        if d["kind"] in ("ServiceAccount", "Deployment"):
            d["metadata"]["namespace"] = ns
        if d["kind"] == "ClusterRoleBinding":
            for s in d["subjects"]:
                s["namespace"] = ns
        if d["kind"] == "Deployment":
            d["spec"]["replicas"] = replicas
            labels = d["spec"]["template"]["metadata"]["labels"]
            pod = d["spec"]["template"]["spec"]
            c = pod["containers"][0]
            c["args"] = [*c.get("args", []), f"--lock-namespace={ns}"]
            c["image"], c["imagePullPolicy"] = IMAGE, "Never"
            c["env"] = [*c.get("env", []), *api_env]
            pod["nodeSelector"] = dict(node_selector)
            term = {"labelSelector": {"matchLabels": dict(labels)}, "topologyKey": "kubernetes.io/hostname"}
            pod["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
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


def install(
    kube: KubeClient, api_env: list[dict[str, str]], node_selector: dict[str, str], replicas: int
) -> OperatorBuild:
    """Apply the CRD, RBAC and Deployment (image already in the nodes' containerd); returns once
    the CRD is established (`available` says when the operator runs)."""
    built = build(progress=lambda _m: None)
    for obj in operator_objects(built, api_env, node_selector, replicas):
        apply(kube, obj)
    crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/mpijobs.kubeflow.org"

    def established() -> bool:
        conds = kube.request("GET", crd).get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, 60, 0.2, "the MPIJob CRD established")
    return built


def available(kube: KubeClient) -> bool:
    """Every replica of the operator's Deployment is available."""
    dep = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/mpi-operator")
    return dep.get("status", {}).get("availableReplicas", 0) >= dep["spec"].get("replicas", 1)


def uninstall(kube: KubeClient) -> None:
    """Remove the operator, its RBAC and the CRD (with every MPIJob)."""
    paths = [
        f"/api/v1/namespaces/{NAMESPACE}",
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


def main() -> int:
    """CLI: build (or reuse) the operator and its image; print where they are."""
    t0 = time.monotonic()
    built = build()
    img = operator_image(built)
    print(f"mpi-operator {VERSION}: {built.binary} (built in {built.seconds}s), manifests {built.manifests}")
    print(f"{img.ref} {img.path}")
    print(f"ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
