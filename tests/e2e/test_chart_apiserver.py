"""Every object the chart renders is accepted by the real kube-apiserver 1.34 (server-side
dry run, strict field validation): schema, CEL in the policy and webhook match conditions,
RBAC, admission."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound
from tests.repo.test_chart import render

pytestmark = pytest.mark.cluster

# kind -> (plural, namespaced) for what the chart renders.
RESOURCES: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "Secret": ("secrets", True),
    "Service": ("services", True),
    "Pod": ("pods", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "DaemonSet": ("daemonsets", True),
    "Deployment": ("deployments", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "ConfigMap": ("configmaps", True),
    "DeviceClass": ("deviceclasses", False),
    "ResourceSlice": ("resourceslices", False),
    "ResourceClaim": ("resourceclaims", True),
    "ResourceClaimTemplate": ("resourceclaimtemplates", True),
    "ValidatingAdmissionPolicy": ("validatingadmissionpolicies", False),
    "ValidatingAdmissionPolicyBinding": ("validatingadmissionpolicybindings", False),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
    "NetworkPolicy": ("networkpolicies", True),
    "Endpoints": ("endpoints", True),
}


def collection_path(obj: dict[str, Any]) -> str:
    plural, namespaced = RESOURCES[obj["kind"]]
    api = obj["apiVersion"]
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    if namespaced:
        return f"{prefix}/namespaces/{obj['metadata']['namespace']}/{plural}"
    return f"{prefix}/{plural}"


def object_url(obj: dict[str, Any]) -> str:
    return f"{collection_path(obj)}/{obj['metadata']['name']}"


class Created:
    """Objects a test created for real; deleted in reverse order, ignoring what is gone."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.urls: list[str] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = self.kube.request("POST", collection_path(obj), obj)
        self.urls.append(object_url(obj))
        return out

    def cleanup(self) -> None:
        for url in reversed(self.urls):
            try:
                # gracePeriodSeconds=0: no kubelet will ever confirm a pod's termination.
                self.kube.request("DELETE", url, query={"gracePeriodSeconds": "0"})
            except KubeError as exc:
                if not isinstance(exc, NotFound):
                    raise


@pytest.fixture
def created(kube: KubeClient) -> Iterator[Created]:
    c = Created(kube)
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def namespace(created: Created) -> str:
    name = f"dranet-{secrets.token_hex(3)}"
    created.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def unique_release() -> tuple[str, str]:
    """A release name (its cluster-scoped objects are unique) and a unique DeviceClass name."""
    suffix = secrets.token_hex(3)
    return f"dranet-{suffix}", f"dranet-{suffix}.net"


def dry_run_create(kube: KubeClient, obj: dict[str, Any]) -> dict[str, Any]:
    return kube.request("POST", collection_path(obj), obj, query={"dryRun": "All", "fieldValidation": "Strict"})


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("nri.enabled=false", "securityContext.privileged=true", "webhook.failurePolicy=Ignore"),
        ("kubeletRootDir=/data/kubelet", "driverName=net.example.com", "webhook.enabled=false"),
        ("webhook.networkPolicy.apiServerCIDRs={10.0.0.1/32,fd00::1/128}",),
    ],
    ids=["defaults", "no-nri-privileged", "custom-driver-no-webhook", "network-policy"],
)
def test_every_rendered_object_passes_server_side_dry_run(
    helm: str, kube: KubeClient, namespace: str, sets: tuple[str, ...]
) -> None:
    release, device_class = unique_release()
    docs = render(helm, *sets, f"deviceClass.name={device_class}", release=release, namespace=namespace)
    assert {d["kind"] for d in docs} <= set(RESOURCES)
    for obj in docs:
        out = dry_run_create(kube, obj)
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == obj["metadata"]["name"]
        # Dry run: nothing persisted.
        with pytest.raises(KubeError) as err:
            kube.request("GET", object_url(obj))
        assert isinstance(err.value, NotFound)


def test_dry_run_rejects_what_the_apiserver_would(helm: str, kube: KubeClient, namespace: str) -> None:
    """The check above has teeth: a broken CEL expression and an unknown field are refused."""
    release, device_class = unique_release()
    docs = render(helm, f"deviceClass.name={device_class}", release=release, namespace=namespace)
    vap = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    vap["spec"]["validations"][0]["expression"] = "variables.nodeName ==="
    with pytest.raises(KubeError) as err:
        dry_run_create(kube, vap)
    assert err.value.status == 422
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(KubeError) as err:
        dry_run_create(kube, ds)
    assert "hostNetwrok" in str(err.value)


def test_helm_install_upgrade_uninstall_keeps_webhook_ca(
    helm: str, kube: KubeClient, control_plane: Any, namespace: str, created: Created
) -> None:
    """A real `helm install` into the test apiserver; on upgrade the generated webhook CA (and
    so the caBundle the apiserver trusts) is reused; uninstall removes every object."""
    import subprocess

    release, device_class = unique_release()
    env_args = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    chart = str(Path(__file__).resolve().parents[2] / "charts" / "dranet")

    def run(*args: str) -> str:
        out = subprocess.run([helm, *args, *env_args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def vwc_ca() -> str:
        vwc = kube.request(
            "GET", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{release}-{namespace}"
        )
        return vwc["webhooks"][0]["clientConfig"]["caBundle"]

    try:
        notes = run("install", release, chart, "--set", f"deviceClass.name={device_class}")
        assert "kubectl get resourceslices --field-selector spec.driver=dra.net" in notes
        # The webhook's NetworkPolicy is made from the API server's own endpoints, looked up at install
        # (this control plane publishes none, so the test publishes them as an API server would).
        policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
        assert kube.request("GET", policies)["items"] == [], "no API server address known: no policy"
        created.create(
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": "kubernetes", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"name": "https", "port": 6443}]}],
            }
        )
        ca = vwc_ca()
        secret = kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{release}-webhook-tls")
        assert secret["data"]["ca.crt"] == ca
        run("upgrade", release, chart, "--set", f"deviceClass.name={device_class}", "--set", "logLevel=debug")
        assert vwc_ca() == ca
        [policy] = kube.request("GET", policies)["items"]
        assert policy["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "192.0.2.10/32"}}]
        ds = kube.request("GET", f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{release}")
        assert "--log-level=debug" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    finally:
        subprocess.run([helm, "uninstall", release, "--wait", *env_args], capture_output=True, timeout=120)
    for url in (
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release}",
        f"/apis/resource.k8s.io/v1/deviceclasses/{device_class}",
        f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{release}-node-resourceslices",
        f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{release}",
    ):
        with pytest.raises(KubeError) as err:
            kube.request("GET", url)
        assert isinstance(err.value, NotFound), url


def _claim(ns: str, name: str, driver: str | None, template: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net"}}]}}
    if driver:
        spec["devices"]["config"] = [{"requests": ["nic"], "opaque": {"driver": driver, "parameters": {"a": 1}}}]
    if template:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": spec},
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def test_webhook_only_sees_objects_with_a_dra_net_config(
    helm: str, kube: KubeClient, created: Created, namespace: str
) -> None:
    """The chart's ValidatingWebhookConfiguration with its backend unreachable (failurePolicy
    Fail): claims and templates carrying a dra.net config are refused (the webhook was called),
    everything else is admitted (matchConditions kept it away), so a webhook outage never
    blocks other drivers' claims."""
    release, device_class = unique_release()
    docs = render(helm, f"deviceClass.name={device_class}", release=release, namespace=namespace)
    vwc = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    for w in vwc["webhooks"]:
        assert w["failurePolicy"] == "Fail"
        # Nothing listens on port 1; scoped to this test's namespace so no other test is affected.
        w["clientConfig"] = {"url": "https://127.0.0.1:1/validate", "caBundle": w["clientConfig"]["caBundle"]}
        w["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    created.create(vwc)

    def refused(obj: dict[str, Any]) -> bool:
        try:
            dry_run_create(kube, obj)
        except KubeError as exc:
            assert "failed calling webhook" in exc.message, exc
            return True
        return False

    # Webhook configurations reach the apiserver's dispatcher through an informer.
    deadline = time.monotonic() + 30
    while not refused(_claim(namespace, "with-config", "dra.net")):
        assert time.monotonic() < deadline, "the webhook configuration never took effect"
        time.sleep(0.5)
    assert refused(_claim(namespace, "tmpl-with-config", "dra.net", template=True))
    assert not refused(_claim(namespace, "no-config", None))
    assert not refused(_claim(namespace, "other-driver", "gpu.example.com"))
    assert not refused(_claim(namespace, "tmpl-no-config", None, template=True))
    assert not refused(_claim(namespace, "tmpl-other-driver", "gpu.example.com", template=True))
