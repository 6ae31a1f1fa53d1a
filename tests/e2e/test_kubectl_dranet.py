"""`kubectl dranet` against a real control plane, with a namespace user's rights.

Two simulated ND H100 v5 nodes: their NICs published by the driver's own discovery and publisher
(the fixture sysfs), the GPU double's slices, the training example's DeviceClass and templates, and the
seed's two pods (both want the same four GPUs: one per node) allocated by the real scheduler.
The aligned pod's claim gets the status the driver writes when the NRI hook has moved the NICs
(the driver's own status writer). The plugin runs with a token of a ServiceAccount that may
only read slices and device classes (the chart's viewer role) and its own namespace's pods and
claims (and create claims there, for the doctor's dry run): what a user of one namespace has.
Expected values come from the fixture's layout and from the local `dranet topology` /
`dranet templates`, never from the plugin itself.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.builders.binaries import ControlPlaneBinaries
from devcluster.cluster.controlplane import ControlPlane, create_objects, free_port, wait_for
from devcluster.demo.allocation import allocated_claim, build_fixture, pod_for_template, seed_docs
from devcluster.doubles import gpu_double
from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.status import ClaimStatusWriter
from driver.claims.status_entries import DeviceResult, StatusUpdate
from driver.cli import main as dranet_main
from driver.dra.publisher import SlicePublisher
from driver.inventory.discovery import Scanner
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, KubeError
from driver.kubectl.main import main as plugin_main
from driver.webhook.certificates import self_signed
from tests.e2e.test_webhook_apiserver import VWC_API, start_webhook, stop
from tests.plugins.cluster import delete_if_present, delete_node_and_slices
from tests.plugins.least_privilege import render_chart, write_service_account_kubeconfig

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# The fixture's NICs: interface, RDMA device, NUMA node (tests/inventory/test_topology.py's layout).
NICS = {f"ib{i}": (f"mlx5_{i}", 0 if i < 4 else 1) for i in range(8)}
ALIGNED, UNALIGNED = "h100-4gpu-4nic-numa-aligned", "h100-4gpu-4nic-numa-unaligned"


@dataclass
class Seeded:
    kube: KubeClient
    node: str  # the aligned pod's
    other: str  # the unaligned pod's
    namespace: str
    sysfs: Path
    user_kubeconfig: Path
    claims: dict[str, dict[str, Any]]  # template -> the pod's allocated claim
    pods: dict[str, str]  # template -> pod name
    ready: dict[str, str]  # device -> interface name written into the aligned claim's status
    admin_kubeconfig: Path


def plugin(seeded: Seeded, *argv: str, admin: bool = False) -> tuple[int, str]:
    """`kubectl dranet ARGV` in this process, as the namespace user (or the admin)."""
    kubeconfig = str(seeded.admin_kubeconfig if admin else seeded.user_kubeconfig)
    out = io.StringIO()
    code = plugin_main(["--kubeconfig", kubeconfig, "-n", seeded.namespace, *argv], out=out)
    return code, out.getvalue()


def namespace_user(
    control_plane: ControlPlane, kube: KubeClient, ns: str, viewer: dict[str, Any], out: Path
) -> list[str]:
    """A ServiceAccount with a namespace user's rights (its namespace's pods and claims, and the
    chart's ``viewer`` ClusterRole) and a kubeconfig of its token; the paths to delete afterwards."""
    sa = f"ml-engineer-{secrets.token_hex(3)}"
    cleanup = []
    kube.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": sa}})
    role = {
        "metadata": {"name": sa},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list", "create"]},
        ],
    }
    kube.request("POST", f"{RBAC}/namespaces/{ns}/roles", role)
    binding = {
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
        "metadata": {"name": sa},
    }
    kube.request("POST", f"{RBAC}/namespaces/{ns}/rolebindings", binding)
    # The chart's viewer ClusterRole: read slices and device classes (cluster-scoped).
    kube.request("POST", f"{RBAC}/clusterroles", viewer | {"metadata": {"name": sa}})
    cleanup.append(f"{RBAC}/clusterroles/{sa}")
    kube.request(
        "POST", f"{RBAC}/clusterrolebindings", binding | {"roleRef": binding["roleRef"] | {"kind": "ClusterRole"}}
    )
    cleanup.append(f"{RBAC}/clusterrolebindings/{sa}")
    user = KubeClient.from_kubeconfig(str(write_service_account_kubeconfig(control_plane, kube, ns, sa, out)))
    wait_for(lambda: _allowed(user, ns), timeout=30, what="the namespace user's RBAC to take effect")
    return cleanup


def _allowed(user: KubeClient, ns: str) -> bool:
    try:
        user.request("GET", f"{RESOURCE_API}/resourceslices", query={"limit": 1})
        user.request("GET", f"/api/v1/namespaces/{ns}/pods")
        return True
    except KubeError:
        return False


@pytest.fixture(scope="module")
def seeded(control_plane: ControlPlane, helm: str) -> Iterator[Seeded]:
    (viewer,) = [
        d
        for d in render_chart(helm, "dranet", "kube-system")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-viewer")
    ]
    kube = control_plane.kube()
    tag = secrets.token_hex(3)
    node, other, ns = f"nd-h100-{tag}", f"nd-h100-b-{tag}", f"team-{tag}"
    work = Path(tempfile.mkdtemp(prefix="dn-kd-"))
    created_classes: list[str] = []
    cleanup: list[str] = [f"/api/v1/namespaces/{ns}"]
    try:
        kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        sysfs = build_fixture("nd-h100-v5", work / "sysfs")
        # The nodes' NICs through the driver's own discovery and publisher (eth0: the uplink).
        devices = Scanner(str(sysfs), exclude_interfaces=["eth0"], replay=False).scan()
        for name in (node, other):
            control_plane.create_node(name)
            publisher = SlicePublisher(kube, "dra.net", name)
            publisher.node_uid = kube.read_node(name)["metadata"]["uid"]
            publisher.update(devices)
            publisher.sync()
            gpu_double.install(kube, name)
        classes, templates = seed_docs()
        for c in classes:
            try:
                create_objects(kube, [c])
                created_classes.append(c["metadata"]["name"])
            except Conflict:
                pass
        create_objects(kube, templates, ns)
        pods, claims = {}, {}
        for template, on in ((ALIGNED, node), (UNALIGNED, other)):
            pods[template] = f"trainer-{template.rsplit('-', 1)[-1]}"
            create_objects(kube, [pod_for_template(pods[template], template, on)], ns)
        for template in (ALIGNED, UNALIGNED):
            pod_name = pods[template]
            claims[template] = wait_for(
                lambda p=pod_name: allocated_claim(kube, ns, p), timeout=60, what=f"{template}'s claim allocated"
            )
        ready = _write_driver_status(kube, node, sysfs, claims[ALIGNED], devices)
        user_kubeconfig = work / "user.kubeconfig"
        cleanup += namespace_user(control_plane, kube, ns, viewer, user_kubeconfig)
        assert control_plane.kubeconfig is not None
        yield Seeded(kube, node, other, ns, sysfs, user_kubeconfig, claims, pods, ready, control_plane.kubeconfig)
    finally:
        for path in reversed(cleanup):
            delete_if_present(kube, path)
        for name in (node, other):
            delete_node_and_slices(kube, name)
        for name in created_classes:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{name}")
        shutil.rmtree(work, ignore_errors=True)


def _write_driver_status(
    kube: KubeClient, node: str, sysfs: Path, claim: dict[str, Any], devices: list[Any]
) -> dict[str, str]:
    """The status the driver writes once the NRI hook moved the claim's NICs into the pod."""
    by_name = {d.name: d for d in devices}
    results = claim["status"]["allocation"]["devices"]["results"]
    prepared = PreparedClaim(
        uid=claim["metadata"]["uid"],
        namespace=claim["metadata"]["namespace"],
        name=claim["metadata"]["name"],
        pod_uids=["pod-uid"],
        devices=[
            PreparedDevice(request=r["request"], pool=r["pool"], device=r["device"], snapshot=by_name[r["device"]])
            for r in results
            if r["driver"] == "dra.net"
        ],
    )
    ready = {d.device: f"net{i}" for i, d in enumerate(prepared.devices)}
    update = StatusUpdate(
        "pod-uid",
        prepared,
        ready={
            dev: DeviceResult(dev, ifname, [f"10.8.0.{i + 10}/24"], f"02:00:00:00:00:{i + 10:02x}")
            for i, (dev, ifname) in enumerate(sorted(ready.items()))
        },
    )
    assert ClaimStatusWriter(kube, node, sysfs_root=str(sysfs)).process(update)
    return ready


def _held(claim: dict[str, Any], driver: str = "dra.net") -> set[str]:
    return {r["device"] for r in claim["status"]["allocation"]["devices"]["results"] if r["driver"] == driver}


def test_nodes_as_a_namespace_user(seeded: Seeded) -> None:
    code, out = plugin(seeded, "nodes", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["claimsScope"] == seeded.namespace  # may not list other namespaces' claims
    nodes = {n["name"]: n for n in doc["nodes"]}
    node, other = nodes[seeded.node], nodes[seeded.other]
    nics = {n["ifName"]: n for n in node["nics"]}
    assert set(nics) == set(NICS)
    for ifname, (rdma, numa) in NICS.items():
        assert (nics[ifname]["rdmaDevice"], nics[ifname]["numaNode"], nics[ifname]["rdma"]) == (rdma, numa, True)
    aligned, unaligned = seeded.claims[ALIGNED], seeded.claims[UNALIGNED]
    mine = f"{seeded.namespace}/{aligned['metadata']['name']}"
    # The aligned claim's NICs are the user's; the others may be held in namespaces they cannot see.
    assert {n["device"] for n in node["nics"] if n["allocatedTo"] == mine} == _held(aligned)
    assert {n["allocatedTo"] for n in node["nics"] if n["device"] not in _held(aligned)} == {"?"}
    assert {n["numaNode"] for n in node["nics"] if n["device"] in _held(aligned)} == {0}
    held_other = {n["ifName"] for n in other["nics"] if n["allocatedTo"] != "?"}
    assert held_other == {"ib4", "ib5", "ib6", "ib7"}  # the unaligned claim: NUMA 1's NICs
    # GPUs of the other driver's slice, with their NUMA nodes.
    assert {g["pciBusID"]: g["numaNode"] for g in node["gpus"]} == dict(gpu_double.ND_H100_V5_GPUS)
    assert node["numa"] == [
        {
            "numaNode": 0,
            "gpus": 4,
            "heldGpus": 4,
            "freeGpus": 0,  # every one held by the user's own claim: known
            "rdmaNics": 4,
            "heldRdmaNics": 4,
            "freeRdmaNics": 0,
        },
        {
            "numaNode": 1,
            "gpus": 4,
            "heldGpus": 0,
            "freeGpus": None,
            "rdmaNics": 4,
            "heldRdmaNics": 0,
            "freeRdmaNics": None,
        },
    ]

    code, table = plugin(seeded, "nodes")
    assert code == 0
    lines = table.splitlines()
    assert lines[0].split() == ["NODE", "DEVICE", "IFNAME", "NUMA", "RDMA", "LINK", "STATE", "ALLOCATED", "TAINTS"]
    ib4 = next(line.split() for line in lines if line.startswith(seeded.other + " ") and " ib4 " in line)
    assert ib4[:5] == [seeded.other, nics["ib4"]["device"], "ib4", "1", "mlx5_4"]
    assert ib4[7] == f"{seeded.namespace}/{unaligned['metadata']['name']}"
    numa1 = next(line.split() for line in lines if line.startswith(seeded.node + " ") and line.split()[1] == "1")
    assert numa1[2:4] == ["?/4", "?/4"] and "gpu-4,gpu-5,gpu-6,gpu-7" in numa1[4]
    assert f"claims of namespace {seeded.namespace} only" in table


def test_nodes_as_admin_see_every_namespace(seeded: Seeded) -> None:
    code, out = plugin(seeded, "nodes", "--node", seeded.node, "-o", "yaml", admin=True)
    assert code == 0
    doc = yaml.safe_load(out)
    assert doc["claimsScope"] == "all namespaces"
    (node,) = doc["nodes"]
    assert len(node["nics"]) == 8 and len(node["gpus"]) == 8
    free = {n["ifName"] for n in node["nics"] if n["allocatedTo"] is None}
    assert free == {"ib4", "ib5", "ib6", "ib7"}
    assert [(s["numaNode"], s["freeGpus"], s["freeRdmaNics"]) for s in node["numa"]] == [(0, 0, 0), (1, 4, 4)]


def test_topology_is_the_local_matrix(seeded: Seeded, capsys: pytest.CaptureFixture[str]) -> None:
    """Built from slices, the matrix is the one `dranet topology` prints from the node's sysfs."""
    args = ["topology", "--sysfs-root", str(seeded.sysfs), "--exclude-interfaces", "eth0", "-o", "json"]
    assert dranet_main(args) == 0
    local = json.loads(capsys.readouterr().out)
    code, out = plugin(seeded, "topology", "--node", seeded.node, "-o", "json")
    assert code == 0
    remote = json.loads(out)
    assert remote["matrix"] == local["matrix"]
    assert [(n["pci_bus_id"], n["rdma_device"], n["numa_node"]) for n in remote["nics"]] == [
        (n["pci_bus_id"], n["rdma_device"], n["numa_node"]) for n in local["nics"]
    ]
    code, table = plugin(seeded, "topology", "--node", seeded.node)
    assert code == 0
    assert any(line.split()[:3] == ["GPU0", "X", "NODE"] for line in table.splitlines())
    assert "NUMA nodes:" not in table  # CPU lists are not in slices: not invented


def test_templates_are_the_local_templates(seeded: Seeded, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["templates", "--gpus", "4", "--sysfs-root", str(seeded.sysfs), "--exclude-interfaces", "eth0"]
    assert dranet_main(args) == 0
    local = capsys.readouterr().out
    code, out = plugin(seeded, "templates", "--node", seeded.node, "--gpus", "4")
    assert code == 0 and out == local
    code, out = plugin(seeded, "templates", "--node", seeded.node, "--nic-class", "rdma.dranet.net", "-o", "json")
    assert code == 0
    docs = json.loads(out)
    assert [d["metadata"]["name"] for d in docs] == ["4gpu-4nic-numa0", "4gpu-4nic-numa1"]  # default: the most that fit
    assert {d["spec"]["spec"]["devices"]["requests"][1]["exactly"]["deviceClassName"] for d in docs} == {
        "rdma.dranet.net"
    }
    code, _ = plugin(seeded, "templates", "--node", seeded.node, "--gpus", "5")
    assert code == 1


def test_claim_and_pod_show_what_the_pod_got(seeded: Seeded) -> None:
    claim = seeded.claims[ALIGNED]
    code, out = plugin(seeded, "claim", claim["metadata"]["name"], "-o", "json")
    assert code == 0
    view = json.loads(out)
    assert view["node"] == seeded.node
    nics = [d for d in view["devices"] if d["driver"] == "dra.net"]
    gpus = [d for d in view["devices"] if d["driver"] == gpu_double.GPU_DRIVER]
    assert len(nics) == 4 and len(gpus) == 4
    assert {d["interfaceName"] for d in nics} == set(seeded.ready.values())
    assert all(d["ready"] == "True" and d["ips"] and d["hardwareAddress"] for d in nics)
    assert {d["rdmaDevice"] for d in nics} == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    assert {d["numaNode"] for d in view["devices"]} == {0}
    assert view["numaAligned"]["status"] == "True" and view["numaAligned"]["source"] == "driver"

    # The unaligned pod's claim: no driver status yet, the verdict computed from the slices.
    code, out = plugin(seeded, "pod", seeded.pods[UNALIGNED], "-o", "json")
    assert code == 0
    pod = json.loads(out)
    (unaligned,) = pod["claims"]
    assert unaligned["name"] == seeded.claims[UNALIGNED]["metadata"]["name"]
    assert unaligned["numaAligned"]["status"] == "False" and unaligned["numaAligned"]["source"] == "computed"
    assert "devices span NUMA nodes 0, 1" in unaligned["numaAligned"]["message"]
    assert all(d["ready"] is None and d["interfaceName"] is None for d in unaligned["devices"])

    code, table = plugin(seeded, "pod", seeded.pods[ALIGNED])
    assert code == 0
    assert f"claim {seeded.namespace}/{claim['metadata']['name']} (pod {seeded.pods[ALIGNED]})" in table
    row = next(line.split() for line in table.splitlines() if "mlx5_0" in line)
    assert row[0] == "nic" and row[3] in seeded.ready.values() and row[-1] == "True"
    assert "NUMAAligned=True (NUMAAligned, reported by the driver)" in table

    code, _ = plugin(seeded, "claim", "no-such-claim")
    assert code == 2


def test_what_a_namespace_user_may_not_read_is_unknown(seeded: Seeded) -> None:
    code, out = plugin(seeded, "doctor", "-o", "json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert (
        checks["driver pods"]["status"] == "unknown" and "list pods in kube-system" in checks["driver pods"]["detail"]
    )
    assert checks["api"]["status"] == "ok" and checks["deviceclass"]["status"] == "ok"
    # Another namespace's pod: refused by the API, reported as such (exit 2), never a traceback.
    code, _ = plugin(seeded, "-n", "kube-system", "pod", "anything")
    assert code == 2


def _doctor(seeded: Seeded, *argv: str) -> dict[str, dict[str, str]]:
    _, out = plugin(seeded, "doctor", "-o", "json", *argv, admin=True)
    return {c["name"]: c for c in json.loads(out)["checks"]}


def test_doctor_as_admin(seeded: Seeded, tmp_path: Path) -> None:
    kube = seeded.kube
    sys_ns = f"dranet-sys-{secrets.token_hex(3)}"
    kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": sys_ns}})
    vwc = f"doctor-{secrets.token_hex(3)}"
    proc = None
    try:
        flags = ["--driver-namespace", sys_ns]
        checks = _doctor(seeded, *flags)
        assert checks["driver pods"]["status"] == "fail" and "no driver pod" in checks["driver pods"]["detail"]
        # A driver pod on the node (the DaemonSet's labels), Ready: no kubelet here, so the status
        # is written as the kubelet would.
        for i, node in enumerate((seeded.node, seeded.other)):
            pod = {
                "metadata": {
                    "name": f"dranet-{i}",
                    "labels": {"app.kubernetes.io/name": "dranet", "app.kubernetes.io/component": "driver"},
                },
                "spec": {"nodeName": node, "containers": [{"name": "dranet", "image": "dranet:test"}]},
            }
            kube.request("POST", f"/api/v1/namespaces/{sys_ns}/pods", pod)
            ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}}
            kube.request(
                "PATCH",
                f"/api/v1/namespaces/{sys_ns}/pods/dranet-{i}/status",
                ready,
                content_type="application/merge-patch+json",
            )
        checks = _doctor(seeded, *flags)
        for node in (seeded.node, seeded.other):
            assert node not in checks["driver pods"]["detail"], checks["driver pods"]
            assert f"node {node}:" not in checks["slices"]["detail"], checks["slices"]
        assert checks["deviceclass"]["status"] == "ok" and "dranet.net" in checks["deviceclass"]["detail"]
        assert checks["webhook"]["status"] == "warn"  # none installed in this control plane
        assert _doctor(seeded, *flags, "--device-class", "absent.example.com")["deviceclass"]["status"] == "warn"

        # The webhook: unreachable (failurePolicy Fail), then the real one.
        dead = free_port()
        _webhook_config(kube, vwc, seeded.namespace, f"https://127.0.0.1:{dead}/validate-resourceclaims", b"")
        checks = wait_for(
            lambda: (c := _doctor(seeded, *flags))["webhook"]["status"] == "fail" and c,
            timeout=30,
            what="the dead webhook",
        )
        assert "unreachable" in checks["webhook"]["detail"]
        port = free_port()
        tls = self_signed(tmp_path, ["127.0.0.1"])
        given_tls = ["--tls-cert", tls.certfile, "--tls-key", tls.keyfile]
        proc = start_webhook(str(seeded.admin_kubeconfig), port, *given_tls, log_path=tmp_path / "webhook.log")
        delete_if_present(kube, f"{VWC_API}/{vwc}")
        _webhook_config(kube, vwc, seeded.namespace, f"https://127.0.0.1:{port}/validate-resourceclaims", tls.cadata)
        wait_for(
            lambda: _doctor(seeded, *flags)["webhook"]["status"] == "ok",
            timeout=60,
            what=f"the webhook to refuse the probe; log:\n{(tmp_path / 'webhook.log').read_text()[-2000:]}",
        )
        # The dry run stored nothing.
        assert not [
            c
            for c in kube.request("GET", f"{RESOURCE_API}/namespaces/{seeded.namespace}/resourceclaims")["items"]
            if c["metadata"]["name"].startswith("dranet-doctor-")
        ]
        # A driver pod that is not Ready: the doctor names the node and fails.
        notready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        kube.request(
            "PATCH",
            f"/api/v1/namespaces/{sys_ns}/pods/dranet-0/status",
            notready,
            content_type="application/merge-patch+json",
        )
        code, out = plugin(seeded, "doctor", "--driver-namespace", sys_ns, admin=True)
        assert code == 1
        row = next(line for line in out.splitlines() if line.startswith("driver pods"))
        assert "fail" in row.split() and seeded.node in row
    finally:
        if proc is not None:
            stop(proc)
        delete_if_present(kube, f"{VWC_API}/{vwc}")
        delete_if_present(kube, f"/api/v1/namespaces/{sys_ns}")


def _webhook_config(kube: KubeClient, name: str, namespace: str, url: str, ca: bytes) -> None:
    import base64

    client: dict[str, Any] = {"url": url}
    if ca:
        client["caBundle"] = base64.b64encode(ca).decode()
    kube.request(
        "POST",
        VWC_API,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "resourceclaims.dra.net",
                    "rules": [
                        {
                            "apiGroups": ["resource.k8s.io"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["resourceclaims"],
                        }
                    ],
                    # This test's namespace only: other tests' claims never meet this webhook.
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                    "clientConfig": client,
                }
            ],
        },
    )


def test_kubectl_finds_the_plugin(seeded: Seeded, control_plane_binaries: ControlPlaneBinaries, tmp_path: Path) -> None:
    """`kubectl dranet ...` through the real kubectl: the console script on PATH is the plugin."""
    kubectl = control_plane_binaries.kube_apiserver.parent / "kubectl"
    if not kubectl.is_file():
        pytest.skip("kubectl not built (make binaries)")
    script = tmp_path / "kubectl-dranet"  # what `pip install` puts on PATH for the console script
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -m driver.kubectl.main "$@"\n')
    script.chmod(0o755)
    env = os.environ | {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "KUBECONFIG": str(seeded.user_kubeconfig),
    }
    listed = subprocess.run([str(kubectl), "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert str(script) in listed.stdout, listed.stdout + listed.stderr
    out = subprocess.run(
        [str(kubectl), "dranet", "-n", seeded.namespace, "nodes", "--node", seeded.node],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].split()[:3] == ["NODE", "DEVICE", "IFNAME"]
    assert sum(1 for line in out.stdout.splitlines() if line.startswith(seeded.node) and " mlx5_" in line) == 8
