"""Per-interface sysctls through the real hooks (real namespaces and veths; the "host" is a throwaway
namespace): written in the pod, the host's recorded and set again when the NIC comes back."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from driver.api.v1alpha1.network_config import InterfaceConfig
from driver.nic_settings import sysctls
from harness.netns import NetnsFactory
from tests.support.hook_node import Node, sh, sysctl

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def test_sysctls_are_set_in_the_pod_and_the_hosts_come_back(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "link", "set", node.nic, "mtu", "1500")
    subprocess.run(["ip", "netns", "exec", node.host, "sysctl", "-qw", f"net.ipv4.conf.{node.nic}.arp_ignore=2"])
    host_forwarding = sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding")
    node.run({"name": "net1", "forwarding": not host_forwarding, "arpIgnore": 1, "arpAnnounce": 2})
    assert sysctl(node.pod_ns, "ipv4/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv6/conf/net1/forwarding") == int(not host_forwarding)
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_ignore") == 1
    assert sysctl(node.pod_ns, "ipv4/conf/net1/arp_announce") == 2
    stored = node.record("sysctls")
    assert stored["ipv4/arp_ignore"] == 2 and stored["ipv4/forwarding"] == host_forwarding
    node.hooks.stop_pod_sandbox(node.pod)
    # The kernel gave the NIC the host's defaults on its way back; the recorded values are set again.
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/arp_ignore") == 2
    assert sysctl(node.host, f"ipv4/conf/{node.nic}/forwarding") == host_forwarding


def test_a_nic_without_sysctls_records_none(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    node.run({"name": "net1"})
    assert node.record("sysctls") is None
    node.hooks.stop_pod_sandbox(node.pod)


def test_the_keys_a_config_sets() -> None:
    assert sysctls.wanted(None) == {} and sysctls.wanted(InterfaceConfig(name="net1")) == {}
    assert sysctls.wanted(InterfaceConfig(forwarding=True, arp_ignore=8)) == {
        "ipv4/forwarding": 1,
        "ipv6/forwarding": 1,
        "ipv4/arp_ignore": 8,
    }
    assert sysctls.path("ipv4/arp_ignore", "net1") == "/proc/sys/net/ipv4/conf/net1/arp_ignore"
