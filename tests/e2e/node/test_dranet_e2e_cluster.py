"""dranet's own end-to-end suite (kubernetes-sigs/dranet ``tests/e2e.bats`` @ f258477) on a real
node, with the chart installed as a dranet user installs it: every netdev published (``filter=``),
the node's own /sys (no sysfs fixture), netlink discovery, the chart's default privileges. Its
manifests (tests/fixtures/dranet_e2e) are applied with kubectl, its assertions made on the pods,
claims and slices.

What had to change, per test, and why:

* **Links.** This kernel has no ``dummy`` links: each "dummy" is a veth of that name in the node's
  namespace, its peer in the fabric namespace (off the node). The manifests that select
  ``type == "dummy"`` get ``ifName == "<the link>"`` instead (the node's rails are veths too).
* **Images.** ``agnhost`` cannot be pulled here: the node has our busybox workload image under its
  name (it ignores agnhost's ``netexec`` arguments and idles). ``curl``/``apk add ethtool`` are
  not in it: the metrics test uses busybox ``wget``, and the ethtool checks are not ported.
* **Nodes.** One node (dranet's ``worker`` and ``worker2`` are the same node here).
* **State.** dranet keeps pod configs in bbolt; the downtime test reads ours (``pods.json``).
* **Output.** busybox's ``ip`` prints neighbours with "used .. probes .." and routes without
  "proto kernel": the patterns allow the first, and the IPv6 subnet route is told by its metric.
* **Sockets.** The DRA and registration sockets carry the driver instance's ID (a rolling
  update's two pods coexist): the shutdown test looks for ``dra.net*`` sockets.
* **Reapply.** dranet re-adds the address after the pod ends ("dummy devices do not have the
  ability to reclaim the IP"); this driver gives the NIC back with it, which is asserted instead.
* **Tools.** No ``ethtool`` here: the advanced and BIG TCP tests' ethtool checks are not ported
  (tests/nic_settings/test_ethtool.py sets features on real links); BIG TCP's sizes are read over
  rtnetlink in the pod's namespace from the host.
* **eBPF.** Programs loaded with the bpf system call (tests/support/bpf_progs.py) instead of
  dranet's compiled objects and ``bpftool``: the names are ours (``dranet_test``, ``handle_ingress``).
* **PBR.** The manifest's ``command: ["/agnhost", ...]`` is dropped (no agnhost binary).

Not ported here: VRF (this kernel has no VRF links; the stock-kernel tier's 6.1 runs a real VRF
through the hooks, tests/nic_settings/test_vrf.py).

``DRANET_E2E_DRANET_IP_FAMILIES=ipv4,ipv6,dual`` runs it on an IPv4, an IPv6-only and a
dual-stack node in turn (``make test-dranet-ip-families``; ``make test`` runs IPv4 only).
``DRANET_E2E_DRANET_CLUSTER=<name>`` tests a running cluster of that name instead, left running
(``python -m devcluster up --nodes 1 --name <name>`` with the ``--set`` values of `DRANET_VALUES`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.builders.images import WORKLOAD_IMAGE
from devcluster.cluster import fabric
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from driver.kube.client import RESOURCE_API
from tests.e2e.node.realnode import E2E_MARKS, RealNode, cluster_for_tests, random_layout
from tests.support import bpf_progs
from tests.support.hook_node import sizes

pytestmark = E2E_MARKS
MANIFESTS = Path(__file__).resolve().parents[2] / "fixtures" / "dranet_e2e"
AGNHOST = "registry.k8s.io/e2e-test-images/agnhost:2.54"
# The chart as a dranet user installs it: every netdev, the node's own /sys.
DRANET_VALUES = ("filter=", "extraArgs=null", "extraVolumes=null", "extraVolumeMounts=null")
REUSE_ENV = "DRANET_E2E_DRANET_CLUSTER"
# The node networks' IP families to run the suite on, one cluster each (`make test` runs ipv4;
# `make test-dranet-ip-families` all three).
FAMILIES_ENV = "DRANET_E2E_DRANET_IP_FAMILIES"
DRIVER_PODS = "app.kubernetes.io/component=driver"
DUMMY_SELECTOR = 'device.attributes["dra.net"].type == "dummy"'


@pytest.fixture(scope="module", params=os.environ.get(FAMILIES_ENV, "ipv4").split(","))
def real_node(request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """One real node with the driver installed as dranet users install it, dranet's DeviceClass,
    and our workload image under agnhost's name; one per IP family of `FAMILIES_ENV`."""
    layout = functools.partial(random_layout, nodes=1, ip_family=request.param)
    with cluster_for_tests(request, layout, os.environ.get(REUSE_ENV), DRANET_VALUES) as node:
        cluster.tag_image(node.layout, WORKLOAD_IMAGE, AGNHOST)
        node.kubectl.run("apply", "-f", str(MANIFESTS / "deviceclass.yaml"))
        yield node


@contextlib.contextmanager
def dummy(node: RealNode, name: str) -> Iterator[str]:
    """A link named ``name`` in the node's namespace (a veth, its peer off the node); removed after."""
    layout = node.layout
    peer = f"dx{secrets.token_hex(3)}"
    fabric_ip = ["ip", "-n", layout.fabric_netns]
    _sh(*fabric_ip, "link", "add", peer, "type", "veth", "peer", "name", name, "netns", node.spec().netns)
    _sh(*fabric_ip, "link", "set", peer, "up")
    try:
        yield name
    finally:
        # Deleting the peer deletes the link wherever it is: home, or in a pod a failed test left.
        _sh(*fabric_ip, "link", "del", peer, check=False)


def _sh(*cmd: str, check: bool = True) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)}: {out.stderr.strip()}")
    return out.stdout


def on_node(node: RealNode, *args: str) -> str:
    """``ip <args>`` in the node's network namespace (dranet's ``docker exec <node> ip ...``)."""
    return _sh("ip", "-n", node.spec().netns, *args)


def apply(node: RealNode, ns: str, manifest: str, link: str | None = None) -> None:
    """``kubectl apply`` one of dranet's manifests into ``ns``; ``link``: the selector on the
    dummy type reads that link's name instead (see the module docstring)."""
    text = (MANIFESTS / manifest).read_text()
    if link is not None:
        assert DUMMY_SELECTOR in text, f"{manifest} does not select on the dummy type"
        text = text.replace(DUMMY_SELECTOR, f'device.attributes["dra.net"].ifName == "{link}"')
    node.kubectl.run("apply", "-n", ns, "-f", "-", stdin=text)


def ready_pod(node: RealNode, ns: str, selector: str, timeout: float = 60) -> str:
    """The name of the one pod matching ``selector`` once it is Ready (dranet's wait_for_ready_pods)."""

    def ready() -> str | None:
        pods = node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector})["items"]
        for p in pods:
            conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
            if conds.get("Ready") == "True" and not p["metadata"].get("deletionTimestamp"):
                return str(p["metadata"]["name"])
        return None

    return wait_for(ready, timeout, 0.5, f"a Ready pod {selector} in {ns}")


def claims(node: RealNode, ns: str) -> list[dict[str, Any]]:
    return list(node.kube.request("GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"])


def claim_ips(claim: dict[str, Any]) -> list[str]:
    return [ip for d in claim.get("status", {}).get("devices") or [] for ip in d.get("networkData", {}).get("ips", [])]


def slice_device(node: RealNode, ifname: str) -> dict[str, Any] | None:
    """The node's published device whose ``dra.net/ifName`` is ``ifname``."""
    slices = node.kube.request(
        "GET",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={node.node}"},
    )["items"]
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d.get("attributes", {}).get("dra.net/ifName", {}).get("string") == ifname:
                return dict(d)
    return None


def published(node: RealNode, ifname: str) -> dict[str, Any]:
    return wait_for(lambda: slice_device(node, ifname), 30, 0.5, f"{ifname} published")


@pytest.mark.parametrize("link", ["dummy0", "mlx5_6"], ids=["plain", "normalized-name"])
def test_dummy_interface_with_ip_addresses_resource_claim(real_node: RealNode, ns: str, link: str) -> None:
    """e2e.bats "dummy interface with IP addresses ResourceClaim" (and "... and normalized name":
    a link name that is no valid device name)."""
    with dummy(real_node, link):
        on_node(real_node, "link", "set", "up", "dev", link)
        device = published(real_node, link)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", device["name"]), device["name"]
        apply(real_node, ns, "resourceclaim.yaml", link)
        pod = ready_pod(real_node, ns, "app=pod")
        assert "169.254.169.13" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "eth99")
        (claim,) = claims(real_node, ns)
        assert "169.254.169.13/24" in claim_ips(claim), claim.get("status")
        real_node.delete_namespace(ns)


def test_validate_per_interface_arp_configuration(real_node: RealNode, ns: str) -> None:
    """e2e.bats "validate per-interface ARP configuration on dummy interface": the chart's default
    (unprivileged) driver sets them."""
    with dummy(real_node, "dummy0"):
        on_node(real_node, "link", "set", "up", "dev", "dummy0")
        published(real_node, "dummy0")
        apply(real_node, ns, "resourceclaim_arp.yaml")
        pod = ready_pod(real_node, ns, "app=arp")
        assert real_node.kubectl.exec(ns, pod, "cat", "/proc/sys/net/ipv4/conf/dranet-arp/arp_ignore").strip() == "1"
        assert real_node.kubectl.exec(ns, pod, "cat", "/proc/sys/net/ipv4/conf/dranet-arp/arp_announce").strip() == "2"
        real_node.delete_namespace(ns)


def test_dummy_interface_with_ip_addresses_resource_claim_template(real_node: RealNode, ns: str) -> None:
    """e2e.bats "dummy interface with IP addresses ResourceClaimTemplate": the host's address comes along."""
    with dummy(real_node, "dummy0"):
        on_node(real_node, "addr", "add", "169.254.169.14/32", "dev", "dummy0")
        published(real_node, "dummy0")
        apply(real_node, ns, "resourceclaimtemplate.yaml")
        pod = ready_pod(real_node, ns, "app=MyApp")
        assert "169.254.169.14" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "dummy0")
        assert "169.254.169.14" in json.dumps(claims(real_node, ns))
        real_node.delete_namespace(ns)


def test_dummy_interface_with_ip_addresses_resource_claim_and_routes(real_node: RealNode, ns: str) -> None:
    """e2e.bats "dummy interface with IP addresses ResourceClaim and routes"."""
    with dummy(real_node, "dummy0"):
        on_node(real_node, "link", "set", "up", "dev", "dummy0")
        published(real_node, "dummy0")
        apply(real_node, ns, "resourceclaim_route.yaml", "dummy0")
        pod = ready_pod(real_node, ns, "app=pod")
        assert "169.254.169.13" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "eth99")
        assert "169.254.169.0/24 via 169.254.169.1" in real_node.kubectl.exec(ns, pod, "ip", "route", "show")
        claim = next(c for c in claims(real_node, ns) if c["metadata"]["name"] == "dummy-interface-static-ip-route")
        assert any(ip.startswith("169.254.169.1") for ip in claim_ips(claim)), claim.get("status")
        real_node.delete_namespace(ns)


def test_metric_server_is_up_and_operating_on_host(real_node: RealNode, ns: str) -> None:
    """e2e.bats "test metric server is up and operating on host": a hostNetwork pod reads
    /metrics on localhost:9177 (busybox wget for curl)."""
    script = "wget -q -O- localhost:9177/metrics | grep process_start_time_seconds >/dev/null && echo ok || echo fail"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "test-metrics", "namespace": ns},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "containers": [{"name": "test-metrics", "image": AGNHOST, "command": ["sh", "-c", script]}],
        },
    }
    real_node.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def done() -> str | None:
        phase = real_node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/test-metrics")["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    assert wait_for(done, 60, 0.5, "test-metrics finished") == "Succeeded"
    assert real_node.kubectl.run("logs", "-n", ns, "test-metrics").strip() == "ok"


def test_two_dummy_interfaces_with_ip_addresses_resource_claim_template(real_node: RealNode, ns: str) -> None:
    """e2e.bats "2 dummy interfaces with IP addresses ResourceClaimTemplate"."""
    with dummy(real_node, "dummy0"), dummy(real_node, "dummy1"):
        for link, ip in (("dummy0", "169.254.169.13"), ("dummy1", "169.254.169.14")):
            on_node(real_node, "link", "set", "up", "dev", link)
            on_node(real_node, "addr", "add", f"{ip}/32", "dev", link)
            published(real_node, link)
        apply(real_node, ns, "resourceclaimtemplate_double.yaml")
        pod = ready_pod(real_node, ns, "app=MyApp")
        assert "169.254.169.13" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "dummy0")
        assert "169.254.169.14" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "dummy1")
        (claim,) = claims(real_node, ns)
        ips = claim_ips(claim)
        assert "169.254.169.13/32" in ips and "169.254.169.14/32" in ips, ips
        real_node.delete_namespace(ns)


def test_reapply_pod_with_dummy_resource_claim(real_node: RealNode, ns: str) -> None:
    """e2e.bats "reapply pod with dummy resource claim": the NIC comes back with its address (dranet
    adds it again by hand), and the re-applied Deployment gets it again."""
    with dummy(real_node, "dummy8"):
        on_node(real_node, "link", "set", "up", "dummy8")
        on_node(real_node, "addr", "add", "169.254.169.14/32", "dev", "dummy8")
        published(real_node, "dummy8")
        for _ in range(2):
            apply(real_node, ns, "repeatresourceclaimtemplate.yaml")
            pod = ready_pod(real_node, ns, "app=reapplyApp")
            assert "169.254.169.14" in real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "dummy8")
            assert "169.254.169.14" in json.dumps(claims(real_node, ns))
            real_node.kubectl.run("delete", "-n", ns, "deployment/server-deployment-reapply", "--wait", "--timeout=60s")
            real_node.kubectl.run("wait", "-n", ns, "--for=delete", "pod", "-l", "app=reapplyApp", "--timeout=60s")
            wait_for(
                lambda: "169.254.169.14/32" in on_node(real_node, "-o", "addr", "show", "dev", "dummy8"),
                30,
                0.2,
                "dummy8 home with its address",
            )
        real_node.delete_namespace(ns)


def test_permanent_neighbor_entry_is_copied_to_pod_namespace(real_node: RealNode, ns: str) -> None:
    """e2e.bats "permanent neighbor entry is copied to pod namespace" (IPv4 and IPv6)."""
    with dummy(real_node, "dummy-neigh"):
        on_node(real_node, "link", "set", "up", "dev", "dummy-neigh")
        on_node(real_node, "addr", "add", "169.254.169.15/32", "dev", "dummy-neigh")
        for ip, mac in (("192.168.1.1", "00:11:22:33:44:55"), ("2001:db8::1", "00:aa:bb:cc:dd:ee")):
            on_node(real_node, "neigh", "add", ip, "lladdr", mac, "dev", "dummy-neigh", "nud", "permanent")
        published(real_node, "dummy-neigh")
        apply(real_node, ns, "resourceclaim.yaml", "dummy-neigh")
        pod = ready_pod(real_node, ns, "app=pod")
        out = real_node.kubectl.exec(ns, pod, "ip", "neigh", "show")
        # busybox's ip prints "used 0/0/0 probes 0" before the state, iproute2's does not.
        used = r"(?: used \S+ probes \d+)?"
        assert re.search(rf"192\.168\.1\.1 dev eth99 lladdr 00:11:22:33:44:55{used} PERM", out), out
        assert re.search(rf"2001:db8::1 dev eth99 lladdr 00:aa:bb:cc:dd:ee{used} PERM", out), out
        real_node.delete_namespace(ns)


def test_route_rules_and_routes_with_non_default_table_are_copied(real_node: RealNode, ns: str) -> None:
    """e2e.bats "route rules and routes with non-default table are copied to pod namespace"."""
    with dummy(real_node, "dummy-rules"):
        on_node(real_node, "link", "set", "up", "dev", "dummy-rules")
        on_node(real_node, "addr", "add", "169.254.169.13/24", "dev", "dummy-rules")
        on_node(
            real_node, "route", "add", "10.10.10.0/24", "via", "169.254.169.1", "dev", "dummy-rules", "table", "100"
        )
        on_node(real_node, "rule", "add", "from", "10.20.30.0/24", "table", "100", "priority", "500")
        try:
            published(real_node, "dummy-rules")
            apply(real_node, ns, "resourceclaim.yaml", "dummy-rules")
            pod = ready_pod(real_node, ns, "app=pod")
            routes = real_node.kubectl.exec(ns, pod, "ip", "route", "show", "table", "100")
            assert "10.10.10.0/24 via 169.254.169.1 dev eth99" in routes, routes
            rules = real_node.kubectl.exec(ns, pod, "ip", "rule", "show")
            assert re.search(r"500:\s+from 10\.20\.30\.0/24 lookup 100", rules), rules
            real_node.delete_namespace(ns)
        finally:
            on_node(real_node, "rule", "del", "priority", "500")


def test_dummy_interface_with_ipv6_subnet_route(real_node: RealNode, ns: str) -> None:
    """e2e.bats "dummy interface with IPv6 subnet route": the kernel's own subnet route, no copy."""
    with dummy(real_node, "dummy-ipv6"):
        on_node(real_node, "-6", "addr", "add", "fd36::3:0:e:0:0/96", "dev", "dummy-ipv6")
        on_node(real_node, "link", "set", "up", "dev", "dummy-ipv6")
        published(real_node, "dummy-ipv6")
        apply(real_node, ns, "resourceclaim_ipv6_subnet.yaml")
        pod = ready_pod(real_node, ns, "app=pod-ipv6")
        routes = real_node.kubectl.exec(ns, pod, "ip", "-6", "route", "show")
        # busybox's ip does not print "proto kernel"; the kernel's own IPv6 prefix route is the
        # one at metric 256 (a static copy would be at 1024).
        assert re.search(r"fd36::3:0:e:0:0/96 dev dummy-ipv6 +(proto kernel +)?metric 256", routes), routes
        assert not re.search(r"fd36::3:0:e:0:0/96 dev dummy-ipv6 +metric 1024", routes), routes
        real_node.delete_namespace(ns)


@contextlib.contextmanager
def bpf_device(node: RealNode) -> Iterator[str]:
    """e2e.bats's setup_bpf_device: dummy0 up with a clsact ``bpf`` classifier (and, as our loader
    attaches them together, a generic XDP program and, where the kernel has tcx, a tcx program
    named ``handle_ingress``: setup_tcx_filter's). Programs loaded with the bpf system call, not
    from dranet's compiled objects."""
    with dummy(node, "dummy0"):
        on_node(node, "link", "set", "up", "dev", "dummy0")
        for fd in bpf_progs.attach_all(node.spec().netns, "dummy0", tcx_name=b"handle_ingress"):
            os.close(fd)  # the attachments hold the programs
        yield "dummy0"


def _attribute(node: RealNode, name: str) -> object:
    device = slice_device(node, "dummy0")
    value = (device or {}).get("attributes", {}).get(name)
    return None if value is None else next(iter(value.values()))


def test_validate_bpf_filter_attributes(real_node: RealNode) -> None:
    """e2e.bats "validate bpf filter attributes": ``dra.net/ebpf`` and the classifier's name."""
    with bpf_device(real_node):
        assert "dranet_test" in _sh(
            "ip", "netns", "exec", real_node.spec().netns, "tc", "filter", "show", "dev", "dummy0", "ingress"
        )
        wait_for(lambda: _attribute(real_node, "dra.net/ebpf") is True, 20, 0.5, "dra.net/ebpf true")
        wait_for(lambda: _attribute(real_node, "dra.net/tcFilterNames") == "dranet_test", 20, 0.5, "tcFilterNames")


def test_validate_tcx_bpf_filter_attributes(real_node: RealNode) -> None:
    """e2e.bats "validate tcx bpf filter attributes" (the link toggled as the bats test does, for a
    notification)."""
    if not bpf_progs.has_tcx():
        pytest.skip("this kernel has no tcx (Linux 6.6)")
    with bpf_device(real_node):
        assert bpf_progs.tcx_count(real_node.spec().netns, "dummy0") == 1
        on_node(real_node, "link", "set", "down", "dev", "dummy0")
        on_node(real_node, "link", "set", "up", "dev", "dummy0")
        wait_for(lambda: _attribute(real_node, "dra.net/ebpf") is True, 20, 0.5, "dra.net/ebpf true")
        wait_for(lambda: _attribute(real_node, "dra.net/tcxProgramNames") == "handle_ingress", 20, 0.5, "tcx names")


def test_validate_bpf_programs_are_removed(real_node: RealNode, ns: str) -> None:
    """e2e.bats "validate bpf programs are removed": ``disableEbpfPrograms`` detaches them in the pod
    (read from the host in the pod's namespace: no bpftool in the image)."""
    with bpf_device(real_node):
        apply(real_node, ns, "resourceclaim_disable_ebpf.yaml")
        pod = ready_pod(real_node, ns, "app=pod")
        netns = _pod_netns(real_node, ns, pod)
        filters = _sh("nsenter", f"--net={netns}", "tc", "filter", "show", "dev", "dummy0", "ingress")
        assert "dranet_test" not in filters, filters
        assert "xdp" not in _sh("nsenter", f"--net={netns}", "ip", "-d", "link", "show", "dummy0")
        if bpf_progs.has_tcx():
            assert bpf_progs.tcx_count(netns, "dummy0") == 0
        real_node.delete_namespace(ns)


def _pod_netns(node: RealNode, ns: str, pod: str) -> str:
    """A path to a running pod's network namespace that works from the host: its pin (from the
    driver's pod state) is a mount in the node's mount namespace, so it is reached through the
    root of a process there (the node's kubelet)."""
    uid = node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"]["uid"]
    kubelet = node.state.pids[f"n{node.spec().index}/kubelet"]
    # /var/run is an absolute link to /run, which /proc/<pid>/root would resolve in our own root.
    pin = re.sub(r"^/var/run/", "/run/", node.pod_states()["pods"][uid]["netns_path"])
    return f"/proc/{kubelet}/root{pin}"


def test_validate_advanced_network_configurations(real_node: RealNode, ns: str) -> None:
    """e2e.bats "validate advanced network configurations with dummy": name, address, MTU and
    hardware address (its ethtool part needs ``apk add ethtool``: not ported; the feature setting
    is tested in tests/nic_settings/test_ethtool.py)."""
    with dummy(real_node, "dummy0"):
        on_node(real_node, "link", "set", "up", "dev", "dummy0")
        published(real_node, "dummy0")
        apply(real_node, ns, "resourceclaim_advanced.yaml")
        pod = ready_pod(real_node, ns, "app=pod")
        out = real_node.kubectl.exec(ns, pod, "ip", "addr", "show", "dranet0")
        assert "169.254.169.14/24" in out and "mtu 4321" in out and "00:11:22:33:44:55" in out, out
        real_node.delete_namespace(ns)


def test_validate_big_tcp_network_configurations(real_node: RealNode, ns: str) -> None:
    """e2e.bats "validate big tcp network configurations on dummy interface": the sizes as iproute2
    read in the pod's namespace from the host (busybox's ``ip -d`` prints none of them), ethtool not ported."""
    with dummy(real_node, "dummy0"):
        on_node(real_node, "link", "set", "up", "dev", "dummy0")
        published(real_node, "dummy0")
        apply(real_node, ns, "resourceclaim_bigtcp.yaml")
        pod = ready_pod(real_node, ns, "app=bigtcp", timeout=120)
        netns = _pod_netns(real_node, ns, pod)
        assert "mtu 8896" in _sh("nsenter", f"--net={netns}", "ip", "link", "show", "dranet1")
        # Read over rtnetlink: this machine's iproute2 (6.1) does not print the IPv4 sizes.
        want = {"gsoMaxSize": 65536, "groMaxSize": 65536, "gsoIPv4MaxSize": 65536, "groIPv4MaxSize": 65536}
        got = sizes(netns, "dranet1")
        assert {k: got.get(k) for k in want} == want, got
        real_node.delete_namespace(ns)


AGNHOST_COMMAND = '      command: ["/agnhost", "netexec", "--http-port=8080"]\n'


def test_validate_pbr_configuration(real_node: RealNode, ns: str) -> None:
    """e2e.bats "validate pbr configuration": two pods with a table-100 default route and rules, a
    router pod forwarding between them (``forwarding: true``, unprivileged), a ping across it. The
    manifest's ``command: ["/agnhost", ...]`` is dropped (no agnhost binary; the image idles)."""
    pairs = (("pbr-test-pod-1", "pbr-rtr-1"), ("pbr-test-pod-2", "pbr-rtr-2"))
    try:
        for a, b in pairs:
            on_node(real_node, "link", "add", a, "type", "veth", "peer", "name", b)
            for link in (a, b):
                on_node(real_node, "link", "set", "up", "dev", link)
                published(real_node, link)
        text = (MANIFESTS / "resourceclaim_pbr.yaml").read_text()
        assert text.count(AGNHOST_COMMAND) == 3
        real_node.kubectl.run("apply", "-n", ns, "-f", "-", stdin=text.replace(AGNHOST_COMMAND, ""))
        pods = {app: ready_pod(real_node, ns, f"app={app}") for app in ("pod-pbr-1", "pod-pbr-router", "pod-pbr-2")}
        out = real_node.kubectl.exec(ns, pods["pod-pbr-1"], "ping", "-c", "1", "-W", "5", "192.168.200.10", timeout=30)
        assert " 0% packet loss" in out, out
        real_node.delete_namespace(ns)
        # Each pair's two ends were in two pods: both come home.
        home = on_node(real_node, "-o", "link", "show")
        assert all(f" {link}@" in home or f" {link}:" in home for pair in pairs for link in pair), home
    finally:
        for a, _ in pairs:
            _sh("ip", "-n", real_node.spec().netns, "link", "del", a, check=False)


def _rollout(node: RealNode) -> None:
    image = node.kube.request("GET", f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}")
    ref = image["spec"]["template"]["spec"]["containers"][0]["image"]
    wait_for(lambda: cluster.driver_rollout_done(node.kube, ref), 180, 1, "driver rollout")


def test_allocated_device_in_resource_slice_remains_unchanged(real_node: RealNode, ns: str) -> None:
    """e2e.bats "allocated device in ResourceSlice remains unchanged": with
    ``--feature-gates=PersistentResourceSliceAttributes=true`` the device of a NIC in a pod keeps
    its attributes, also across a driver restart."""
    ds = f"daemonset/{cluster.RELEASE}"
    gate = '[{"op": "add", "path": "/spec/template/spec/containers/0/args/-", '
    gate += '"value": "--feature-gates=PersistentResourceSliceAttributes=true"}]'
    real_node.kubectl.run("patch", "-n", cluster.NAMESPACE, ds, "--type=json", "-p", gate)
    try:
        _rollout(real_node)
        with dummy(real_node, "dummy0"):
            on_node(real_node, "link", "set", "up", "dev", "dummy0")
            original = published(real_node, "dummy0")["attributes"]
            apply(real_node, ns, "resourceclaim.yaml", "dummy0")
            ready_pod(real_node, ns, "app=pod")
            assert "dummy0" not in on_node(real_node, "-o", "link", "show"), "the NIC is in the pod"
            assert published(real_node, "dummy0")["attributes"] == original
            real_node.kubectl.run("rollout", "restart", "-n", cluster.NAMESPACE, ds)
            wait_for(lambda: real_node.driver_pod().get("metadata", {}).get("annotations"), 60, 1, "restarted")
            _rollout(real_node)
            assert published(real_node, "dummy0")["attributes"] == original
            real_node.delete_namespace(ns)
    finally:
        cluster.helm(real_node.layout, "upgrade", *[a for v in DRANET_VALUES for a in ("--set", v)])
        _rollout(real_node)


def _schedule_driver_off(node: RealNode, off: bool) -> None:
    """Take the driver off the node by a label its DaemonSet's affinity excludes (e2e.bats's way)."""
    name = node.node
    ds = f"daemonset/{cluster.RELEASE}"
    if off:
        node.kubectl.run("label", "node", name, "e2e-test-do-not-schedule=true", "--overwrite")
        term = {"matchExpressions": [{"key": "e2e-test-do-not-schedule", "operator": "DoesNotExist"}]}
        aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
        patch = {"spec": {"template": {"spec": {"affinity": aff}}}}
        node.kubectl.run("patch", "-n", cluster.NAMESPACE, ds, "--type=merge", "-p", json.dumps(patch))
        wait_for(lambda: not _driver_pods(node), 120, 0.5, "the driver off the node")
    else:
        patch = {"spec": {"template": {"spec": {"affinity": None}}}}
        node.kubectl.run("patch", "-n", cluster.NAMESPACE, ds, "--type=merge", "-p", json.dumps(patch))
        node.kubectl.run("label", "node", name, "e2e-test-do-not-schedule-")
        node.wait_driver_ready()


def _driver_pods(node: RealNode) -> list[dict[str, Any]]:
    return list(
        node.kube.request(
            "GET",
            f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
            query={
                "labelSelector": "app.kubernetes.io/component=driver",
                "fieldSelector": f"spec.nodeName={node.node}",
            },
        )["items"]
    )


def test_driver_should_gracefully_shutdown_when_terminated(real_node: RealNode) -> None:
    """e2e.bats "driver should gracefully shutdown when terminated": the DRA and registration sockets
    are gone once the driver leaves the node, and back with it."""
    root = real_node.spec().kubelet_root

    def sockets() -> list[Path]:
        # Named after the driver instance here (dra-<id>.sock), so a rolling update's two pods coexist.
        found = [*root.glob("plugins/dra.net/*.sock"), *root.glob("plugins_registry/dra.net*-reg.sock")]
        return [p for p in found if p.is_socket()]

    assert len(sockets()) == 2, sockets()
    _schedule_driver_off(real_node, True)
    try:
        assert not sockets(), sockets()
    finally:
        _schedule_driver_off(real_node, False)
    wait_for(lambda: len(sockets()) == 2, 60, 0.5, "sockets back")


def test_unprepare_claims_on_driver_restart_after_pod_deletion_during_driver_downtime(
    real_node: RealNode, ns: str
) -> None:
    """e2e.bats "unprepare claims on driver restart after pod deletion during driver downtime": the
    pod's state outlives its force deletion while the driver is away, and goes (the NIC home) once
    it is back."""
    with dummy(real_node, "dummy-downtime"):
        on_node(real_node, "link", "set", "up", "dev", "dummy-downtime")
        published(real_node, "dummy-downtime")
        apply(real_node, ns, "resourceclaim.yaml", "dummy-downtime")
        pod = ready_pod(real_node, ns, "app=pod")
        uid = real_node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")["metadata"]["uid"]
        assert uid in (real_node.pod_states().get("pods") or {})
        _schedule_driver_off(real_node, True)
        try:
            real_node.kubectl.run("delete", "-n", ns, "pod", pod, "--force", "--grace-period=0")
            with pytest.raises(Exception, match="NotFound|not found"):
                real_node.kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{pod}")
            assert uid in (real_node.pod_states().get("pods") or {}), "the driver is away: its state stays"
        finally:
            _schedule_driver_off(real_node, False)
        wait_for(lambda: uid not in (real_node.pod_states().get("pods") or {}), 60, 0.5, "the pod's state gone")
        # The claim is unprepared too. (A veth, like dranet's dummy, dies with the pod's namespace;
        # a physical NIC comes home: tests/e2e/node/test_faults.py.)
        wait_for(lambda: not real_node.checkpoint().get("claims"), 60, 0.5, "the claim unprepared")
        real_node.delete_namespace(ns)


def test_the_rails_stay_where_they_are(real_node: RealNode) -> None:
    """Every netdev is published here (``filter=``), the node's rails too; none left the node."""
    for nic in real_node.layout.nics:
        assert slice_device(real_node, nic) is not None, nic
    assert set(real_node.layout.nics) <= set(fabric.node_nics(real_node.spec()))
