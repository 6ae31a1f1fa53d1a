"""`dranet webhook` (a real subprocess) behind a real kube-apiserver.

1. --manage-configuration with a self-signed certificate: the webhook creates the
   ValidatingWebhookConfiguration itself; a bad ResourceClaimTemplate is rejected with the field
   path in the message and a good one is admitted.
2. Given --tls-cert/--tls-key and a configuration registered by the test (as the chart would):
   a bad ResourceClaim is rejected, a claim for another driver and a good one are admitted.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster.controlplane import free_port
from driver.config import DRIVER_NAME
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound
from driver.webhook.certificates import self_signed
from driver.webhook.configuration import MANAGED_CONFIGURATION, webhook_configuration
from driver.webhook.handler import review
from driver.webhook.options import WebhookOptions
from tests.plugins.cluster import delete_if_present
from tests.plugins.least_privilege import write_service_account_kubeconfig

ROOT = Path(__file__).resolve().parents[2]
VWC_API = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
NS = "default"


def template(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net"}}],
                    "config": [
                        {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "x"}}},
                        {"requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": params}},
                    ],
                }
            }
        },
    }


def claim(name: str, params: dict[str, Any], driver: str = "dra.net") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net"}}],
                "config": [{"opaque": {"driver": driver, "parameters": params}}],
            }
        },
    }


def documented_role(name: str) -> dict[str, Any]:
    """A ClusterRole exactly as docs/rbac.md shows it."""
    text = (ROOT / "docs/rbac.md").read_text()
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in text.split("```yaml")[1:]]
    return next(b for b in blocks if b["metadata"]["name"] == name)


@contextlib.contextmanager
def service_account_kubeconfig(
    control_plane, kube: KubeClient, role: str | None, out: Path, node: str | None = None
) -> Iterator[Path]:
    """A kubeconfig for a fresh ServiceAccount bound to the documented ClusterRole ``role``
    (None: no permissions at all); everything is deleted afterwards. ``node``: the token is
    bound to that Node, as a pod's token names its node (a node-local driver's identity)."""
    suffix = uuid.uuid4().hex[:6]
    sa = f"dranet-test-{suffix}"
    cleanup = [f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}"]
    try:
        kube.request(
            "POST",
            f"/api/v1/namespaces/{NS}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
        )
        if role is not None:
            body = documented_role(role)
            body["metadata"]["name"] = f"{role}-{suffix}"
            kube.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body)
            cleanup.append(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}-{suffix}")
            kube.request(
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"{role}-{suffix}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": f"{role}-{suffix}",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": NS}],
                },
            )
            cleanup.append(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}-{suffix}")
        yield write_service_account_kubeconfig(control_plane, kube, NS, sa, out, node=node)
    finally:
        for path in reversed(cleanup):
            delete_if_present(kube, path)


def start_webhook(kubeconfig: str, port: int, *extra: str, log_path: Path) -> subprocess.Popen[bytes]:
    log = open(log_path, "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "driver.cli",
            "--log-format",
            "text",
            "webhook",
            "--kubeconfig",
            kubeconfig,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            *extra,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # our own process group only
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def create_until_rejected(
    kube: KubeClient, path: str, obj: dict[str, Any], log: Path, timeout: float = 30
) -> KubeError:
    """The apiserver picks up a new webhook configuration asynchronously: retry until it bites."""
    name = obj["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.request("POST", path, obj)
        except KubeError as exc:
            if exc.status in (400, 403, 422) and "dra.net" in exc.message:
                return exc
            if time.monotonic() > deadline:
                raise
        else:
            delete_if_present(kube, f"{path}/{name}")  # admitted before the webhook was active
            if time.monotonic() > deadline:
                pytest.fail(f"{name} was never rejected; webhook log:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


@pytest.fixture
def names() -> Iterator[list[tuple[KubeClient, str]]]:
    created: list[tuple[KubeClient, str]] = []
    yield created
    for kube, path in created:
        delete_if_present(kube, path)


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_the_managed_configuration(policy, tmp_path: Path):
    """No cluster needed: the configuration --manage-configuration applies."""
    tls = self_signed(tmp_path, ["127.0.0.1"])
    options = WebhookOptions(
        failure_policy=policy, port=9443, host="dranet-webhook.kube-system.svc", manage_configuration=True
    )
    hooks = webhook_configuration(options, tls.cadata)["webhooks"]
    assert [h["name"] for h in hooks] == ["resourceclaims.dra.net", "resourceclaimtemplates.dra.net"]
    for hook, plural in zip(hooks, ["resourceclaims", "resourceclaimtemplates"], strict=True):
        assert hook["failurePolicy"] == policy
        assert hook["clientConfig"]["url"] == "https://dranet-webhook.kube-system.svc:9443/validate"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == tls.cadata
        assert hook["rules"] == [
            {
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": [plural],
                "scope": "Namespaced",
            }
        ]
        # Only objects with a dra.net config are sent: the same conditions as the chart's.
        (condition,) = hook["matchConditions"]
        assert "c.opaque.driver == 'dra.net'" in condition["expression"]


def test_review_paths_for_both_kinds():
    bad = {"interface": {"mtu": 10}}
    assert review("resourceclaimtemplates", template("t", bad), DRIVER_NAME) == [
        "spec.spec.devices.config[1].opaque.parameters.interface.mtu: must be between 68 and 65536, got 10"
    ]
    assert review("resourceclaims", claim("c", bad), DRIVER_NAME) == [
        "spec.devices.config[0].opaque.parameters.interface.mtu: must be between 68 and 65536, got 10"
    ]
    assert review("resourceclaims", claim("c", bad, driver="other.example.com"), DRIVER_NAME) == []


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("credentials", ["admin", "documented-rbac"])
def test_managed_configuration_self_signed(control_plane, kube: KubeClient, tmp_path: Path, names, credentials):
    port = free_port()
    names.append((kube, f"{VWC_API}/{MANAGED_CONFIGURATION}"))
    with contextlib.ExitStack() as stack:
        kubeconfig = control_plane.kubeconfig
        if credentials != "admin":  # the ServiceAccount with exactly docs/rbac.md's dranet-webhook role
            kubeconfig = stack.enter_context(
                service_account_kubeconfig(control_plane, kube, "dranet-webhook", tmp_path / "sa.kubeconfig")
            )
        _managed(kube, port, str(kubeconfig), tmp_path, names)


def _managed(kube: KubeClient, port: int, kubeconfig: str, tmp_path: Path, names) -> None:
    proc = start_webhook(
        kubeconfig, port, "--manage-configuration", "--failure-policy", "Fail", log_path=tmp_path / "webhook.log"
    )
    try:
        deadline = time.monotonic() + 60
        vwc: dict[str, Any] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                vwc = kube.request("GET", f"{VWC_API}/{MANAGED_CONFIGURATION}")
                if vwc.get("webhooks") and vwc["webhooks"][0]["clientConfig"].get("caBundle"):
                    break
            except KubeError as exc:
                if not isinstance(exc, NotFound):
                    raise
            time.sleep(0.3)
        assert vwc.get("webhooks"), (tmp_path / "webhook.log").read_text()[-3000:]
        hooks = {h["name"]: h for h in vwc["webhooks"]}
        assert {res for h in hooks.values() for r in h["rules"] for res in r["resources"]} == {
            "resourceclaims",
            "resourceclaimtemplates",
        }
        for hook in hooks.values():
            assert hook["failurePolicy"] == "Fail"
            assert hook["clientConfig"]["url"] == f"https://127.0.0.1:{port}/validate"
            assert all(r["operations"] == ["CREATE"] for r in hook["rules"])

        path = f"{RESOURCE_API}/namespaces/{NS}/resourceclaimtemplates"
        bad = template(f"bad-{uuid.uuid4().hex[:6]}", {"interface": {"name": "a-much-too-long-name", "mtu": 9000}})
        names.append((kube, f"{path}/{bad['metadata']['name']}"))
        err = create_until_rejected(kube, path, bad, tmp_path / "webhook.log")
        assert "spec.spec.devices.config[1].opaque.parameters.interface.name" in err.message
        assert "at most 15" in err.message

        good = template(f"good-{uuid.uuid4().hex[:6]}", {"interface": {"name": "net1", "mtu": 9000}})
        names.append((kube, f"{path}/{good['metadata']['name']}"))
        created = kube.request("POST", path, good)
        assert created["metadata"]["uid"]
    finally:
        stop(proc)
    log = (tmp_path / "webhook.log").read_text()
    assert proc.returncode == 0, log[-2000:]
    # On exit the webhook list is emptied, so a stopped webhook blocks nobody.
    assert not kube.request("GET", f"{VWC_API}/{MANAGED_CONFIGURATION}").get("webhooks")
    # Only the validating configuration is ours: no (empty) mutating one.
    with pytest.raises(KubeError) as info:
        kube.request(
            "GET", f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{MANAGED_CONFIGURATION}"
        )
    assert isinstance(info.value, NotFound)
    # Minimal footprint: nothing beyond the documented rules was even attempted.
    assert "forbidden" not in log.lower(), log[-3000:]


@pytest.mark.cluster
@pytest.mark.slow
def test_chart_configuration_with_given_certificate(control_plane, kube: KubeClient, tmp_path: Path, names):
    port = free_port()
    tls = self_signed(tmp_path, ["127.0.0.1"])
    vwc_name = f"dra-net-test-{uuid.uuid4().hex[:6]}"
    rules = [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        }
    ]
    names.append((kube, f"{VWC_API}/{vwc_name}"))
    path = f"{RESOURCE_API}/namespaces/{NS}/resourceclaims"
    # A bad claim from before the webhook existed: later metadata updates must still pass.
    old_bad = claim(f"old-{uuid.uuid4().hex[:6]}", {"interface": {"mtu": 1}})
    names.append((kube, f"{path}/{old_bad['metadata']['name']}"))
    kube.request("POST", path, old_bad)
    proc = start_webhook(
        str(control_plane.kubeconfig),
        port,
        "--tls-cert",
        tls.certfile,
        "--tls-key",
        tls.keyfile,
        log_path=tmp_path / "webhook.log",
    )
    try:
        # One webhook per resource on the chart's paths (charts/dranet values webhook.paths).
        kube.request(
            "POST",
            VWC_API,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": vwc_name},
                "webhooks": [
                    {
                        "name": f"{res}.dra.net",
                        "rules": [dict(rules[0], resources=[res])],
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 10,
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/validate-{res}",
                            "caBundle": base64.b64encode(tls.cadata).decode(),
                        },
                    }
                    for res in ("resourceclaims", "resourceclaimtemplates")
                ],
            },
        )
        bad = claim(f"bad-{uuid.uuid4().hex[:6]}", {"routes": [{"destination": "10.0.0.0/8"}], "bogus": []})
        names.append((kube, f"{path}/{bad['metadata']['name']}"))
        err = create_until_rejected(kube, path, bad, tmp_path / "webhook.log", timeout=60)
        assert "spec.devices.config[0].opaque.parameters.routes[0].gateway" in err.message
        assert "spec.devices.config[0].opaque.parameters.bogus: unknown field" in err.message
        tpath = f"{RESOURCE_API}/namespaces/{NS}/resourceclaimtemplates"
        bad_t = template(f"bad-{uuid.uuid4().hex[:6]}", {"numa": {"pin": "yes"}})
        names.append((kube, f"{tpath}/{bad_t['metadata']['name']}"))
        err = create_until_rejected(kube, tpath, bad_t, tmp_path / "webhook.log")
        assert "spec.spec.devices.config[1].opaque.parameters.numa.pin: must be a boolean" in err.message

        for obj in (
            claim(f"other-{uuid.uuid4().hex[:6]}", {"rules": []}, driver="gpu.nvidia.com"),
            claim(f"good-{uuid.uuid4().hex[:6]}", {"routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}]}),
        ):
            names.append((kube, f"{path}/{obj['metadata']['name']}"))
            assert kube.request("POST", path, obj)["metadata"]["uid"]
        # UPDATE with an unchanged spec is admitted even though the old config is bad. (PUT, not
        # PATCH: the 1.34 apiserver rejects any PATCH of a claim with opaque parameters as a
        # spec change, webhook or not.)
        current = kube.request("GET", f"{path}/{old_bad['metadata']['name']}")
        current["metadata"]["labels"] = {"team": "ml"}
        updated = kube.request("PUT", f"{path}/{old_bad['metadata']['name']}", current)
        assert updated["metadata"]["labels"] == {"team": "ml"}
    finally:
        stop(proc)


@pytest.mark.cluster
@pytest.mark.slow
def test_managed_match_conditions_malformed_bodies_and_a_dead_webhook(
    control_plane, kube: KubeClient, tmp_path: Path, names
):
    """The real API server with the managed configuration: only claims with a dra.net config reach
    the webhook (so with the webhook dead and failurePolicy Fail, other drivers' claims are still
    admitted and ours are refused); malformed bodies posted straight at the real TLS server get a
    400 or a denial, never a 500; rejections are logged at INFO."""
    import ssl
    import urllib.error
    import urllib.request

    port = free_port()
    names.append((kube, f"{VWC_API}/{MANAGED_CONFIGURATION}"))
    log_path = tmp_path / "webhook.log"
    proc = start_webhook(
        str(control_plane.kubeconfig), port, "--manage-configuration", "--failure-policy", "Fail", log_path=log_path
    )
    path = f"{RESOURCE_API}/namespaces/{NS}/resourceclaims"
    try:
        deadline = time.monotonic() + 60
        vwc: dict[str, Any] = {}
        while time.monotonic() < deadline and not (vwc.get("webhooks") or [{}])[0].get("clientConfig", {}).get(
            "caBundle"
        ):
            with contextlib.suppress(NotFound):
                vwc = kube.request("GET", f"{VWC_API}/{MANAGED_CONFIGURATION}")
            time.sleep(0.3)
        assert all(h.get("matchConditions") for h in vwc["webhooks"]), vwc
        bad = claim(f"bad-{uuid.uuid4().hex[:6]}", {"interface": {"name": "all"}})
        names.append((kube, f"{path}/{bad['metadata']['name']}"))
        err = create_until_rejected(kube, path, bad, log_path)
        assert "spec.devices.config[0].opaque.parameters.interface.name: 'all' is reserved" in err.message
        held = claim(f"held-{uuid.uuid4().hex[:6]}", {"interface": {"name": "net1"}})
        names.append((kube, f"{path}/{held['metadata']['name']}"))
        held = kube.request("POST", path, held)  # admitted while the webhook runs

        ca = base64.b64decode(vwc["webhooks"][0]["clientConfig"]["caBundle"]).decode()
        context = ssl.create_default_context(cadata=ca)
        for body, expected in ((b"{not json", 400), (b"{}", 400), (b"[" * 5000 + b"]" * 5000, 400)):
            request = urllib.request.Request(f"https://127.0.0.1:{port}/validate", data=body, method="POST")
            request.add_header("Content-Type", "application/json")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, context=context, timeout=10)
            text = info.value.read().decode()
            assert info.value.code == expected and "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # dead, not stopped: the configuration stays behind
            proc.wait(timeout=10)
    log = log_path.read_text()
    assert "rejected" in log and "failed permanently" not in log, log[-3000:]

    other = claim(f"other-{uuid.uuid4().hex[:6]}", {"anything": 1}, driver="gpu.example.com")
    names.append((kube, f"{path}/{other['metadata']['name']}"))
    assert kube.request("POST", path, other)["metadata"]["uid"]  # never sent to the dead webhook
    ours = claim(f"ours-{uuid.uuid4().hex[:6]}", {"interface": {"name": "net1"}})
    names.append((kube, f"{path}/{ours['metadata']['name']}"))
    with pytest.raises(KubeError) as refused:
        kube.request("POST", path, ours)
    assert "failed calling webhook" in refused.value.message  # failurePolicy Fail: ours wait for it
    # An existing claim's updates never wait for it (its spec is immutable; the configuration
    # asks for CREATE only): the scheduler's finalizer goes on and comes off, and it deletes.
    held_path = f"{path}/{held['metadata']['name']}"
    held["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    held = kube.request("PUT", held_path, held)
    assert held["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]
    held["metadata"]["finalizers"] = []
    assert not kube.request("PUT", held_path, held)["metadata"].get("finalizers")
    kube.request("DELETE", held_path)
