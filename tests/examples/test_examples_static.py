"""examples/distributed_training without a cluster: every manifest parses and says what it must."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "distributed_training"
ALIGNED = EXAMPLE_DIR / "mpi-job-4gpu-4nic-numa-aligned.yaml"
UNALIGNED = EXAMPLE_DIR / "mpi-job-4gpu-4nic-numa-unaligned.yaml"
KINDS = {
    ("resource.k8s.io/v1", "DeviceClass"),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"),
    ("kubeflow.org/v2beta1", "MPIJob"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}

# The kubeflow.org/v2beta1 MPIJob fields (mpi-operator v0.6+), closed at the levels we write,
# so a misspelt field (which the CRD's structural schema would silently prune) fails here.
_REPLICA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["replicas", "template"],
    "properties": {
        "replicas": {"type": "integer", "minimum": 1},
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": {
            "type": "object",
            "required": ["spec"],
            "properties": {"spec": {"type": "object", "required": ["containers"]}},
        },
    },
}
MPIJOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mpiReplicaSpecs"],
            "properties": {
                "slotsPerWorker": {"type": "integer", "minimum": 1},
                "runLauncherAsWorker": {"type": "boolean"},
                "sshAuthMountPath": {"type": "string"},
                "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
                "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
                "runPolicy": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                        "ttlSecondsAfterFinished": {"type": "integer"},
                        "activeDeadlineSeconds": {"type": "integer"},
                        "backoffLimit": {"type": "integer"},
                        "schedulingPolicy": {"type": "object"},
                        "suspend": {"type": "boolean"},
                        "managedBy": {"type": "string"},
                    },
                },
                "mpiReplicaSpecs": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["Launcher", "Worker"],
                    "properties": {"Launcher": _REPLICA, "Worker": _REPLICA},
                },
            },
        },
    },
}


def _docs(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _kustomization() -> dict[str, Any]:
    return _docs(EXAMPLE_DIR / "kustomization.yaml")[0]


def _worker_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def test_every_manifest_parses_with_a_known_kind() -> None:
    manifests = sorted(EXAMPLE_DIR.glob("*.yaml"))
    assert len(manifests) >= 6
    for path in manifests:
        docs = _docs(path)
        assert docs, path
        for doc in docs:
            assert (doc.get("apiVersion"), doc.get("kind")) in KINDS, path


@pytest.mark.parametrize("path", [ALIGNED, UNALIGNED], ids=["aligned", "unaligned"])
def test_mpijob_shape(path: Path) -> None:
    (job,) = _docs(path)
    jsonschema.validate(job, MPIJOB_SCHEMA)
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 4
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    worker = _worker_spec(job)
    term = worker["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # mpi-operator labels worker pods with the job name and role; the selector must name this job.
    assert term["labelSelector"]["matchLabels"] == {
        "training.kubeflow.org/job-name": job["metadata"]["name"],
        "training.kubeflow.org/job-role": "worker",
    }
    (claim,) = worker["resourceClaims"]
    (container,) = worker["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
    volumes = {v["name"]: v for v in worker["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert volumes[mounts["/scripts"]]["configMap"]["name"] == _kustomization()["configMapGenerator"][0]["name"]


def test_mpijobs_identical_except_template_name() -> None:
    (aligned,), (unaligned,) = _docs(ALIGNED), _docs(UNALIGNED)
    a_claim = _worker_spec(aligned)["resourceClaims"][0]["resourceClaimTemplateName"]
    u_claim = _worker_spec(unaligned)["resourceClaims"][0]["resourceClaimTemplateName"]
    assert (a_claim, u_claim) == ("h100-4gpu-4nic-numa-aligned", "h100-4gpu-4nic-numa-unaligned")
    patched = copy.deepcopy(unaligned)
    _worker_spec(patched)["resourceClaims"][0]["resourceClaimTemplateName"] = a_claim
    assert patched == aligned


def test_referenced_templates_exist_and_differ_only_in_numa() -> None:
    templates = {d["metadata"]["name"]: d for d in _docs(EXAMPLE_DIR / "resource-claim-template.yaml")}
    for job_path, numa in ((ALIGNED, 0), (UNALIGNED, 1)):
        name = _worker_spec(_docs(job_path)[0])["resourceClaims"][0]["resourceClaimTemplateName"]
        gpu, nic = templates[name]["spec"]["spec"]["devices"]["requests"]
        assert gpu["exactly"]["count"] == nic["exactly"]["count"] == 4
        expr = nic["exactly"]["selectors"][0]["cel"]["expression"]
        assert re.search(r'\["numaNode"\] == (\d+)', expr).group(1) == str(numa)  # type: ignore[union-attr]
    (device_class,) = _docs(EXAMPLE_DIR / "device-class.yaml")
    assert device_class["metadata"]["name"] == "dranet.net"


def test_match_numa_template_uses_a_constraint_not_bus_ids() -> None:
    (tmpl,) = _docs(EXAMPLE_DIR / "resource-claim-template-match-numa.yaml")
    devices = tmpl["spec"]["spec"]["devices"]
    assert [r["name"] for r in devices["requests"]] == ["gpu", "nic"]
    assert devices["constraints"] == [{"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}]
    assert "pciBusID" not in yaml.safe_dump(devices["requests"])
    nic = devices["requests"][1]["exactly"]
    assert nic["deviceClassName"] == "dranet.net" and "rdma" in nic["selectors"][0]["cel"]["expression"]


def test_kustomization_lists_existing_files_and_everything_the_benchmark_imports() -> None:
    kust = _kustomization()
    files = kust["configMapGenerator"][0]["files"]
    for rel in kust["resources"] + files:
        assert (EXAMPLE_DIR / rel).is_file(), rel
    assert set(kust["resources"]) == {"device-class.yaml", "resource-claim-template.yaml"}
    assert kust["generatorOptions"]["disableNameSuffixHash"] is True  # the MPIJobs name it literally
    imported = set(re.findall(r"^import (\w+)", (EXAMPLE_DIR / "benchmark.py").read_text(), re.M))
    local = {p.stem for p in EXAMPLE_DIR.glob("*.py")}
    assert {f"{m}.py" for m in imported & local} <= set(files)
    # Every script the pods run comes from the ConfigMap.
    for job_path in (ALIGNED, UNALIGNED):
        text = job_path.read_text()
        for script in re.findall(r"/scripts/([\w.-]+)", text):
            assert script in files, script
    for script in re.findall(r"/scripts/([\w.-]+)", (EXAMPLE_DIR / "launcher.sh").read_text()):
        assert script in files, script


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_build() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(EXAMPLE_DIR)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("ConfigMap", "ddp-benchmark-scripts"),
        ("DeviceClass", "dranet.net"),
        ("ResourceClaimTemplate", "h100-4gpu-4nic-numa-aligned"),
        ("ResourceClaimTemplate", "h100-4gpu-4nic-numa-unaligned"),
    ]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["data"]["benchmark.py"] == (EXAMPLE_DIR / "benchmark.py").read_text()


@pytest.mark.parametrize("script", ["launcher.sh", "worker.sh", "rank.sh"])
def test_scripts_are_valid_bash(script: str) -> None:
    result = subprocess.run(["bash", "-n", str(EXAMPLE_DIR / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_launcher_does_not_let_mpirun_pin_ranks() -> None:
    # Ranks bind to their own GPU's NUMA node; mpirun binding by rank order would fight that.
    text = (EXAMPLE_DIR / "launcher.sh").read_text()
    assert "--bind-to none" in text


def test_no_fake_torchrun_numa_flags_anywhere() -> None:
    # torchrun has no --cpu-map/--mem-map (a common invention); the real option is --numa-binding.
    docs = [*EXAMPLE_DIR.iterdir(), EXAMPLE_DIR.parent.parent / "docs" / "numa-alignment.md"]
    for path in docs:
        if path.is_file():
            text = path.read_text(errors="replace")
            assert "--cpu-map" not in text and "--mem-map" not in text, path


def test_readme_carries_the_seed_results() -> None:
    text = (EXAMPLE_DIR / "README.md").read_text()
    for value in ("36.06%", "32.83%", "55.496 ms", "60.951 ms", "356.62", "324.70", "MFU_RESULT"):
        assert value in text, value


def _core_objects() -> list[dict[str, Any]]:
    """Every core-API object of the example: DeviceClass, templates, and the MPIJob pod templates as Pods."""
    objs = [
        d
        for path in sorted(EXAMPLE_DIR.glob("*.yaml"))
        for d in _docs(path)
        if d["apiVersion"].startswith("resource.k8s.io/")
    ]
    for job_path in (ALIGNED, UNALIGNED):
        job = _docs(job_path)[0]
        for role, replica in job["spec"]["mpiReplicaSpecs"].items():
            objs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{role.lower()}-0"},
                    "spec": replica["template"]["spec"],
                }
            )
    return objs


def test_core_objects_valid_against_k8s_134_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objs = _core_objects()
    assert sorted({o["kind"] for o in objs}) == ["DeviceClass", "Pod", "ResourceClaimTemplate"]
    for obj in objs:
        # strict: unknown fields are errors, like the apiserver's strict field validation.
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_schema_validation_catches_a_typo() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    pod = next(o for o in _core_objects() if o["kind"] == "Pod" and o["metadata"]["name"] == "worker-0")
    pod = copy.deepcopy(pod)
    pod["spec"]["containers"][0]["securityContext"]["capabilites"] = {"add": ["IPC_LOCK"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, "1.34", strict=True)
