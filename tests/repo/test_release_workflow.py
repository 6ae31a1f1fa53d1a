"""The release workflow (.github/workflows/release.yaml): actionlint-clean, its builds are the
`make` targets the tests run, it pushes, signs and SBOMs what the chart and the docs name, and its
version check (run here as written) refuses a tag the chart or package disagrees with. The push
itself needs the registry and GitHub's OIDC identity: it cannot run here.

The README's install command runs here too, against `make chart-oci`'s layout served as a local
OCI registry in place of the project's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.repo.test_chart_oci import layout, layout_registry  # noqa: F401 - the layout fixture

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
ACTIONLINT_VERSION = "v1.7.12"


def workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def runs(job: dict[str, Any]) -> list[str]:
    return [step.get("run", "") for step in job["steps"]]


def uses(job: dict[str, Any]) -> list[str]:
    return [step.get("uses", "") for step in job["steps"]]


@pytest.fixture(scope="module")
def actionlint() -> str:
    """actionlint, built from its Go module into the cache on first use (like helm)."""
    from devcluster.builders.binaries import cache_root

    path = cache_root() / "actionlint" / ACTIONLINT_VERSION / "actionlint"
    if not path.is_file():
        go = shutil.which("go")
        if not go:
            pytest.skip("no go to build actionlint")
        env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOBIN=str(path.parent))
        subprocess.run(
            [
                go,
                "install",
                "-trimpath",
                "-ldflags=-s -w",
                f"github.com/rhysd/actionlint/cmd/actionlint@{ACTIONLINT_VERSION}",
            ],
            check=True,
            env=env,
            capture_output=True,
            timeout=600,
        )
    return str(path)


def test_actionlint_is_clean(actionlint: str) -> None:
    out = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_builds_are_the_make_targets_the_tests_run() -> None:
    jobs = workflow()["jobs"]
    assert "make image" in runs(jobs["image"]) and "make chart-oci" in runs(jobs["chart"])
    makefile = (ROOT / "Makefile").read_text()
    for target in ("image", "chart-oci"):
        assert re.search(rf"^{target}: ", makefile, re.M), target
    # Both architectures, each on a native runner.
    archs = {(m["arch"], m["runner"]) for m in jobs["image"]["strategy"]["matrix"]["include"]}
    assert archs == {("amd64", "ubuntu-24.04"), ("arm64", "ubuntu-24.04-arm")}
    assert workflow()[True]["push"]["tags"] == ["v*.*.*"]  # YAML 1.1 reads the key `on` as true


def test_it_pushes_and_signs_what_the_chart_and_docs_name() -> None:
    wf = workflow()
    image, chart_repo = wf["env"]["IMAGE"], wf["env"]["CHART_REPO"]
    values = yaml.safe_load((ROOT / "charts/dranet/values.yaml").read_text())
    assert values["image"]["repository"] == image
    install = f"helm install dranet oci://{chart_repo}/dranet --version"
    for doc in ("README.md", "docs/install.md", "charts/dranet/README.md"):
        assert install in (ROOT / doc).read_text(), doc
    jobs = wf["jobs"]
    publish = "\n".join(runs(jobs["publish-image"]))
    assert 'cosign sign --yes "$IMAGE@' in publish and "cosign attest --yes --type spdxjson" in publish
    assert any(u.startswith("anchore/sbom-action@") for u in uses(jobs["publish-image"]))
    assert 'cosign sign --yes "$CHART_REPO/dranet@$digest"' in "\n".join(runs(jobs["chart"]))
    # Keyless signing needs the OIDC token; only the jobs that sign get it.
    signing = {name for name, job in jobs.items() if "id-token" in (job.get("permissions") or {})}
    assert signing == {"publish-image", "chart"}
    assert wf["permissions"] == {"contents": "read"}


def version_check() -> str:
    """The Python the `version` job runs (its heredoc), as written."""
    step = next(s for s in workflow()["jobs"]["version"]["steps"] if s.get("id") == "check")
    return str(step["run"].split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])


@pytest.mark.parametrize(
    ("tag", "image", "ok", "says"),
    [
        ("0.1.0", "ghcr.io/dranet-py/dranet-py", True, ""),
        ("0.2.0", "ghcr.io/dranet-py/dranet-py", False, "Chart.yaml appVersion is 0.1.0, the tag says 0.2.0"),
        ("0.1.0", "ghcr.io/someone/else", False, "values.yaml image.repository is ghcr.io/dranet-py/dranet-py"),
    ],
)
def test_the_version_check_refuses_a_disagreeing_tag(tag: str, image: str, ok: bool, says: str) -> None:
    from driver import __version__

    assert __version__ == "0.1.0" or not ok  # the cases are written for the current version
    out = subprocess.run(
        [sys.executable, "-c", version_check(), tag, image], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (out.returncode == 0) == ok, out.stdout + out.stderr
    assert says in out.stdout


def readme_install_command() -> list[str]:
    """The first `helm install ... oci://` line of the README's install section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install on a real cluster", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("helm install ") and "oci://" in ln)
    return shlex.split(line)


def test_readme_install_command_runs_against_the_chart_layout(helm: str, layout: Path) -> None:  # noqa: F811
    """`helm install dranet oci://<project>/charts/dranet --version V -n kube-system` from the README,
    with the registry host replaced by a local one serving `make chart-oci`'s layout, rendered
    (`template` for `install`: no cluster here) with every default: the chart installs as the
    README says, and names the release image."""
    argv = readme_install_command()
    ref = next(a for a in argv if a.startswith("oci://"))
    registry, _, repo = ref.removeprefix("oci://").partition("/")
    assert registry == "ghcr.io"
    server = layout_registry(layout, repo)
    try:
        host, port = server.server_address[:2]
        local = [a.replace(f"oci://{registry}/", f"oci://{host}:{port}/") for a in argv]
        assert local[:2] == ["helm", "install"]
        cmd = [helm, "template", *local[2:], "--plain-http", "--kube-version", "1.34.0"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    version = argv[argv.index("--version") + 1]
    assert ds["metadata"]["namespace"] == "kube-system"
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"{workflow()['env']['IMAGE']}:{version}"
