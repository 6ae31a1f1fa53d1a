"""The driver under least privilege: the chart's own RBAC and node policy on the real control plane.

:func:`least_privilege_identity` renders ``charts/dranet`` with real helm, creates its
ServiceAccount, ClusterRole(+Binding), ValidatingAdmissionPolicy(+Binding) and DeviceClass, a
stand-in DaemonSet pod bound to a fresh Node, and writes a kubeconfig whose token is bound to that
pod (so it carries the node name the policy keys on). :func:`dranet_run` starts ``dranet run`` as
a separate process with exactly that kubeconfig - never admin - so every API call the driver
makes is checked against what the chart grants. :func:`forbidden_lines` finds any denial in the
driver's log. Everything created is removed at teardown, also when the test fails.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster.certs import kubeconfig_yaml
from devcluster.cluster.controlplane import ControlPlane
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound
from harness.driver_process import DriverProcess
from tests.plugins.cluster import delete_node_and_slices

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dranet"
KUBE_VERSION = "1.34.0"
# What the node daemon needs from the chart (the webhook is a separate component).
DRIVER_KINDS = (
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
)
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# How an authorization or admission denial shows up in the driver's log (KubeError text is
# "<status> <reason>: <message>", the apiserver's reason for both is "Forbidden", so "forbidden"
# catches it). No bare "403 <word>": it also matches a log timestamp ("06:40:12,403 INFO").
_DENIAL = re.compile(r"forbidden|\bstatus\W{1,4}403\b|\"code\":\s*403", re.IGNORECASE)


def render_chart(helm: str, release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    """``helm template`` of charts/dranet -> objects (``sets`` are ``--set`` arguments)."""
    args = [helm, "template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _collection(obj: dict[str, Any]) -> str:
    api, kind = obj["apiVersion"], obj["kind"]
    plural = {
        "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
        "DeviceClass": "deviceclasses",
        "ServiceAccount": "serviceaccounts",
        "ResourceClaim": "resourceclaims",
        "ResourceClaimTemplate": "resourceclaimtemplates",
    }.get(kind, kind.lower() + "s")
    prefix = "/api/v1" if api == "v1" else f"/apis/{api}"
    ns = (obj.get("metadata") or {}).get("namespace")
    return f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"


@dataclass
class ApiObjects:
    """Objects created with an admin client; :meth:`cleanup` deletes them newest first."""

    kube: KubeClient
    urls: list[str] = field(default_factory=list)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST ``obj`` and remember it for cleanup; returns the stored object."""
        out = self.kube.request("POST", _collection(obj), obj)
        self.urls.append(f"{_collection(obj)}/{obj['metadata']['name']}")
        return out

    def cleanup(self) -> None:
        """Delete everything (grace 0: no kubelet will confirm a pod's end); ignores what is gone."""
        errors = []
        for url in reversed(self.urls):
            try:
                self.kube.request("DELETE", url, query={"gracePeriodSeconds": "0"})
            except KubeError as exc:
                if not isinstance(exc, NotFound):
                    errors.append(f"{url}: {exc}")
        self.urls.clear()
        assert not errors, errors


@dataclass
class DriverIdentity:
    """The node driver's identity as the chart installs it, with a pod-bound token."""

    node: str
    namespace: str  # release namespace: ServiceAccount and the stand-in driver pod
    release: str
    service_account: str
    device_class: str  # the chart's DeviceClass (unique name per test)
    pod: dict[str, Any]  # the stand-in DaemonSet pod (spec.nodeName = node)
    kubeconfig: Path  # token of service_account bound to pod; NOT admin

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def client(self) -> KubeClient:
        """A client with the driver's own token (for checks made as the driver)."""
        return KubeClient.from_kubeconfig(str(self.kubeconfig))


def bound_to(kind: str, name: str, uid: str) -> dict[str, str]:
    """A TokenRequest's ``boundObjectRef``: the token is valid while that Pod or Node exists, and names it."""
    return {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid}


def pod_ref(pod: dict[str, Any]) -> dict[str, str]:
    """The ``boundObjectRef`` of ``pod`` (the kubelet's projected token is bound the same way)."""
    return bound_to("Pod", pod["metadata"]["name"], pod["metadata"]["uid"])


def request_token(kube: KubeClient, namespace: str, sa: str, bound: dict[str, str] | None = None) -> str:
    """A TokenRequest token of ServiceAccount ``sa`` for an hour, bound to ``bound`` (:func:`bound_to`)
    or to no object."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound is not None:
        spec["boundObjectRef"] = bound
    tr = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return tr["status"]["token"]


def write_service_account_kubeconfig(
    control_plane: ControlPlane, kube: KubeClient, namespace: str, sa: str, out: Path, node: str | None = None
) -> Path:
    """A kubeconfig at ``out`` with a TokenRequest token of ServiceAccount ``sa``, bound to no pod.
    ``node``: the token is bound to that Node, as a node-local driver pod's token names its node
    (1.36+ authorizes a claim's status.devices per node)."""
    bound = bound_to("Node", node, kube.read_node(node)["metadata"]["uid"]) if node is not None else None
    token = request_token(kube, namespace, sa, bound)
    out.write_text(kubeconfig_yaml(control_plane.server, control_plane.creds.ca_crt, token))
    return out


def _poll(pred: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _wait_rbac(driver: KubeClient, node: str) -> None:
    # The authorizer sees new bindings through an informer: without this wait the driver's
    # first calls could be denied for reasons that have nothing to do with the chart.
    def allowed() -> bool:
        try:
            driver.request("GET", f"/api/v1/nodes/{node}")
            return True
        except KubeError as exc:
            if exc.status != 403:
                raise
            return False

    _poll(allowed, 30, "the chart's ClusterRoleBinding to take effect")


def _wait_policy(kube: KubeClient, driver: KubeClient, node: str) -> None:
    # Likewise the node policy: wait until it denies this token a slice of another node, so the
    # driver provably runs under it (a slice written before that is removed by the admin).
    other = f"absent-{secrets.token_hex(3)}"
    name = f"{other}-probe"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "dra.net",
            "nodeName": other,
            "pool": {"name": other, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "probe"}],
        },
    }

    def denied() -> bool:
        try:
            driver.request("POST", f"{RESOURCE_API}/resourceslices", body)
        except KubeError as exc:
            assert exc.status == 403, exc
            assert f"spec.nodeName {node}" in exc.message, exc.message
            return True
        kube.request("DELETE", f"{RESOURCE_API}/resourceslices/{name}")
        return False

    _poll(denied, 30, "the chart's ValidatingAdmissionPolicy to take effect", interval=0.5)


@pytest.fixture
def least_privilege_identity(control_plane: ControlPlane, helm: str) -> Iterator[DriverIdentity]:
    """A fresh Node and the chart's driver identity for it (see module doc); all removed after."""
    kube = control_plane.kube()
    tag = secrets.token_hex(3)
    node, ns, release = f"lp-node-{tag}", f"dranet-lp-{tag}", f"dranet-lp-{tag}"
    device_class = f"{release}.net"
    objects = ApiObjects(kube)
    workdir = Path(tempfile.mkdtemp(prefix="dn-lp-"))
    try:
        control_plane.create_node(node)
        objects.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        docs = render_chart(helm, release, ns, "webhook.enabled=false", f"deviceClass.name={device_class}")
        for kind in DRIVER_KINDS:
            for obj in (d for d in docs if d["kind"] == kind):
                objects.create(obj)
        sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
        # Stands in for the DaemonSet pod on `node` (no kubelet runs it; tokens can bind to it).
        pod = objects.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"dranet-{tag}", "namespace": ns},
                "spec": {
                    "serviceAccountName": sa,
                    "nodeName": node,
                    "containers": [{"name": "dranet", "image": "dranet:test"}],
                },
            }
        )
        kubeconfig = workdir / "driver.kubeconfig"
        kubeconfig.write_text(
            kubeconfig_yaml(
                control_plane.server,
                control_plane.creds.ca_crt,
                request_token(kube, ns, sa, pod_ref(pod)),
                name="dranet-driver",
            )
        )
        kubeconfig.chmod(0o600)
        identity = DriverIdentity(node, ns, release, sa, device_class, pod, kubeconfig)
        driver = identity.client()
        _wait_rbac(driver, node)
        _wait_policy(kube, driver, node)
        yield identity
    finally:
        try:
            delete_node_and_slices(kube, node)
        finally:
            try:
                objects.cleanup()
            finally:
                shutil.rmtree(workdir, ignore_errors=True)


def dranet_run(identity: DriverIdentity, nri_socket: str, filter: str, workdir: Path) -> DriverProcess:
    """``python -m driver run`` on the host's own /sys with NRI, under the least-privilege
    identity, as a separate process group (``workdir`` short: unix socket paths <= 108 bytes)."""
    return DriverProcess(
        kubeconfig=Path(identity.kubeconfig),
        node_name=identity.node,
        sysfs_root=Path("/sys"),
        workdir=workdir,
        nri_socket=nri_socket,
        exclude_interfaces="",
        extra_args=["--filter", filter, "--publish-interval", "0.5"],
    )


def forbidden_lines(log: str) -> list[str]:
    """Lines of a driver log that show an authorization or admission denial (403)."""
    return [line for line in log.splitlines() if _DENIAL.search(line)]
