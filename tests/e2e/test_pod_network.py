"""The whole chain in one test, under least privilege.

Real control plane; the chart's RBAC, node policy and DeviceClass; ``dranet run`` as a separate
process on the host's own /sys with a token of the chart's ServiceAccount bound to a stand-in
driver pod (never admin); veth NICs created here (host ends with addresses and routes); the real
scheduler allocates a claim with a ``dra.net`` config; this test plays the kubelet
(NodePrepareResources over the driver's DRA socket) and the container runtime (containerd/nri's
runtime adaptation, the Go harness) with the Pod's real UID and a test network namespace.

Checked: the NIC arrives in the pod configured; the claim status (networkData, Ready,
NUMAAligned) is written; StopPodSandbox gives back the NIC with its name, MTU, MAC, addresses
and routes; NodeUnprepareResources removes our status entries. And a config the kernel refuses
at pod start fails the hook naming device and step, rolls the NIC back intact, and shows up as
Ready=False plus a Warning event on the pod. The driver's log never shows a 403.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.controlplane import ControlPlane, wait_for
from driver.claims import numa_report
from driver.kube.client import RESOURCE_API, KubeClient
from harness.driver_process import DriverProcess
from harness.kubelet_client import KubeletClient, devices_of
from harness.netns import NetnsFactory
from harness.nri import Harness, configure_host_nic, link_facts, pod_json
from tests.plugins.cluster import list_slices
from tests.plugins.least_privilege import (
    ApiObjects,
    DriverIdentity,
    dranet_run,
    forbidden_lines,
)

pytestmark = [pytest.mark.cluster, pytest.mark.root, pytest.mark.slow]


@dataclass
class HostNic:
    """A veth end on the host (the NIC under test) with its address and routes."""

    ifname: str
    peer: str
    address: str  # CIDR on the host
    routes: list[list[str]]  # `ip route add ... dev ifname` argument lists


@dataclass
class Chain:
    """Everything one end-to-end test uses; built and torn down by the ``chain`` fixture."""

    kube: KubeClient  # admin: only the test's own setup and reads
    identity: DriverIdentity
    driver: DriverProcess
    harness: Harness
    nics: list[HostNic]
    pod_netns: str
    workload_ns: str
    objects: ApiObjects
    control_plane: ControlPlane

    def create_raw(self, obj: dict[str, Any], encoding: str) -> None:
        """POST ``obj`` encoded as a given client would: "kubectl" (compact, sorted keys: the
        form the API server itself re-encodes opaque parameters to), "go-struct" (compact,
        keys in field order, not sorted)."""
        if encoding == "kubectl":
            data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
        else:
            data = json.dumps(obj, separators=(",", ":")).encode()
        token = self.control_plane.creds.admin_token
        req = urllib.request.Request(
            f"{self.control_plane.server}/apis/resource.k8s.io/v1/namespaces/"
            f"{obj['metadata']['namespace']}/resourceclaims",
            data=data,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        ctx = ssl.create_default_context(cafile=str(self.control_plane.creds.ca_crt))
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            assert resp.status == 201, resp.status
        self.objects.urls.append(
            f"{RESOURCE_API}/namespaces/{obj['metadata']['namespace']}/resourceclaims/{obj['metadata']['name']}"
        )

    def kubelet(self) -> KubeletClient:
        return KubeletClient(self.driver.registration_socket, self.driver.dra_socket, timeout=15)


def _subnet() -> str:
    # Random per test: other engineers run suites on this host at the same time.
    return f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"


@pytest.fixture
def chain(
    control_plane: ControlPlane,
    least_privilege_identity: DriverIdentity,
    nri_harness: Harness,
    netns_factory: NetnsFactory,
) -> Iterator[Chain]:
    kube = control_plane.kube()
    prefix = f"e2{secrets.token_hex(3)}"
    nics = []
    for suffix, extra in (("a", ["table", str(random.randint(1000, 30000))]), ("b", ["metric", "77"])):
        name, peer = netns_factory.veth(f"{prefix}{suffix}", f"q{prefix[1:]}{suffix}")
        net, far = _subnet(), _subnet()
        nic = HostNic(
            name,
            peer,
            f"{net}.1/24",
            [[f"{far}.0/24", "via", f"{net}.254"], [f"{far}.128/25", "via", f"{net}.253", *extra]],
        )
        configure_host_nic(nic.ifname, nic.peer, nic.address, nic.routes, mtu=1400 if suffix == "a" else None)
        nics.append(nic)
    pod_ns = netns_factory.netns()
    objects = ApiObjects(kube)
    workload_ns = f"e2e-{prefix}"
    driver = dranet_run(
        least_privilege_identity,
        nri_harness.socket,
        f'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName.startsWith("{prefix}")',
        Path(tempfile.mkdtemp(prefix="dn-e2e-")),
    )  # short: unix socket paths
    try:
        objects.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": workload_ns}})
        driver.start()
        res = nri_harness.cmd("wait-sync", count=1, timeout=15)
        assert res["ok"], f"{res}\ndriver log:\n{driver.log()[-3000:]}"
        yield Chain(
            kube, least_privilege_identity, driver, nri_harness, nics, pod_ns, workload_ns, objects, control_plane
        )
    finally:
        try:
            driver.stop()
            objects.cleanup()
        finally:
            shutil.rmtree(driver.workdir, ignore_errors=True)


# -- helpers ---------------------------------------------------------------------------------------


def _wait(c: Chain, pred: Any, what: str, timeout: float = 30) -> Any:
    """wait_for, failing with the driver's log tail (what the driver saw is the diagnosis)."""
    try:
        return wait_for(pred, timeout, what=what)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\ndriver log:\n{c.driver.log()[-4000:]}") from None


def _published_ifnames(c: Chain) -> set[str]:
    return {
        d["attributes"]["dra.net/ifName"]["string"]
        for s in list_slices(c.kube, c.identity.node)
        for d in s["spec"].get("devices") or []
    }


def _wait_slice(c: Chain) -> list[dict[str, Any]]:
    want = {n.ifname for n in c.nics}
    _wait(c, lambda: _published_ifnames(c) == want, what=f"a slice with exactly {sorted(want)}")
    slices = list_slices(c.kube, c.identity.node)
    node_uid = c.kube.request("GET", f"/api/v1/nodes/{c.identity.node}")["metadata"]["uid"]
    for s in slices:  # the owner reference needed `nodes get`: RBAC allowed it
        assert [o["uid"] for o in s["metadata"].get("ownerReferences") or []] == [node_uid]
    return slices


def _request(name: str, device_class: str, ifname: str) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": device_class,
            "selectors": [{"cel": {"expression": f'device.attributes["dra.net"].ifName == "{ifname}"'}}],
        },
    }


def _schedule(
    c: Chain,
    claim_name: str,
    requests: list[dict[str, Any]],
    config: list[dict[str, Any]],
    pod_name: str,
    encoding: str = "kubectl",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create the claim and a pod using it; wait until the real scheduler allocated and bound.

    ``encoding``: send the claim as kubectl does ("kubectl": compact, sorted keys), as a Go
    struct encodes ("go-struct": compact, unsorted) or as Python's json.dumps ("python": spaces
    after ':' and ',')."""
    claim_obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": c.workload_ns},
        "spec": {"devices": {"requests": requests, "config": config}},
    }
    if encoding == "python":
        c.objects.create(claim_obj)
    else:
        c.create_raw(claim_obj, encoding)
    c.objects.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": c.workload_ns},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": c.identity.node},
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "nics", "resourceClaimName": claim_name}],
                "containers": [
                    {"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "nics"}]}}
                ],
            },
        }
    )

    def bound() -> tuple[dict[str, Any], dict[str, Any]] | None:
        pod = c.kube.request("GET", f"/api/v1/namespaces/{c.workload_ns}/pods/{pod_name}")
        claim = c.kube.read_namespaced_resource_claim(c.workload_ns, claim_name)
        reserved = [r.get("uid") for r in (claim.get("status") or {}).get("reservedFor") or []]
        if (
            pod["spec"].get("nodeName")
            and (claim.get("status") or {}).get("allocation")
            and pod["metadata"]["uid"] in reserved
        ):
            return claim, pod
        return None

    claim, pod = wait_for(bound, 60, what=f"{claim_name} allocated and {pod_name} bound")
    assert pod["spec"]["nodeName"] == c.identity.node
    return claim, pod


def _ours(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Our status.devices entries, by device name."""
    return {d["device"]: d for d in (claim.get("status") or {}).get("devices") or [] if d["driver"] == "dra.net"}


def _conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in entry.get("conditions") or []}


def _claim_tuple(claim: dict[str, Any]) -> tuple[str, str, str]:
    m = claim["metadata"]
    return m["namespace"], m["name"], m["uid"]


def _allocated(claim: dict[str, Any]) -> dict[str, str]:
    """request -> device name, of our driver's allocation results."""
    return {
        r["request"]: r["device"]
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == "dra.net"
    }


def _expected_numa(devices: list[str]) -> tuple[str, str]:
    """NUMAAligned status and reason for veths (no NUMA node of their own), per driver.claims.numa_report:
    on a single-NUMA-node host they count as node 0, so aligned; otherwise unknown."""
    if numa_report.numa_node_count("/sys") == 1:
        return "True", "NUMAAligned"
    return "Unknown", "NUMAUnknown"


def _non_empty(value: Any) -> Any:
    """``value`` with empty containers pruned recursively; None when nothing is left."""
    if isinstance(value, dict):
        pruned = {k: v for k, v in ((k, _non_empty(v)) for k, v in value.items()) if v is not None}
        return pruned or None
    if isinstance(value, list):
        items = [v for v in (_non_empty(v) for v in value) if v is not None]
        return items or None
    return value


def _assert_no_denials(c: Chain) -> None:
    denials = forbidden_lines(c.driver.log())
    assert not denials, "the chart's RBAC/policy denied the driver:\n" + "\n".join(denials[:20])


# -- tests -----------------------------------------------------------------------------------------


# The apiserver compares status.allocation (with the opaque parameters the scheduler copied from
# the claim) byte for byte on every status write; server-side apply re-encodes them, so only
# kubectl-style claims accept it. The driver falls back to a PUT of the object as served
# (driver/claims/status.py _replace_status): all three client encodings must get their status.
@pytest.mark.parametrize("encoding", ["kubectl", "go-struct", "python"])
async def test_claimed_nic_moves_into_pod_configured_and_comes_back(chain: Chain, encoding: str) -> None:
    c = chain
    a, b = c.nics
    before = {n.ifname: link_facts(n.ifname) for n in c.nics}
    assert all(
        f and len(f["routes"]) == 2 and f["addresses"] == [n.address]
        for n, f in zip(c.nics, before.values(), strict=True)
    )
    _wait_slice(c)

    pod_ip, mac = f"192.168.{random.randint(0, 255)}.2/24", f"02:{secrets.token_hex(5)[:10]}"
    mac = ":".join([mac[:2]] + [mac[3 + i : 5 + i] for i in range(0, 10, 2)])
    gw = pod_ip.rsplit(".", 1)[0] + ".1"
    config = [
        {
            "requests": ["nic1"],
            "opaque": {
                "driver": "dra.net",
                "parameters": {
                    "apiVersion": "dra.net/v1alpha1",
                    "kind": "NetworkConfig",
                    "interface": {
                        "name": "net1",
                        "addresses": [pod_ip],
                        "mtu": 1300,
                        "hardwareAddr": mac,
                        "arpIgnore": 1,
                    },
                    "routes": [{"destination": "172.30.0.0/16", "gateway": gw}],
                    # dranet's remaining fields, through the apiserver, prepare's checkpoint and the hooks
                    "rules": [{"priority": 300, "destination": "172.31.0.0/16", "table": 300}],
                    "neighbors": [{"destination": gw, "hardwareAddr": "02:00:00:00:00:01"}],
                },
            },
        }
    ]
    claim, pod = _schedule(
        c,
        "nics",
        [_request("nic1", c.identity.device_class, a.ifname), _request("nic2", c.identity.device_class, b.ifname)],
        config,
        "trainer",
        encoding,
    )
    allocated = _allocated(claim)
    assert set(allocated) == {"nic1", "nic2"}
    uid, pod_uid = claim["metadata"]["uid"], pod["metadata"]["uid"]

    async with c.kubelet() as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([_claim_tuple(claim)])
        assert resp.claims[uid].error == ""
        assert sorted((req[0], pool, dev) for req, pool, dev in devices_of(resp, uid)) == sorted(
            (req, c.identity.node, dev) for req, dev in allocated.items()
        )

        # The container runtime: RunPodSandbox with the Pod's real UID and the test namespace.
        nri_pod = pod_json(pod_uid, f"/run/netns/{c.pod_netns}", name="trainer", namespace=c.workload_ns)
        res = c.harness.cmd("run", pod=nri_pod)
        assert res["ok"], f"{res}\n{c.driver.log()[-3000:]}"
        net1 = link_facts("net1", netns=c.pod_netns)
        assert net1 is not None and net1["up"], c.driver.log()[-3000:]
        assert (net1["mtu"], net1["mac"], net1["addresses"]) == (1300, mac, [pod_ip])
        assert ("172.30.0.0/16", gw, "main", None) in net1["routes"]
        rules = json.loads(_ns_exec(c.pod_netns, "ip", "-j", "rule", "show", "priority", "300"))
        assert [(r["dst"], r["dstlen"], str(r["table"])) for r in rules] == [("172.31.0.0", 16, "300")]
        neigh = json.loads(_ns_exec(c.pod_netns, "ip", "-j", "neigh", "show", "dev", "net1", gw))
        assert [(n["lladdr"], n["state"]) for n in neigh] == [("02:00:00:00:00:01", ["PERMANENT"])]
        assert _ns_exec(c.pod_netns, "cat", "/proc/sys/net/ipv4/conf/net1/arp_ignore").strip() == "1"
        # nic2 has no config: host name, addresses and routes carried into the pod.
        in_pod_b = link_facts(b.ifname, netns=c.pod_netns)
        assert in_pod_b is not None and in_pod_b["addresses"] == [b.address]
        assert in_pod_b["routes"] == before[b.ifname]["routes"]
        assert link_facts(a.ifname) is None and link_facts(b.ifname) is None

        # CreateContainer: veths have no RDMA char devices (no NCCL_IB_HCA, no device nodes, no
        # cpuset); the only addition names the claim's interfaces as the pod sees them.
        res = c.harness.cmd("create", pod=nri_pod, container={"id": f"c-{pod_uid[:8]}", "name": "main"})
        assert res["ok"], res
        # (The runtime adaptation itself fills in empty hooks/resources messages.)
        names = ",".join(sorted([b.ifname, "net1"]))
        assert _non_empty(res.get("adjust")) == {"env": [{"key": "DRANET_INTERFACES", "value": names}]}, res

        # Claim status, written by the driver with its own token.
        def ready() -> dict[str, dict[str, Any]] | None:
            ours = _ours(c.kube.read_namespaced_resource_claim(c.workload_ns, "nics"))
            ok = len(ours) == 2 and all(_conditions(e).get("Ready", {}).get("status") == "True" for e in ours.values())
            return ours if ok else None

        # 20 s: the writer's own retries (5 attempts, backoff 0.5..4 s) end well before.
        ours = _wait(c, ready, what="Ready=True on both devices", timeout=20)
        assert set(ours) == set(allocated.values())
        assert ours[allocated["nic1"]]["networkData"] == {
            "interfaceName": "net1",
            "ips": [pod_ip],
            "hardwareAddress": mac,
        }
        assert ours[allocated["nic2"]]["networkData"] == {
            "interfaceName": b.ifname,
            "ips": [b.address],
            "hardwareAddress": in_pod_b["mac"],
        }
        status, reason = _expected_numa(list(ours))
        for entry in ours.values():
            conds = _conditions(entry)
            assert conds["Ready"]["reason"] == "NetworkReady"
            assert (conds["NUMAAligned"]["status"], conds["NUMAAligned"]["reason"]) == (status, reason), conds
            assert "no other devices in the claim" in conds["NUMAAligned"]["message"]

        # StopPodSandbox: everything back on the host exactly as it was.
        res = c.harness.cmd("stop", pod=nri_pod)
        assert res["ok"], res
        assert {n.ifname: link_facts(n.ifname) for n in c.nics} == before
        assert link_facts("net1", netns=c.pod_netns) is None
        assert c.harness.cmd("remove", pod=nri_pod)["ok"]
        assert {n.ifname: link_facts(n.ifname) for n in c.nics} == before

        un = await kubelet.unprepare([_claim_tuple(claim)])
        assert un.claims[uid].error == ""
    _wait(
        c,
        lambda: not _ours(c.kube.read_namespaced_resource_claim(c.workload_ns, "nics")),
        what="our status entries removed after unprepare",
    )
    # The NICs are still published after their round trip.
    assert _published_ifnames(c) == {n.ifname for n in c.nics}
    _assert_no_denials(c)


async def test_config_refused_at_pod_start_rolls_back_and_reports(chain: Chain) -> None:
    c = chain
    a, b = c.nics
    before = {n.ifname: link_facts(n.ifname) for n in c.nics}
    _wait_slice(c)
    # The gateway is outside every subnet of the NIC: the kernel refuses the route (ENETUNREACH)
    # after the NIC was moved, renamed and addressed, so all of that must be rolled back.
    config = [
        {
            "requests": ["nic"],
            "opaque": {
                "driver": "dra.net",
                "parameters": {
                    "interface": {"name": "net1", "addresses": ["192.168.9.2/24"], "mtu": 1300},
                    "routes": [{"destination": "172.31.0.0/16", "gateway": "203.0.113.1"}],
                },
            },
        }
    ]
    claim, pod = _schedule(c, "bad-route", [_request("nic", c.identity.device_class, a.ifname)], config, "doomed")
    device = _allocated(claim)["nic"]
    uid, pod_uid = claim["metadata"]["uid"], pod["metadata"]["uid"]

    async with c.kubelet() as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([_claim_tuple(claim)])
        assert resp.claims[uid].error == ""  # valid config: only the kernel can refuse it

        nri_pod = pod_json(pod_uid, f"/run/netns/{c.pod_netns}", name="doomed", namespace=c.workload_ns)
        res = c.harness.cmd("run", pod=nri_pod)
        assert not res["ok"]
        assert f"device {device}: route failed" in res["error"], res["error"]
        assert {n.ifname: link_facts(n.ifname) for n in c.nics} == before
        assert link_facts("net1", netns=c.pod_netns) is None

        def failed() -> dict[str, Any] | None:
            entry = _ours(c.kube.read_namespaced_resource_claim(c.workload_ns, "bad-route")).get(device)
            cond = _conditions(entry or {}).get("Ready")
            return cond if cond and cond["status"] == "False" else None

        cond = _wait(c, failed, what="Ready=False")
        assert cond["reason"] == "RouteFailed"
        assert "route" in cond["message"] and "203.0.113.1" in cond["message"], cond
        entry = _ours(c.kube.read_namespaced_resource_claim(c.workload_ns, "bad-route"))[device]
        assert "networkData" not in entry  # rolled back: nothing in the pod to describe

        def warning() -> list[dict[str, Any]]:
            return [
                e
                for e in c.kube.request(
                    "GET",
                    f"/api/v1/namespaces/{c.workload_ns}/events",
                    query={"fieldSelector": f"involvedObject.uid={pod_uid}"},
                )["items"]
                if e["type"] == "Warning"
            ]

        events = _wait(c, warning, what="a Warning event on the pod")
        assert events[0]["reason"] == "RouteFailed"
        assert events[0]["involvedObject"]["name"] == "doomed"
        assert device in events[0]["message"] and "route failed" in events[0]["message"], events[0]

        # The runtime cleans up the failed sandbox; nothing is in the pod, the host stays intact.
        assert c.harness.cmd("stop", pod=nri_pod)["ok"]
        assert c.harness.cmd("remove", pod=nri_pod)["ok"]
        assert {n.ifname: link_facts(n.ifname) for n in c.nics} == before
        assert (await kubelet.unprepare([_claim_tuple(claim)])).claims[uid].error == ""
    _wait(
        c,
        lambda: not _ours(c.kube.read_namespaced_resource_claim(c.workload_ns, "bad-route")),
        what="our status entries removed after unprepare",
    )
    _assert_no_denials(c)


def _ns_exec(netns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *cmd], capture_output=True, text=True, check=True).stdout


def test_denial_detector_recognises_what_the_driver_logs() -> None:
    """The no-403 assertions above have teeth: KubeError text and kube reasons are caught."""
    from driver.kube.errors import KubeError

    err = KubeError(403, "Forbidden", 'resourceclaims.resource.k8s.io "x" is forbidden: User "u" cannot get')
    assert forbidden_lines(f"2026 WARNING driver.claims.status: write failed error={err}\nok line")
    assert forbidden_lines('... "reason":"Forbidden","code": 403}')
    assert not forbidden_lines("scan done devices=2 rdma=0 ms=403.2\npublished ResourceSlices slices=1")
    assert not forbidden_lines("2026-11-22 06:40:12,403 INFO driver.daemon.device_sync: scan done devices=2")
