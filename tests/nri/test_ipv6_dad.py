"""IPv6 duplicate address detection through the real hooks: a pod's containers start with every IPv6
address of its NICs bindable. The host's own addresses (carried in, and back home) skip detection;
a claim's new address is detected before RunPodSandbox returns, and one in use on the link refuses
the pod, naming the address, with the NIC back home as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from driver.nri.hooks import HookError
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.support.hook_node import Node, ipj, sh

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def _v6(netns: str, dev: str) -> dict[str, dict[str, object]]:
    """The link's global IPv6 addresses (CIDR) with what ``ip -j`` says of them."""
    (link,) = ipj(netns, "-6", "addr", "show", "dev", dev)
    return {f"{a['local']}/{a['prefixlen']}": a for a in link["addr_info"] if a.get("scope") == "global"}


def _bind(netns: str, address: str) -> subprocess.CompletedProcess[str]:
    code = f"import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).bind(('{address}', 0))"
    return subprocess.run(["ip", "netns", "exec", netns, "python3", "-c", code], capture_output=True, text=True)


def test_a_claims_ipv6_address_is_bindable_when_the_containers_start(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    node.run({"addresses": ["fd61::2/64"]})
    got = _v6(node.pod_ns, node.nic)
    assert "fd61::2/64" in got and not got["fd61::2/64"].get("tentative"), got
    bound = _bind(node.pod_ns, "fd61::2")
    assert bound.returncode == 0, bound.stderr
    node.hooks.stop_pod_sandbox(node.pod)


def test_the_hosts_ipv6_address_is_usable_at_once_in_the_pod_and_back_home(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "-6", "addr", "add", "fd62::2/64", "dev", node.nic, "nodad")
    before = link_facts(node.nic, node.host)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic}])
    node.hooks.run_pod_sandbox(node.pod)
    got = _v6(node.pod_ns, node.nic)
    # Added without detection: no wait in the hook, and bindable at once.
    assert "fd62::2/64" in got and not got["fd62::2/64"].get("tentative") and got["fd62::2/64"].get("nodad"), got
    assert _bind(node.pod_ns, "fd62::2").returncode == 0
    node.hooks.stop_pod_sandbox(node.pod)
    home = _v6(node.host, node.nic)
    assert not home["fd62::2/64"].get("tentative"), home
    assert _bind(node.host, "fd62::2").returncode == 0
    assert link_facts(node.nic, node.host) == before


def test_an_ipv6_address_in_use_on_the_link_refuses_the_pod(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.fabric, "-6", "addr", "add", "fd63::2/64", "dev", node.peer, "nodad")
    before = link_facts(node.nic, node.host)
    with pytest.raises(HookError) as info:
        node.run({"addresses": ["fd63::2/64"]})
    assert "address failed: interface.addresses: fd63::2/64 is in use on the link" in str(info.value), info.value
    assert "IPv6 duplicate address detection" in str(info.value)
    assert link_facts(node.nic, node.host) == before, "the NIC is back home as it was"
    assert node.store.read(lambda s: node.uid not in s.pods)
