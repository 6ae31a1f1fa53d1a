"""charts/dranet rendered by real helm: lint, values variants, schema rejections, and every
object validated against the Kubernetes 1.34 OpenAPI schemas (kubernetes-validate)."""

from __future__ import annotations

import base64
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.cli import build_parser
from driver.config import DEFAULT_FILTER, config_from_args

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dranet"
KUBE_VERSION = "1.34.0"
# Kinds without a Kubernetes schema (cert-manager and Prometheus Operator CRDs).
NON_CORE_KINDS = {"Issuer", "Certificate", "PodMonitor", "PrometheusRule"}


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def render(
    helm: str,
    *sets: str,
    release: str = "dranet",
    namespace: str = "kube-system",
    values: dict[str, Any] | None = None,
    tmp: Path | None = None,
) -> list[dict[str, Any]]:
    """`helm template` -> list of objects; ``sets`` are --set arguments."""
    args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    if values is not None:
        assert tmp is not None
        f = tmp / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["-f", str(f)]
    out = run_helm(helm, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


POD_UID = "0f6a4c3e-1b2d-4e5f-8a9b-0c1d2e3f4a5b"


def driver_args(docs: list[dict[str, Any]], node: str = "node-a") -> list[str]:
    """The DaemonSet container args with $(NODE_NAME) and $(POD_UID) expanded as the kubelet would."""
    c = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    return [a.replace("$(NODE_NAME)", node).replace("$(POD_UID)", POD_UID) for a in c["args"]]


def host_mounts(docs: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """volume name -> (hostPath, mountPath) of the driver container."""
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {
        m["name"]: (host[m["name"]], m["mountPath"]) for m in spec["containers"][0]["volumeMounts"] if m["name"] in host
    }


@pytest.mark.timeout(1200)
def test_helm_is_v3(helm: str) -> None:
    """First test to use the fixture: a cold `go install` of helm (~5 min on 2 cores) happens
    here, under a timeout longer than the suite's 300 s default. `make binaries` pre-builds it."""
    out = run_helm(helm, "version", "--short")
    assert out.returncode == 0 and out.stdout.startswith("v3."), out.stdout + out.stderr


VARIANTS = {
    "defaults": [],
    "no-webhook-no-class": ["webhook.enabled=false", "deviceClass.create=false"],
    "custom-paths": [
        "kubeletRootDir=/data/kubelet",
        "stateDir=/data/dranet",
        "nri.socket=/run/alt/nri.sock",
        "driverName=net.example.com",
        "metricsPort=19177",
    ],
    "no-nri-privileged": ["nri.enabled=false", "securityContext.privileged=true", "logLevel=debug"],
    "no-surge-no-taints": [
        "updateStrategy.rollingUpdate.maxSurge=0",
        "updateStrategy.rollingUpdate.maxUnavailable=1",
        "deviceTaints.effect=None",
        "healthInterval=2",
    ],
    "cert-manager": ["webhook.tls.mode=certManager", "webhook.failurePolicy=Ignore"],
    "secret-tls": [
        "webhook.tls.mode=secret",
        "webhook.tls.secretName=my-tls",
        "webhook.tls.caBundle=" + base64.b64encode(b"not-a-real-ca").decode(),
    ],
    "observability-rdma-viewer": [
        "prometheus.monitor.enabled=true",
        "prometheus.rule.enabled=true",
        "grafana.dashboard.enabled=true",
        "rdmaDeviceClass.enabled=true",
        "rbac.viewer.bindAuthenticated=true",
    ],
    "no-rbac-no-vap": [
        "rbac.create=false",
        "serviceAccount.create=false",
        "serviceAccount.name=existing",
        "nodeRestriction.enabled=false",
    ],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint(helm: str, variant: str) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION, "--namespace", "kube-system"]
    for s in VARIANTS[variant]:
        args += ["--set", s]
    out = run_helm(helm, *args)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_object_valid_against_k8s_134_schemas(helm: str, variant: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(helm, *VARIANTS[variant])
    assert docs
    checked = 0
    for d in docs:
        if d["kind"] in NON_CORE_KINDS:
            continue
        # strict: unknown fields are errors, like the apiserver's strict field validation.
        kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 5


def test_schema_validation_catches_a_bad_object(helm: str) -> None:
    """The validator above is not a no-op: a typo'd field and a wrong type are rejected."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    ds = one(render(helm), "DaemonSet")
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE_VERSION, strict=True)
    vap = one(render(helm), "ValidatingAdmissionPolicy")
    vap["spec"]["validations"] = "not-a-list"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(vap, KUBE_VERSION, strict=True)


def test_default_objects(helm: str) -> None:
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",  # <fullname>-viewer: slices and device classes, read-only, bound to nobody
            "ClusterRoleBinding",
            "DaemonSet",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ServiceAccount",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "Secret",
            "ValidatingWebhookConfiguration",
        ]
    )
    for d in docs:
        if d["kind"] not in {
            "ClusterRole",
            "ClusterRoleBinding",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingWebhookConfiguration",
        }:
            assert d["metadata"]["namespace"] == "kube-system", d["kind"]


def test_driver_args_are_accepted_by_the_cli(helm: str) -> None:
    """Every flag the chart passes parses with `dranet`'s own parser, with the chart's values."""
    for variant in ("defaults", "custom-paths", "no-nri-privileged"):
        docs = render(helm, *VARIANTS[variant])
        args = build_parser().parse_args(driver_args(docs))
        assert args.command == "run"
        cfg = config_from_args(args)
        assert cfg.node_name == "node-a"
        if variant == "defaults":
            assert cfg.filter == DEFAULT_FILTER
            assert cfg.driver_name == "dra.net" and cfg.nri_enabled and cfg.bind_address == ":9177"
            assert cfg.exclude_interfaces == [] and cfg.log_level == "info" and cfg.log_format == "json"
        if variant == "no-nri-privileged":
            assert not cfg.nri_enabled and cfg.log_level == "debug"


def test_webhook_args_are_accepted_by_the_cli(helm: str) -> None:
    dep = one(render(helm, "webhook.failurePolicy=Ignore"), "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    assert args.command == "webhook" and args.failure_policy == "Ignore" and args.port == 9443
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert str(Path(args.tls_cert).parent) in mounts and str(Path(args.tls_key).parent) in mounts


def test_webhook_probes_ask_the_serving_loop_over_http(helm: str) -> None:
    """The probes GET /healthz on the health port the webhook serves (--health-port), which its
    event loop answers: a stuck webhook turns unready; a TCP probe would stay green."""
    c = one(render(helm), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.health_port == ports["health"] == 8080
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"} and "tcpSocket" not in probe


def test_network_policy_admits_only_the_api_server(helm: str) -> None:
    """With the API server's addresses known, only they reach the webhook's port; the health port is
    open to the kubelet's probes. Unknown (``helm template`` without them): no policy at all."""
    assert not by_kind(render(helm), "NetworkPolicy")
    docs = render(helm, "webhook.networkPolicy.apiServerCIDRs={10.0.0.1/32,fd00::1/128}")
    policy = one(docs, "NetworkPolicy")
    pytest.importorskip("kubernetes_validate").validate(policy, KUBE_VERSION, strict=True)
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook, health = policy["spec"]["ingress"]
    assert webhook["from"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}]
    assert webhook["ports"] == [{"port": "https", "protocol": "TCP"}]
    assert "from" not in health and health["ports"] == [{"port": "health", "protocol": "TCP"}]
    assert not by_kind(
        render(helm, "webhook.networkPolicy.apiServerCIDRs={10.0.0.1/32}", "webhook.enabled=false"), "NetworkPolicy"
    )
    out = run_helm(helm, "template", "x", str(CHART), "--set", "webhook.networkPolicy.apiServerCIDRs={not-a-cidr}")
    assert out.returncode != 0 and "apiServerCIDRs" in out.stderr


def test_custom_kubelet_root_moves_host_and_mount_paths_and_socket(helm: str) -> None:
    docs = render(helm, *VARIANTS["custom-paths"])
    mounts = host_mounts(docs)
    assert mounts["kubelet-plugins"] == ("/data/kubelet/plugins", "/data/kubelet/plugins")
    assert mounts["kubelet-plugins-registry"] == ("/data/kubelet/plugins_registry", "/data/kubelet/plugins_registry")
    assert mounts["state"] == ("/data/dranet", "/data/dranet")
    assert mounts["nri"] == ("/run/alt", "/run/alt")
    cfg = config_from_args(build_parser().parse_args(driver_args(docs)))
    # The sockets the driver creates are inside a mount whose host path is the same path,
    # so the path the kubelet is given is valid on the host.
    # Per-instance names (rolling update), with the first 8 characters of the pod UID.
    assert cfg.dra_socket == f"/data/kubelet/plugins/net.example.com/dra-{POD_UID[:8]}.sock"
    assert cfg.registration_socket == f"/data/kubelet/plugins_registry/net.example.com-{POD_UID[:8]}-reg.sock"
    for sock in (cfg.dra_socket, cfg.registration_socket, cfg.nri_socket, cfg.state_dir):
        assert any(sock.startswith(m + "/") or sock == m for h, m in mounts.values() if h == m), sock
    ds = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    probe_port = ds["containers"][0]["readinessProbe"]["httpGet"]["port"]
    assert probe_port == 19177 and cfg.bind_address == ":19177"
    # No container port: with hostNetwork it would be a hostPort that keeps a surge pod off the node.
    assert "ports" not in ds["containers"][0]
    dc = one(docs, "DeviceClass")
    assert dc["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "net.example.com"'


def test_default_mounts_and_pod_spec(helm: str) -> None:
    docs = render(helm)
    mounts = host_mounts(docs)
    assert mounts["kubelet-plugins"] == ("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins")
    assert mounts["nri"] == ("/var/run/nri", "/var/run/nri")
    assert mounts["netns"] == ("/var/run/netns", "/var/run/netns")
    assert mounts["infiniband"] == ("/dev/infiniband", "/dev/infiniband")
    # The claims live on the runtime dir's tmpfs (one mount); the older drivers' disk dir is
    # mounted for an update in place.
    assert "state" not in mounts and mounts["runtime"] == ("/run/dranet", "/run/dranet")
    assert mounts["legacy-state"] == ("/var/lib/dranet", "/var/lib/dranet")
    cfg = config_from_args(build_parser().parse_args(driver_args(docs)))
    assert (cfg.state_dir, cfg.legacy_state_dir) == ("/run/dranet/claims", "/var/lib/dranet")
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    prop = {m["name"]: m.get("mountPropagation") for m in c["volumeMounts"]}
    assert prop["netns"] == prop["infiniband"] == "HostToContainer"
    assert spec["hostNetwork"] is True and "hostPID" not in spec
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["tolerations"] == [{"operator": "Exists", "effect": "NoSchedule"}]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert "--instance-id=$(POD_UID)" in c["args"]
    assert "--unhealthy-taint-effect=NoSchedule" in c["args"]
    # Started = this container's instance serves the probe port (hostNetwork: until then an HTTP
    # probe of this pod reaches the older instance of a rolling update): a file only it writes.
    args = build_parser().parse_args(c["args"])
    assert c["startupProbe"]["exec"]["command"] == ["test", "-s", args.probe_port_file]
    assert args.probe_port_file.startswith("/tmp/")
    assert "httpGet" not in c["startupProbe"]
    # Ready = registered with the kubelet and the runtime (and no state problem): a rolling
    # update stops the old pod only then.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9177}
    # Liveness only asks whether the process runs: a full state disk makes the pod unready, and
    # a restart would not fix it.
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": 9177}
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["runAsUser"] == 0
    assert sc["capabilities"] == {"add": ["NET_ADMIN", "SYS_ADMIN"], "drop": ["ALL"]}
    assert spec["serviceAccountName"] == one(docs, "ClusterRoleBinding")["subjects"][0]["name"]


def test_deviceclass_is_the_seed_one(helm: str) -> None:
    dc = one(render(helm), "DeviceClass")
    assert dc["metadata"]["name"] == "dranet.net"
    assert dc["spec"] == {"selectors": [{"cel": {"expression": 'device.driver == "dra.net"'}}]}


EXPECTED_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["list", "watch", "create", "update", "delete"],
    },
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"], "verbs": ["patch", "update"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims/driver"],
        "resourceNames": ["dra.net"],
        "verbs": ["associated-node:patch", "associated-node:update"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def driver_role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The driver's ClusterRole (the other one is the read-only viewer role)."""
    (role,) = [r for r in by_kind(docs, "ClusterRole") if not r["metadata"]["name"].endswith("-viewer")]
    return role


def test_clusterrole_has_exactly_the_verbs_the_driver_uses(helm: str) -> None:
    docs = render(helm)
    assert driver_role(docs)["rules"] == EXPECTED_RULES
    binding = one(docs, "ClusterRoleBinding")
    sa = by_kind(docs, "ServiceAccount")[0]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kube-system"}
    ]
    # The webhook gets no API permissions at all (validation makes no API call).
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    assert len(by_kind(docs, "ClusterRoleBinding")) == 1
    for role in by_kind(docs, "ClusterRole"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]


def test_driver_name_flows_into_rbac_and_policy(helm: str) -> None:
    docs = render(helm, "driverName=net.example.com")
    names = [r.get("resourceNames") for r in driver_role(docs)["rules"]]
    assert ["net.example.com"] in names
    vap = one(docs, "ValidatingAdmissionPolicy")
    assert any('"net.example.com"' in v["expression"] for v in vap["spec"]["validations"])
    assert "system:serviceaccount:kube-system:dranet" in vap["spec"]["matchConditions"][0]["expression"]
    assert one(docs, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == vap["metadata"]["name"]


def test_webhook_off_and_deviceclass_off(helm: str) -> None:
    docs = render(helm, *VARIANTS["no-webhook-no-class"])
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Deployment", "Service", "ValidatingWebhookConfiguration", "Secret", "DeviceClass"}
    assert len(by_kind(docs, "ServiceAccount")) == 1
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds


def test_no_nri_drops_socket_mount(helm: str) -> None:
    docs = render(helm, "nri.enabled=false")
    assert "--no-nri" in driver_args(docs)
    assert "nri" not in host_mounts(docs)
    assert not any(a.startswith("--nri-socket") for a in driver_args(docs))


def test_webhook_configuration(helm: str, tmp_path: Path) -> None:
    from cryptography import x509

    docs = render(helm, "webhook.failurePolicy=Ignore")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    svc = one(docs, "Service")
    assert [w["name"] for w in vwc["webhooks"]] == ["resourceclaims.dra.net", "resourceclaimtemplates.dra.net"]
    secret = one(docs, "Secret")
    for w in vwc["webhooks"]:
        assert w["failurePolicy"] == "Ignore" and w["sideEffects"] == "None"
        assert w["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
        assert w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        (rule,) = w["rules"]
        assert rule["apiGroups"] == ["resource.k8s.io"] and rule["operations"] == ["CREATE"]
        assert '"dra.net"' in w["matchConditions"][0]["expression"]
    # The generated serving cert is signed by the CA in caBundle and names the Service.
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    crt = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    crt.verify_directly_issued_by(ca)
    sans = crt.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"{svc['metadata']['name']}.kube-system.svc" in sans
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_cert_manager_mode_injects_ca(helm: str) -> None:
    docs = render(helm, "webhook.tls.mode=certManager")
    vwc = one(docs, "ValidatingWebhookConfiguration")
    cert = one(docs, "Certificate")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"kube-system/{cert['metadata']['name']}"
    assert all("caBundle" not in w["clientConfig"] for w in vwc["webhooks"])
    assert not by_kind(docs, "Secret")
    dep = one(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] == cert["spec"]["secretName"]


@pytest.mark.parametrize(
    "bad, field",
    [
        ("logLevel=verbose", "logLevel"),
        ("metricsPort=80", "metricsPort"),
        ("kubeletRootDir=relative/path", "kubeletRootDir"),
        ("driverName=Not_A_DNS_Name", "driverName"),
        ("webhook.failurePolicy=Maybe", "failurePolicy"),
        ("webhook.tls.mode=selfSigned", "mode"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("unknownTopLevel=1", "unknownTopLevel"),
        ("nri.enabled=yes-please", "enabled"),
    ],
)
def test_schema_rejects_bad_values(helm: str, bad: str, field: str) -> None:
    out = run_helm(helm, "template", "dranet", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad)
    assert out.returncode != 0, f"--set {shlex.quote(bad)} was accepted"
    assert field in out.stderr and "schema" in out.stderr.lower(), out.stderr


def test_secret_mode_requires_ca_bundle(helm: str) -> None:
    out = run_helm(
        helm,
        "template",
        "dranet",
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "webhook.tls.mode=secret",
        "--set",
        "webhook.tls.secretName=x",
    )
    assert out.returncode != 0 and "webhook.tls.caBundle" in out.stderr


def test_chart_refuses_old_kubernetes(helm: str) -> None:
    out = run_helm(helm, "template", "dranet", str(CHART), "--kube-version", "1.33.0")
    assert out.returncode != 0 and "kubeVersion" in out.stderr


def test_unset_values_leave_the_driver_defaults(helm: str) -> None:
    """filter, cloudProvider and profiles.provider are unset by default: the driver's own defaults
    apply (defined once, in driver.config), and "set" means given by the user."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["filter"] is None and values["cloudProvider"] == "" and values["profiles"]["provider"] == ""
    assert values["metricsPort"] == 9177 and values["driverName"] == "dra.net"
    args = driver_args(render(helm))
    assert not [a for a in args if a.startswith(("--filter", "--cloud-provider", "--profile-provider"))]
    cfg = config_from_args(build_parser().parse_args(args))
    assert (cfg.filter, cfg.cloud_provider, cfg.profile_provider) == (DEFAULT_FILTER, "auto", "cloud")
    # An empty filter is a value: publish everything.
    assert config_from_args(build_parser().parse_args(driver_args(render(helm, "filter=")))).filter == ""


def test_documented_node_role_is_the_charts() -> None:
    """docs/rbac.md's dranet-node role (applied by the status tests) is exactly the chart's."""
    from tests.e2e.test_webhook_apiserver import documented_role

    assert documented_role("dranet-node")["rules"] == EXPECTED_RULES


def test_chart_default_driver_name_is_the_driver_constant() -> None:
    """The chart's driverName (and the install docs' table) default to driver.config.DRIVER_NAME."""
    from driver.config import DRIVER_NAME

    values = yaml.safe_load((ROOT / "charts/dranet/values.yaml").read_text())
    assert values["driverName"] == DRIVER_NAME
    assert f"| `driverName` | `{DRIVER_NAME}` |" in (ROOT / "docs/install.md").read_text()


def test_go_driver_chart_values_work(helm: str, tmp_path: Path) -> None:
    """The values a dranet (Go) chart user brings: name overrides, pod labels/annotations, extra
    args/volumes, pull secrets, scheduling, resources; plus the cloud and feature-gate values."""
    values = {
        "nameOverride": "netdra",
        "fullnameOverride": "dranet-node",
        "podAnnotations": {"prometheus.io/scrape": "true"},
        "podLabels": {"team": "ml"},
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"gpu": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {}},
        "resources": {"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "extraArgs": ["--inventory-max-poll-interval=2m", "--v=4"],
        "extraVolumes": [{"name": "host-config", "hostPath": {"path": "/etc/host-config"}}],
        "extraVolumeMounts": [{"name": "host-config", "mountPath": "/etc/host-config", "readOnly": True}],
        "cloudProvider": "azure",
        "cloudMetadataUrl": "http://imds-proxy.local:8080",
        "featureGates": "DRAListTypeAttributes=true",
        "profiles": {"provider": "webhook", "webhookUrl": "unix:///run/acme/provider.sock"},
    }
    docs = render(helm, values=values, tmp=tmp_path)
    ds = one(docs, "DaemonSet")
    assert ds["metadata"]["name"] == "dranet-node"
    pod = ds["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "netdra"
    spec = pod["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-cluster-critical" and spec["nodeSelector"] == {"gpu": "true"}
    assert spec["tolerations"] == values["tolerations"] and spec["affinity"] == values["affinity"]
    container = spec["containers"][0]
    assert container["resources"] == values["resources"]
    assert {"name": "host-config", "mountPath": "/etc/host-config", "readOnly": True} in container["volumeMounts"]
    assert {"name": "host-config", "hostPath": {"path": "/etc/host-config"}} in spec["volumes"]
    args = driver_args(docs)
    assert args[-2:] == ["--inventory-max-poll-interval=2m", "--v=4"]
    cli = build_parser().parse_args(args)
    cfg = config_from_args(cli)
    assert cfg.cloud_provider == "azure" and cfg.cloud_metadata_url == "http://imds-proxy.local:8080"
    assert cfg.list_numa_attribute and cfg.resync_interval == 120.0 and cli.verbosity == 4
    assert (cfg.profile_provider, cfg.webhook_url) == ("webhook", "unix:///run/acme/provider.sock")
    assert all(d["metadata"]["name"].startswith("dranet-node") for d in docs if d["kind"] in ("ServiceAccount",))


@pytest.mark.parametrize(
    "bad",
    [
        "cloudProvider=cks",
        "featureGates=DRAListTypeAttributes",
        "podLabels.team=null",
        "cloudMetadataUrl=ftp://x",
        "profiles.provider=acme",
        "profiles.provider=webhook",  # without webhookUrl
        "profiles.webhookUrl=ftp://x",
        "profileProvider=webhook",  # the old top-level spelling: one spelling per setting
    ],
)
def test_schema_rejects_bad_compat_values(helm: str, bad: str) -> None:
    out = run_helm(helm, "template", "dranet", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad)
    assert out.returncode != 0 and "values don't meet the specifications of the schema" in out.stderr, out.stderr
