"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver: the driver's service account,
with a token bound to its pod (so to one node), may write only that node's ResourceSlices of
its own driver; and its ClusterRole grants nothing beyond what the driver uses."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.certs import kubeconfig_yaml
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError
from tests.e2e.test_chart_apiserver import Created, created, namespace, unique_release  # noqa: F401 - pytest fixtures, used by name
from tests.plugins.cluster import delete_node_and_slices
from tests.plugins.least_privilege import pod_ref, request_token
from tests.repo.test_chart import render

pytestmark = pytest.mark.cluster

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def slice_obj(name: str, node: str, driver: str = "dra.net", device: str = "eth1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": device}],
        },
    }


def token_client(control_plane: Any, token: str, tmp_path: Path) -> KubeClient:
    path = tmp_path / f"sa-{secrets.token_hex(3)}.kubeconfig"
    path.write_text(kubeconfig_yaml(control_plane.server, control_plane.creds.ca_crt, token))
    return KubeClient.from_kubeconfig(str(path))


def forbidden(call: Callable[[], Any]) -> KubeError:
    with pytest.raises(KubeError) as err:
        call()
    assert err.value.status == 403, err.value
    return err.value


def test_driver_token_writes_only_its_own_nodes_slices(
    helm: str,
    kube: KubeClient,
    control_plane: Any,
    created: Created,  # noqa: F811 - the imported fixture, requested by name
    namespace: str,  # noqa: F811 - the imported fixture, requested by name
    cluster_node: str,
    tmp_path: Path,
) -> None:
    own = cluster_node
    other = f"node-{secrets.token_hex(3)}"
    control_plane.create_node(other)
    try:
        _check_policy(helm, kube, control_plane, created, namespace, own, other, tmp_path)
    finally:
        delete_node_and_slices(kube, other)


def _check_policy(
    helm: str,
    kube: KubeClient,
    control_plane: Any,
    created: Created,  # noqa: F811 - the imported fixture, requested by name
    ns: str,
    own: str,
    other: str,
    tmp_path: Path,
) -> None:
    release, device_class = unique_release()
    docs = render(helm, "webhook.enabled=false", f"deviceClass.name={device_class}", release=release, namespace=ns)
    for kind in (
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ):
        for obj in (d for d in docs if d["kind"] == kind):
            created.create(obj)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]["name"]
    # The driver pod, bound to its node (no kubelet: it never runs, but tokens can bind to it).
    pod = created.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "dranet-driver", "namespace": ns},
            "spec": {
                "serviceAccountName": sa,
                "nodeName": own,
                "containers": [{"name": "dranet", "image": "dranet:test"}],
            },
        }
    )
    driver = token_client(control_plane, request_token(kube, ns, sa, pod_ref(pod)), tmp_path)

    # The token carries the node name the policy keys on.
    review = driver.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{ns}:{sa}"
    assert user["extra"][NODE_NAME_EXTRA] == [own]

    tag = secrets.token_hex(3)
    other_slice = slice_obj(f"{other}-dra.net-{tag}", other)
    # Policies reach the admission plugin through an informer: wait until it denies.
    deadline = time.monotonic() + 30
    while True:
        try:
            driver.request("POST", f"{RESOURCE_API}/resourceslices", other_slice)
        except KubeError as exc:
            assert exc.status == 403, exc
            denial = exc
            break
        kube.request("DELETE", f"{RESOURCE_API}/resourceslices/{other_slice['metadata']['name']}")
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicy never took effect"
        time.sleep(0.5)
    assert f"may only write ResourceSlices with spec.nodeName {own}" in denial.message
    assert release in denial.message  # names the policy

    # Its own node: create, update, delete are allowed.
    own_slice = slice_obj(f"{own}-dra.net-{tag}", own)
    made = driver.request("POST", f"{RESOURCE_API}/resourceslices", own_slice)
    made["spec"]["devices"].append({"name": "eth2"})
    made = driver.request("PUT", f"{RESOURCE_API}/resourceslices/{own_slice['metadata']['name']}", made)
    assert [d["name"] for d in made["spec"]["devices"]] == ["eth1", "eth2"]

    # Another node's slice written by someone else: no update, no delete.
    theirs = kube.request("POST", f"{RESOURCE_API}/resourceslices", other_slice)
    theirs["spec"]["devices"] = []
    forbidden(lambda: driver.request("PUT", f"{RESOURCE_API}/resourceslices/{other_slice['metadata']['name']}", theirs))
    forbidden(lambda: driver.request("DELETE", f"{RESOURCE_API}/resourceslices/{other_slice['metadata']['name']}"))

    # Its own node but another driver's name: denied.
    err = forbidden(
        lambda: driver.request(
            "POST", f"{RESOURCE_API}/resourceslices", slice_obj(f"{own}-other-{tag}", own, driver="other.example.com")
        )
    )
    assert "spec.driver dra.net" in err.message

    driver.request("DELETE", f"{RESOURCE_API}/resourceslices/{own_slice['metadata']['name']}")

    # A token of the same service account NOT bound to a pod has no node: no slice writes at all.
    unbound = token_client(control_plane, request_token(kube, ns, sa), tmp_path)
    err = forbidden(
        lambda: unbound.request("POST", f"{RESOURCE_API}/resourceslices", slice_obj(f"{own}-unbound-{tag}", own))
    )
    assert NODE_NAME_EXTRA in err.message

    # Least privilege (RBAC): what the driver needs works, neighbours of it do not.
    driver.request("GET", f"/api/v1/nodes/{own}")
    driver.request("GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={own}"})
    forbidden(lambda: driver.request("GET", "/api/v1/nodes"))
    forbidden(lambda: driver.request("GET", "/api/v1/pods"))
    forbidden(lambda: driver.request("GET", f"/api/v1/namespaces/{ns}/secrets"))
    # Listing claims is granted: after a corrupt checkpoint the driver rebuilds the claims allocated
    # to its node from the API server (docs/rbac.md); writing them is not.
    driver.request("GET", f"{RESOURCE_API}/resourceclaims", query={"limit": 1})
    forbidden(lambda: driver.request("DELETE", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims/none-{tag}"))
    forbidden(
        lambda: driver.request(
            "POST",
            f"{RESOURCE_API}/deviceclasses",
            {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"x-{tag}"}, "spec": {}},
        )
    )
    # Admins are not affected by the policy (matchConditions select only the driver's account).
    kube.request("DELETE", f"{RESOURCE_API}/resourceslices/{other_slice['metadata']['name']}")
