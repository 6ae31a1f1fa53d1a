"""deploy/ is exactly what hack/render-deploy.py renders from the chart (they never drift)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.hack_scripts import load

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _render_module():
    return load("render-deploy.py", "render_deploy")


def test_deploy_matches_chart(helm: str) -> None:
    expected = _render_module().expected_files(helm)
    on_disk = {str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*") if p.is_file()}
    assert on_disk == set(expected), "deploy/ has extra or missing files: run python3 hack/render-deploy.py"
    for rel, text in expected.items():
        assert (DEPLOY / rel).read_text() == text, f"deploy/{rel} is stale: run python3 hack/render-deploy.py"


def test_kustomizations_reference_existing_files() -> None:
    for kfile in DEPLOY.rglob("kustomization.yaml"):
        k = yaml.safe_load(kfile.read_text())
        assert k["kind"] == "Kustomization"
        for res in k["resources"]:
            assert (kfile.parent / res).exists(), f"{kfile}: {res} does not exist"


def test_plain_manifests_are_safe_to_commit() -> None:
    """No generated key material, every namespaced object in kube-system, webhook via cert-manager."""
    for f in DEPLOY.rglob("*.yaml"):
        text = f.read_text()
        assert "PRIVATE KEY" not in text and "tls.key:" not in text, f
    docs = [
        d
        for f in DEPLOY.rglob("*.yaml")
        if f.name != "kustomization.yaml"
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    kinds = [d["kind"] for d in docs]
    assert "Secret" not in kinds and kinds.count("DaemonSet") == 1 and "Certificate" in kinds
    for d in docs:
        if "namespace" in d["metadata"]:
            assert d["metadata"]["namespace"] == "kube-system"
