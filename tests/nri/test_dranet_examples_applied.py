"""dranet's documented claim examples applied through the real hooks (real namespaces and veths),
where this kernel and a veth can take them (fixtures and sources: tests/fixtures/dranet_examples)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from driver.nri.claim_reports import HookError
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.api.v1alpha1.test_dranet_examples import params_of
from tests.support import kernel
from tests.support.hook_node import Node, ipj, neighbors, sizes

pytestmark = [pytest.mark.root, pytest.mark.kernel]


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
    big_tcp = kernel.features().has("ipv4BigTcp")
    if not big_tcp:  # before Linux 6.3 (Debian 12): the IPv4 sizes are refused naming the kernel; the rest applies
        prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
        with pytest.raises(HookError, match=f"kernel {re.escape(kernel.release())} has no gsoIPv4MaxSize setting"):
            node.hooks.run_pod_sandbox(node.pod)
        assert sizes(node.host, node.nic) == host_sizes
        iface = {k: v for k, v in params["interface"].items() if "IPv4" not in k}
        params = {**params, "interface": iface}
        node = Node(netns_factory, tmp_path / "again")
        host_sizes = sizes(node.host, node.nic)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    link = json.loads(
        subprocess.run(["ip", "-j", "-n", node.pod_ns, "link", "show", node.nic], capture_output=True, text=True).stdout
    )[0]
    assert link["mtu"] == 8896
    names = ("gsoMaxSize", "groMaxSize", "gsoIPv4MaxSize", "groIPv4MaxSize")
    assert sizes(node.pod_ns, node.nic) == dict.fromkeys(names if big_tcp else names[:2], 65536)
    node.hooks.stop_pod_sandbox(node.pod)
    assert sizes(node.host, node.nic) == host_sizes


def test_ipvlan_example_refused_at_prepare_without_ipvlan_and_applied_as_a_sub_interface_where_it_can_be(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """dranet's IPVLAN example: prepare asks this kernel whether it can make ipvlan links (it refuses
    naming interface.type when not); the same config as a macvlan, which this kernel has, is
    applied: a sub-interface named, sized, addressed and with its sysctls, the NIC left on the host."""
    from driver.api.v1alpha1.decode import decode_config
    from driver.claims.claim_build import ClaimBuilder, ClaimError
    from driver.model.device import Device, HostFacts
    from driver.netlink.kernel_features import link_kind_supported
    from driver.netlink.namespaces import Namespaces

    (params,) = params_of("interface-configuration-ipvlan.yaml")
    node = Node(netns_factory, tmp_path)
    device = Device("nic", {}, HostFacts(ifname=node.nic))
    builder = ClaimBuilder(lambda: {"nic": device}, "dra.net", "node")
    has_ipvlan, _ = link_kind_supported(Namespaces().host_rtnl(), "ipvlan")
    config = decode_config(params, "parameters")
    if not has_ipvlan:
        with pytest.raises(ClaimError, match="interface.type: this node's kernel cannot make ipvlan links"):
            builder._check_sub_interface("claim: ", device, config)
        params = {**params, "interface": {**params["interface"], "type": "macvlan"}}
    before = link_facts(node.nic, node.host)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic, "config": {"opaque": [params]}}])
    node.hooks.run_pod_sandbox(node.pod)
    facts = link_facts("net1", node.pod_ns)
    assert facts is not None and (facts["mtu"], facts["addresses"]) == (1400, ["192.0.2.10/24"])
    kind = ipj(node.pod_ns, "-d", "link", "show", "net1")[0]["linkinfo"]["info_kind"]
    assert kind == ("ipvlan" if has_ipvlan else "macvlan")
    arp = subprocess.run(
        ["ip", "netns", "exec", node.pod_ns, "sysctl", "-n", "net.ipv4.conf.net1.arp_ignore"], capture_output=True
    )
    assert arp.stdout.strip() == b"1"
    assert link_facts(node.nic, node.host) == before, "the NIC stays on the host, untouched"
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts("net1", node.pod_ns) is None and link_facts(node.nic, node.host) == before
