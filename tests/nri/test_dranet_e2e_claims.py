"""dranet's own end-to-end tests (kubernetes-sigs/dranet ``tests/e2e.bats``) whose claims a NIC can
take, through the real NRI hooks: their manifests (tests/fixtures/dranet_e2e, unchanged), the host
set up as each test sets its node up, and each test's assertions on the pod's namespace.

What had to change, per test: the NIC is a veth in a throwaway "host" namespace (this kernel has no
dummy links, and the hooks stand in for the cluster: no scheduler, so the manifest's CEL selector is
not evaluated, and no apiserver, so the claim status checks are left to the real-node suites); the
pod's namespace is read with ``ip`` instead of ``kubectl exec``."""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.model.untrusted import load_yaml_documents
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.api.v1alpha1.test_dranet_examples import dranet_parameters
from tests.support import kernel
from tests.support.hook_node import Node, ipj, rules, sh, sysctl

pytestmark = [pytest.mark.root]
MANIFESTS = Path(__file__).resolve().parents[1] / "fixtures" / "dranet_e2e"


def _params(name: str) -> dict[str, Any]:
    (params,) = dranet_parameters(load_yaml_documents((MANIFESTS / name).read_text()))
    return dict(params)


def _run(node: Node, params: dict[str, Any]) -> None:
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)


def _routes(netns: str, *args: str) -> list[str]:
    out = subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, text=True).stdout
    return [" ".join(line.split()) for line in out.splitlines()]


def test_validate_per_interface_arp_configuration(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """e2e.bats "validate per-interface ARP configuration on dummy interface"."""
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    _run(node, _params("resourceclaim_arp.yaml"))
    assert sysctl(node.pod_ns, "ipv4/conf/dranet-arp/arp_ignore") == 1
    assert sysctl(node.pod_ns, "ipv4/conf/dranet-arp/arp_announce") == 2
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) == before


def test_ip_addresses_and_routes(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """e2e.bats "dummy interface with IP addresses ResourceClaim and routes": a /32 address, a link-scope
    route to the gateway and a route through it."""
    node = Node(netns_factory, tmp_path)
    _run(node, _params("resourceclaim_route.yaml"))
    facts = link_facts("eth99", node.pod_ns)
    assert facts is not None and "169.254.169.13/32" in facts["addresses"]
    assert any(r.startswith("169.254.169.0/24 via 169.254.169.1 dev eth99") for r in _routes(node.pod_ns, "route"))
    node.hooks.stop_pod_sandbox(node.pod)


def test_route_rules_and_routes_with_non_default_table_are_copied(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """e2e.bats "route rules and routes with non-default table are copied to pod namespace": the claim
    (resourceclaim.yaml) sets its own address; the NIC's table-100 route and the rule that looks that
    table up come along."""
    node = Node(netns_factory, tmp_path)
    sh(node.host, "addr", "add", "169.254.169.13/24", "dev", node.nic)
    sh(node.host, "route", "add", "10.10.10.0/24", "via", "169.254.169.1", "dev", node.nic, "table", "100")
    sh(node.host, "rule", "add", "from", "10.20.30.0/24", "table", "100", "priority", "500")
    host_rules = rules(node.host)
    _run(node, _params("resourceclaim.yaml"))
    assert "10.10.10.0/24 via 169.254.169.1 dev eth99" in _routes(node.pod_ns, "route", "show", "table", "100")
    assert (500, "10.20.30.0/24", None, None, None, "100") in rules(node.pod_ns)
    node.hooks.stop_pod_sandbox(node.pod)
    assert rules(node.host) == host_rules
    assert [r["dst"] for r in ipj(node.host, "route", "show", "table", "100")] == ["10.10.10.0/24"]


def test_ipv6_subnet_route(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """e2e.bats "dummy interface with IPv6 subnet route": the host's IPv6 address comes along, and the
    subnet's route is the kernel's own (``proto kernel metric 256``), not a copy of it as a static one."""
    node = Node(netns_factory, tmp_path)
    sh(node.host, "-6", "addr", "add", "fd36::3:0:e:0:0/96", "dev", node.nic, "nodad")
    manifest = load_yaml_documents((MANIFESTS / "resourceclaim_ipv6_subnet.yaml").read_text())
    assert not dranet_parameters(manifest), "the claim has no config: the NIC keeps what the host gave it"
    prepare_claim(node.store, node.uid, [{"ifname": node.nic}])
    node.hooks.run_pod_sandbox(node.pod)
    routes = _routes(node.pod_ns, "-6", "route", "show")
    assert f"fd36::3:0:e:0:0/96 dev {node.nic} proto kernel metric 256 pref medium" in routes, routes
    assert not [r for r in routes if r.startswith("fd36::3:0:e:0:0/96") and "metric 1024" in r], routes
    node.hooks.stop_pod_sandbox(node.pod)


@pytest.mark.kernel
def test_validate_vrf_routing(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """e2e.bats "validate vrf routing": two pods whose NIC is in VRF ``test-vrf`` with a default
    route in it, a router pod with both NICs in its own ``test-vrf`` and forwarding on, and a ping
    from pod 1 to pod 2 across the router. The node's two veth pairs as the bats test makes them;
    the claims' parameters from resourceclaim_vrf.yaml, in its order (pod 1, pod 2, the router's
    two requests). Runs where the kernel has VRF links (the stock-kernel tier's 6.1)."""
    host = netns_factory.netns()
    kernel.skip_unless(kernel.has_link_kind(host, "vrf", "table", "10"), "VRF links")
    links = ("vrf-test-pod-1", "vrf-rtr-1", "vrf-test-pod-2", "vrf-rtr-2")
    for a, b in (links[:2], links[2:]):
        sh(host, "link", "add", a, "type", "veth", "peer", "name", b)
    for link in links:
        sh(host, "link", "set", "up", "dev", link)
    pod1, pod2, rtr1, rtr2 = dranet_parameters(load_yaml_documents((MANIFESTS / "resourceclaim_vrf.yaml").read_text()))
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns=f"/run/netns/{host}")
    pods = {}
    for name, devices in (
        ("pod-vrf-1", [("vrf-test-pod-1", pod1)]),
        ("pod-vrf-router", [("vrf-rtr-1", rtr1), ("vrf-rtr-2", rtr2)]),
        ("pod-vrf-2", [("vrf-test-pod-2", pod2)]),
    ):
        netns, uid = netns_factory.netns(), secrets.token_hex(8)
        prepare_claim(store, uid, [{"ifname": link, "config": {"opaque": [params]}} for link, params in devices])
        pods[name] = (netns, json_format.ParseDict(pod_json(uid, f"/run/netns/{netns}"), api.PodSandbox()))
        hooks.run_pod_sandbox(pods[name][1])
    ping = ["busybox", "ping", "-I", "eth1", "-c", "1", "-W", "5", "10.10.20.1"]  # -I: the VRF's domain
    out = subprocess.run(["ip", "netns", "exec", pods["pod-vrf-1"][0], *ping], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    for netns, pod in pods.values():
        assert "test-vrf" in [link["ifname"] for link in ipj(netns, "link", "show", "type", "vrf")]
        hooks.stop_pod_sandbox(pod)
    assert set(links) <= {link["ifname"] for link in ipj(host, "link", "show")}, "every NIC home"
