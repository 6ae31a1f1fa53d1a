"""The chart's conventions, rendered by real helm: the webhook's disruption budget and spreading,
the PrometheusRule and the Grafana dashboard behind their values, the RDMA DeviceClass, the
viewer role, the image it refuses, one spelling per setting (aliases warned about), NOTES.txt,
misspelt values refused by the schema, and the chart README generated from values.yaml."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.repo.test_chart import CHART, KUBE_VERSION, ROOT, by_kind, one, render, run_helm

WEBHOOK_LABELS = {"app.kubernetes.io/name": "dranet", "app.kubernetes.io/instance": "dranet"}


def webhook_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    dep = one(docs, "Deployment")
    labels: dict[str, str] = dep["spec"]["template"]["metadata"]["labels"]
    return labels


def test_webhook_budget_and_spreading(helm: str) -> None:
    docs = render(helm)
    pdb = one(docs, "PodDisruptionBudget")
    labels = webhook_pod_labels(docs)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    affinity = one(docs, "Deployment")["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    # One replica: a budget would block every drain; turned off: none; an affinity of one's own wins.
    assert not by_kind(render(helm, "webhook.replicas=1"), "PodDisruptionBudget")
    assert not by_kind(render(helm, "webhook.podDisruptionBudget.enabled=false"), "PodDisruptionBudget")
    own = render(helm, "webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution=null")
    assert "podAntiAffinity" not in (one(own, "Deployment")["spec"]["template"]["spec"].get("affinity") or {})
    assert (
        one(render(helm, "webhook.podDisruptionBudget.maxUnavailable=50%"), "PodDisruptionBudget")["spec"][
            "maxUnavailable"
        ]
        == "50%"
    )


def test_prometheus_rule(helm: str, tmp_path: Path) -> None:
    assert not by_kind(render(helm), "PrometheusRule")
    rule = one(render(helm, "prometheus.rule.enabled=true", "prometheus.rule.labels.release=kps"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {
        "DranetSlicesNotPublished",
        "DranetClaimDevicesNotReady",
        "DranetNRIHookFailures",
        "DranetStateWriteFailures",
        "DranetDeviceUnhealthy",
    }
    assert alerts["DranetSlicesNotPublished"]["expr"].endswith("> 600")
    assert alerts["DranetClaimDevicesNotReady"]["for"] == "5m"
    assert "dranet_driver_state_write_failures_total" in alerts["DranetStateWriteFailures"]["expr"]
    # Prometheus' own templates ({{ $labels.node }}) reach Prometheus unexpanded.
    assert "{{ $labels.node }}" in alerts["DranetSlicesNotPublished"]["annotations"]["summary"]
    rule_values = {"enabled": True, "publishStaleMinutes": 3, "notReadyMinutes": 7, "nriFailureRatio": 0.2}
    tuned = one(render(helm, values={"prometheus": {"rule": rule_values}}, tmp=tmp_path), "PrometheusRule")
    alerts = {r["alert"]: r for g in tuned["spec"]["groups"] for r in g["rules"]}
    assert alerts["DranetSlicesNotPublished"]["expr"].endswith("> 180")
    assert alerts["DranetClaimDevicesNotReady"]["for"] == "7m" and alerts["DranetDeviceUnhealthy"]["for"] == "7m"
    assert alerts["DranetNRIHookFailures"]["expr"].rstrip().endswith("> 0.2")


def test_grafana_dashboard_configmap(helm: str) -> None:
    assert not [d for d in by_kind(render(helm), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    cm = one(render(helm, "grafana.dashboard.enabled=true", "grafana.dashboard.namespace=monitoring"), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "dranet.json").read_text())
    assert json.loads(cm["data"]["dranet.json"]) == shipped
    assert shipped["uid"] and shipped["panels"] and all(p["targets"] for p in shipped["panels"])


def test_rdma_device_class(helm: str) -> None:
    assert len(by_kind(render(helm), "DeviceClass")) == 1
    classes = {c["metadata"]["name"]: c for c in by_kind(render(helm, "rdmaDeviceClass.enabled=true"), "DeviceClass")}
    assert set(classes) == {"dranet.net", "rdma.dranet.net"}
    expression = " ".join(classes["rdma.dranet.net"]["spec"]["selectors"][0]["cel"]["expression"].split())
    assert expression == 'device.driver == "dra.net" && device.attributes["dra.net"].rdma == true'


def test_extra_device_classes_from_the_sriov_example(helm: str, tmp_path: Path) -> None:
    """examples/sriov/values.yaml: one DeviceClass per device plugin pool, its selector ANDed with
    this driver's name (also a renamed driver), its extended resource name kept."""
    values = yaml.safe_load((ROOT / "examples/sriov/values.yaml").read_text())
    docs = render(helm, "driverName=net.example.com", values=values, tmp=tmp_path)
    classes = {c["metadata"]["name"]: c for c in by_kind(docs, "DeviceClass")}
    assert set(classes) == {"dranet.net", "sriov-pool-a.dranet.net", "sriov-rdma.dranet.net"}
    pool = classes["sriov-pool-a.dranet.net"]["spec"]
    assert pool["extendedResourceName"] == "intel.com/sriov_pool_a"
    assert pool["selectors"][0]["cel"]["expression"] == (
        'device.driver == "net.example.com" && (has(device.attributes["dra.net"].pfName) && '
        'device.attributes["dra.net"].pfName == "ens1f0np0")'
    )


@pytest.mark.parametrize(
    ("item", "why"),
    [
        ({"name": "a.dranet.net"}, "selector"),
        ({"name": "A B", "selector": "true"}, "name"),
        ({"name": "a", "selector": "true", "extendedResourceName": "no-slash"}, "extendedResourceName"),
    ],
)
def test_schema_refuses_a_bad_extra_device_class(helm: str, tmp_path: Path, item: dict[str, Any], why: str) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"extraDeviceClasses": [item]}))
    out = run_helm(helm, "template", "d", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(path))
    assert out.returncode != 0, f"{item} was accepted"
    assert "schema" in out.stderr.lower() and why in out.stderr, out.stderr


def test_viewer_role(helm: str) -> None:
    docs = render(helm)
    (viewer,) = [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "dranet-viewer"]
    assert viewer["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices", "deviceclasses"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert [b["metadata"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == ["dranet"]
    bound = [b for b in by_kind(render(helm, "rbac.viewer.bindAuthenticated=true"), "ClusterRoleBinding")]
    (binding,) = [b for b in bound if b["metadata"]["name"] == "dranet-viewer"]
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
    ]


def test_default_image_is_the_release_path_and_version(helm: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = f"{values['image']['repository']}:{chart['appVersion']}"
    docs = render(helm)
    assert one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] == image


@pytest.mark.parametrize(
    ("repository", "why"),
    [
        ("ghcr.io/dranet-py/dranet", "a placeholder that was never published"),
        ("registry.k8s.io/networking/dranet", "the Go driver's image"),
    ],
)
def test_an_image_known_unpublished_is_refused_with_what_to_set(helm: str, repository: str, why: str) -> None:
    out = run_helm(
        helm, "template", "d", str(CHART), "--kube-version", KUBE_VERSION, "--set", f"image.repository={repository}"
    )
    assert out.returncode != 0
    assert f"image.repository={repository}: {why}" in out.stderr
    assert "Remove that override" in out.stderr and "--set image.repository=" in out.stderr


def notes(helm: str, tmp: Path, *sets: str) -> str:
    """NOTES.txt as helm renders it for an install (`helm template` prints no NOTES: the file is
    rendered through a probe template in a copy of the chart)."""
    chart = tmp / "chart"
    if chart.exists():
        shutil.rmtree(chart)
    shutil.copytree(CHART, chart)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_probe_notes.tpl").write_text('{{- define "probe.notes" -}}\n' + text + "{{- end -}}\n")
    probe = 'data: {notes: {{ include "probe.notes" . | quote }}}\n'
    (chart / "templates" / "zz-probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n" + probe
    )
    args = ["template", "dranet", str(chart), "--kube-version", KUBE_VERSION, "--namespace", "kube-system"]
    for s in sets:
        args += ["--set", s]
    out = run_helm(helm, *args, "--show-only", "templates/zz-probe.yaml")
    assert out.returncode == 0, out.stderr
    return str(yaml.safe_load(out.stdout)["data"]["notes"])


def test_notes_say_what_to_check_with_kubectl(helm: str, tmp_path: Path) -> None:
    text = notes(helm, tmp_path)
    assert "python3" not in text
    for command in (
        "kubectl -n kube-system rollout status daemonset/dranet",
        "kubectl get resourceslices --field-selector spec.driver=dra.net",
        "kubectl -n kube-system logs daemonset/dranet",
        ":9177/proxy/readyz",
        "kubectl get deviceclass dranet.net",
        "kubectl dranet doctor --driver-namespace kube-system",
        "kubectl create clusterrolebinding dranet-viewer --clusterrole=dranet-viewer --group=system:authenticated",
    ):
        assert command in text, command
    assert "WARNING" not in text
    rdma = notes(helm, tmp_path, "rdmaDeviceClass.enabled=true", "rbac.viewer.bindAuthenticated=true")
    assert "kubectl get deviceclass dranet.net rdma.dranet.net" in rdma
    assert "kubectl create clusterrolebinding" not in rdma


@pytest.mark.parametrize(
    ("sets", "warned"),
    [
        (["args.filter=x", "filter=y"], "filter and its alias args.filter"),
        (["args.cloudProviderHint=GCE", "cloudProvider=gce"], "cloudProvider and its alias args.cloudProviderHint"),
        (["args.featureGates=DRAListTypeAttributes=true", "featureGates=DRAListTypeAttributes=false"], "featureGates"),
        (
            ["args.profileProvider=none", "profiles.provider=cloud"],
            "profiles.provider and its alias args.profileProvider",
        ),
        (["args.filter=x"], None),
        (["filter=y"], None),
    ],
)
def test_a_setting_spelt_twice_is_warned_about(helm: str, tmp_path: Path, sets: list[str], warned: str | None) -> None:
    text = notes(helm, tmp_path, *sets)
    if warned is None:
        assert "WARNING" not in text
    else:
        (line,) = [ln for ln in text.splitlines() if ln.startswith("WARNING")]
        assert warned in line and "is used. Set one of them." in line
    # Whichever is used, it is the alias (the Go chart's values files keep their meaning).
    if "args.filter=x" in sets:
        args = one(render(helm, *sets), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--filter=x" in args and "--filter=y" not in args


@pytest.mark.parametrize(
    ("misspelt", "name"),
    [
        ("prometheus.rule.enabeld=true", "enabeld"),
        ("prometheus.rules.enabled=true", "rules"),
        ("grafana.dashbord.enabled=true", "dashbord"),
        ("rdmaDeviceClass.enable=true", "enable"),
        ("rdmaDeviceclass.enabled=true", "rdmaDeviceclass"),
        ("webhook.podDisruptionBudget.maxUnavailble=1", "maxUnavailble"),
        ("webhook.pdb.enabled=false", "pdb"),
        ("profiles.provder=cloud", "provder"),
        ("rbac.viewer.bindAuthenticatd=true", "bindAuthenticatd"),
        ("image.respository=x", "respository"),
    ],
)
def test_schema_refuses_a_misspelt_value(helm: str, misspelt: str, name: str) -> None:
    out = run_helm(helm, "template", "d", str(CHART), "--kube-version", KUBE_VERSION, "--set", misspelt)
    assert out.returncode != 0, f"--set {misspelt} was accepted"
    assert "schema" in out.stderr.lower() and f"'{name}' not allowed" in out.stderr, out.stderr


@pytest.mark.parametrize(
    "bad",
    [
        "prometheus.rule.notReadyMinutes=0",
        "prometheus.rule.publishStaleMinutes=1",
        "webhook.podDisruptionBudget.maxUnavailable=0",
    ],
)
def test_schema_refuses_a_bad_value(helm: str, bad: str) -> None:
    out = run_helm(helm, "template", "d", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad)
    assert out.returncode != 0 and "schema" in out.stderr.lower(), out.stderr


def test_chart_readme_is_generated_from_values() -> None:
    """charts/dranet/README.md is what hack/chart-readme.py writes (CI fails on drift), and every
    value in it is described."""
    out = subprocess.run([sys.executable, "hack/chart-readme.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = [ln for ln in (CHART / "README.md").read_text().splitlines() if ln.startswith("| `")]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert len(rows) > 60
    undocumented = [r.split("|")[1].strip() for r in rows if not r.rstrip(" |").split("|")[-1].strip()]
    assert not undocumented, undocumented
    assert '| `image.repository` | `"' + values["image"]["repository"] + '"` |' in "\n".join(rows)


def test_chart_readme_drift_is_caught(tmp_path: Path) -> None:
    """The check is not a no-op: a changed comment makes it fail until the README is regenerated."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("chart_readme", ROOT / "hack" / "chart-readme.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    chart = tmp_path / "dranet"
    shutil.copytree(CHART, chart)
    before = module.render(chart)
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("# Replicas of the webhook Deployment.", "# How many webhooks."))
    after = module.render(chart)
    assert before != after and "| `webhook.replicas` | `2` | How many webhooks. |" in after
