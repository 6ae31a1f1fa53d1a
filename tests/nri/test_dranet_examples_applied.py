"""dranet's documented claim examples applied through the real hooks (real namespaces and veths),
where this kernel and a veth can take them (fixtures and sources: tests/fixtures/dranet_examples)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.api.v1alpha1.test_dranet_examples import params_of
from tests.support.hook_node import Node, ipj, neighbors, sizes

pytestmark = pytest.mark.root


def features(netns: str, ifname: str) -> dict[str, str]:
    out = subprocess.run(["ip", "netns", "exec", netns, "ethtool", "-k", ifname], capture_output=True, text=True)
    return dict(line.strip().split(": ", 1)[:2] for line in out.stdout.splitlines()[1:] if ": " in line)


def test_interface_configuration_advanced_example(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    (params,) = params_of("interface-configuration-advanced.yaml")
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    facts = link_facts("dranet0", node.pod_ns)
    assert facts is not None
    assert (facts["mtu"], facts["mac"], facts["addresses"]) == (4321, "00:11:22:33:44:55", ["169.254.169.14/24"])
    dsts = {r["dst"] for r in ipj(node.pod_ns, "route", "show", "dev", "dranet0")}
    assert {"169.254.169.0/24", "169.254.169.1"} <= dsts
    assert ("192.168.1.1", "00:11:22:33:44:55", ["PERMANENT"]) in neighbors(node.pod_ns, "dranet0")
    eth = features(node.pod_ns, "dranet0")
    if eth:  # ethtool(8) present: show what the kernel reports
        assert eth["tcp-segmentation-offload"].startswith("off") and eth["generic-receive-offload"].startswith("off")
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) == before


def test_gke_tpu_performance_example_without_the_gvnic_flag(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    """All of it but ``ethtool.privateFlags.enable-max-rx-buffer-size``, a gVNIC driver flag a veth lacks
    (prepare refuses it on such a NIC, naming the flag)."""
    node = Node(netns_factory, tmp_path)
    host_sizes = sizes(node.host, node.nic)
    (params,) = params_of("gke-tpu-performance.yaml")
    params = {k: v for k, v in params.items() if k != "ethtool"}
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    link = json.loads(
        subprocess.run(["ip", "-j", "-n", node.pod_ns, "link", "show", node.nic], capture_output=True, text=True).stdout
    )[0]
    assert link["mtu"] == 8896
    assert sizes(node.pod_ns, node.nic) == dict.fromkeys(
        ("gsoMaxSize", "groMaxSize", "gsoIPv4MaxSize", "groIPv4MaxSize"), 65536
    )
    node.hooks.stop_pod_sandbox(node.pod)
    assert sizes(node.host, node.nic) == host_sizes
