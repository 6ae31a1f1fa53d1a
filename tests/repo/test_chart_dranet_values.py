"""The Go driver's chart values in charts/dranet: `args.*` mapped to this driver's flags (or refused
with the reason), `prometheus.monitor.*` as a PodMonitor, and a whole Go-chart values file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.cli import build_parser, go_flag_problems
from driver.config import DEFAULT_FILTER, config_from_args
from driver.inventory.device_filter import DRANET, DeviceFilter
from tests.repo.test_chart import CHART, KUBE_VERSION, driver_args, one, render, run_helm

GO_FILTER = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue  != "veth"'

# The keys and default values of the Go chart's values.yaml (deployments/helm/dranet), with
# every commented-out `args` example set: what a user copying that file brings.
GO_CHART_VALUES: dict[str, Any] = {
    "nameOverride": "",
    "fullnameOverride": "",
    "image": {"repository": "registry.example.com/dranet", "tag": "", "pullPolicy": "IfNotPresent"},
    "imagePullSecrets": [],
    "rbac": {"create": True},
    "podAnnotations": {},
    "podLabels": {},
    "logVerbosity": 4,
    "metricsPort": None,
    "metricsPath": "/healthz",
    "prometheus": {"monitor": {"enabled": False, "labels": {}, "interval": "30s"}},
    "args": {
        "filter": GO_FILTER,
        "dbPath": "/var/run/dranet/dranet.db",
        "inventoryMinPollInterval": "2s",
        "inventoryMaxPollInterval": "1m",
        "inventoryPollBurst": 5,
        "moveIBInterfaces": True,
        "cloudProviderHint": "GCE",
        "cloudProviderOptions": {"oke": {"rdma-child-ipv4-cidr": "10.192.0.0/14"}},
        "profileProvider": "cloud",
        "webhookURL": "",
        "slaacReadyTimeout": "1500ms",
        "slaacRollbackReserve": "500ms",
        "featureGates": "",
    },
    "kubeletRootDir": "/var/lib/kubelet",
    "hookBinDir": "/opt/dranet/bin",
    "extraVolumes": [],
    "extraVolumeMounts": [],
    "nodeSelector": {},
    "affinity": {},
    "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "100m", "memory": "50Mi"}, "limits": {}},
    "serviceAccount": {"annotations": {}},
}


def template(helm: str, *sets: str, tmp: Path | None = None, values: dict[str, Any] | None = None) -> str:
    """`helm template` output (stdout and stderr) and asserts nothing: for refusals and NOTES."""
    args = ["template", "dranet", str(CHART), "--namespace", "kube-system", "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        assert tmp is not None
        (tmp / "v.yaml").write_text(yaml.safe_dump(values))
        args += ["-f", str(tmp / "v.yaml")]
    out = run_helm(helm, *args)
    return f"rc={out.returncode}\n{out.stdout}\n{out.stderr}"


def ignored_go_values(helm: str, tmp: Path, values: dict[str, Any]) -> str:
    """What NOTES.txt lists as accepted and ignored (`helm template` renders no NOTES: the
    helper NOTES.txt prints is rendered through a probe template in a copy of the chart)."""
    assert 'include "dranet.ignoredGoValues"' in (CHART / "templates" / "NOTES.txt").read_text()
    chart = tmp / "chart"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        'data: {ignored: {{ include "dranet.ignoredGoValues" . | quote }}}\n'
    )
    (tmp / "v.yaml").write_text(yaml.safe_dump(values))
    args = ["template", "d", str(chart), "--kube-version", KUBE_VERSION, "-f", str(tmp / "v.yaml")]
    out = run_helm(helm, *args, "--show-only", "templates/zz-probe.yaml")
    assert out.returncode == 0, out.stderr
    return str(yaml.safe_load(out.stdout)["data"]["ignored"])


def test_a_go_chart_values_file_installs_with_its_meaning(helm: str, tmp_path: Path) -> None:
    docs = render(helm, values=GO_CHART_VALUES, tmp=tmp_path)
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for d in docs:
        kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
    args = driver_args(docs)
    cli = build_parser().parse_args(args)
    cfg = config_from_args(cli)
    # args.filter in dranet's own syntax, unchanged, and understood as such.
    assert cfg.filter == GO_FILTER and DeviceFilter(cfg.filter).syntax == DRANET
    assert cfg.cloud_provider == "gce" and cfg.publish_interval == 2.0 and cfg.resync_interval == 60.0
    assert cli.verbosity == 4 and cli.profile_provider == "cloud" and cli.move_ib_interfaces == "true"
    # metricsPort: ~ (the Go chart's default) is the binary's default port, probes included.
    assert cfg.bind_address == ":9177"
    container = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["port"] == 9177
    # The Go flags without effect here reach the driver, which logs them as ignored; none refused.
    warnings, errors = go_flag_problems(cli)
    assert errors == [] and len(warnings) == 3  # dbPath, inventoryPollBurst, cloudProviderOptions
    assert "--cloud-provider-options=oke.rdma-child-ipv4-cidr=10.192.0.0/14" in args
    assert not any(a.startswith(("--slaac", "--device-attach", "--webhook-url")) for a in args)
    # featureGates "" (set, empty) overrides the chart's own: no gate passed.
    assert not any(a.startswith("--feature-gates") for a in args)
    assert ignored_go_values(helm, tmp_path, GO_CHART_VALUES) == (
        "args.slaacReadyTimeout, args.slaacRollbackReserve, metricsPath, hookBinDir"
    )


def test_without_args_the_charts_own_values_apply(helm: str, tmp_path: Path) -> None:
    docs = render(helm, "cloudProvider=azure", "featureGates=DRAListTypeAttributes=true")
    args = driver_args(docs)
    cfg = config_from_args(build_parser().parse_args(args))
    assert cfg.filter == DEFAULT_FILTER and cfg.cloud_provider == "azure" and cfg.list_numa_attribute
    assert not any(a.startswith(("--v=", "--db-path", "--inventory", "--move-ib", "--profile")) for a in args)
    assert ignored_go_values(helm, tmp_path, {}) == ""


def test_args_override_the_charts_values_of_the_same_meaning(helm: str) -> None:
    docs = render(
        helm,
        "cloudProvider=azure",
        "args.cloudProviderHint=NONE",
        "featureGates=DRAListTypeAttributes=true",
        "args.featureGates=DRAListTypeAttributes=false",
        "args.inventoryMaxPollInterval=5m",
        "args.profileProvider=none",
    )
    args = driver_args(docs)
    cfg = config_from_args(build_parser().parse_args(args))
    assert cfg.cloud_provider == "none" and not cfg.list_numa_attribute and cfg.resync_interval == 300.0
    assert "--cloud-provider=azure" not in args and "--cloud-provider-hint=NONE" in args


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("args.moveIBInterfaces=false", "args.moveIBInterfaces=false: IB-only mode"),
        ("args.cloudProviderHint=CKS", "args.cloudProviderHint=CKS: not supported by this driver"),
        ("args.cloudProviderHint=webhook", "args.cloudProviderHint=webhook: not supported by this driver"),
        ("args.profileProvider=webhook", "profiles.provider=webhook needs profiles.webhookUrl (or args.webhookURL)"),
    ],
)
def test_what_cannot_work_here_stops_the_install_with_the_reason(helm: str, value: str, message: str) -> None:
    out = template(helm, value)
    assert out.startswith("rc=1") and message in out, out[-2000:]


def test_the_webhook_profile_provider_from_dranets_args(helm: str) -> None:
    args = driver_args(render(helm, "args.profileProvider=webhook", "args.webhookURL=http://profiles.example:8080"))
    assert "--profile-provider=webhook" in args and "--webhook-url=http://profiles.example:8080" in args
    cfg = config_from_args(build_parser().parse_args(args))
    assert cfg.profile_provider == "webhook" and cfg.webhook_url == "http://profiles.example:8080"


@pytest.mark.parametrize(
    "bad",
    ["args.inventoryMinPollInterval=2", "args.cloudProviderHint=gce", "args.unknownFlag=x", "prometheus.monitor.x=1"],
)
def test_schema_rejects_bad_go_values(helm: str, bad: str) -> None:
    out = template(helm, bad)
    assert out.startswith("rc=1") and "values don't meet the specifications of the schema" in out, out[-2000:]


def test_prometheus_monitor_is_a_podmonitor_scraping_every_driver_pod(helm: str) -> None:
    assert not [d for d in render(helm) if d["kind"] == "PodMonitor"]
    docs = render(
        helm,
        "prometheus.monitor.enabled=true",
        "prometheus.monitor.labels.release=kube-prometheus-stack",
        "prometheus.monitor.interval=1m",
        "metricsPort=19177",
    )
    pm = one(docs, "PodMonitor")
    ds = one(docs, "DaemonSet")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == "kube-system"
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # It selects exactly the driver pods (not the webhook's), in the release namespace.
    selector = pm["spec"]["selector"]["matchLabels"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    webhook_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= webhook_labels.items()
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["kube-system"]}
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "1m"
    # No container port to name (hostNetwork): the address is the pod IP and metricsPort.
    ipv4, ipv6, _node = endpoint["relabelings"]
    assert ipv4["targetLabel"] == ipv6["targetLabel"] == "__address__"
    assert ipv4["replacement"] == "${1}:19177" and ipv6["replacement"] == "[${1}]:19177"
    assert "ports" not in ds["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("unset", ["args=null", "prometheus=null", "prometheus.monitor=null", "metricsPort=null"])
def test_values_set_to_null_render(helm: str, unset: str) -> None:
    """A values file may null any Go-chart block (Helm then drops the key): the chart still renders."""
    args = driver_args(render(helm, unset))
    assert "--bind-address=:9177" in args and not [a for a in args if a.startswith("--cloud-provider")]


@pytest.mark.parametrize(("pod_ip", "address"), [("10.0.0.7", "10.0.0.7:9177"), ("fd00::7", "[fd00::7]:9177")])
def test_podmonitor_relabelings_give_a_scrapeable_address(helm: str, pod_ip: str, address: str) -> None:
    """Prometheus' relabel `replace` semantics (anchored regex, ${1}), applied in order."""
    import re

    (endpoint,) = one(render(helm, "prometheus.monitor.enabled=true"), "PodMonitor")["spec"]["podMetricsEndpoints"]
    labels = {"__meta_kubernetes_pod_ip": pod_ip, "__address__": pod_ip}
    for rule in endpoint["relabelings"]:
        source = ";".join(labels.get(name, "") for name in rule["sourceLabels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), source)
        if match:
            labels[rule["targetLabel"]] = match.expand(rule.get("replacement", "$1").replace("${1}", r"\g<1>"))
    assert labels["__address__"] == address


def test_helm_lint_strict_with_go_values(helm: str, tmp_path: Path) -> None:
    values = {**GO_CHART_VALUES, "prometheus": {"monitor": {"enabled": True, "labels": {"a": "b"}, "interval": "30s"}}}
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(values))
    out = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "-f", str(tmp_path / "v.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
