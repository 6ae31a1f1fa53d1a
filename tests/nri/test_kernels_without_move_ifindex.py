"""Moves on a kernel without ``IFLA_NEW_IFINDEX`` (before 5.17: RHEL 9's 5.14, Ubuntu 22.04's 5.15),
shown on this one with the feature made unavailable: the NIC keeps its host ifindex in the pod and
comes home to it; a pod that already holds that index is refused before anything moves, naming the
kernel, the index and the link holding it. Real hooks, namespaces and veths."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from driver.netlink.kernel_features import MOVE_IFINDEX, detect
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts
from tests.support import kernel
from tests.support.hook_node import Node

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def _index(netns: str, ifname: str) -> int:
    out = subprocess.run(["ip", "-j", "-n", netns, "link", "show", ifname], capture_output=True, text=True, check=True)
    return int(json.loads(out.stdout)[0]["ifindex"])


def _older(node: Node) -> NRIHooks:
    kernel = detect().without(MOVE_IFINDEX)
    return NRIHooks(node.store, host_netns=f"/run/netns/{node.host}", kernel=kernel)


def test_the_nic_keeps_its_ifindex_in_the_pod_and_comes_home_to_it(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    node.hooks = _older(node)
    index, before = _index(node.host, node.nic), link_facts(node.nic, node.host)
    node.run({"name": "net1", "mtu": 1400, "addresses": ["10.62.0.5/24"]})
    assert _index(node.pod_ns, "net1") == index
    assert node.store.read(lambda s: s.pods[node.uid].devices[0].pod_index) == index
    node.hooks.stop_pod_sandbox(node.pod)
    assert _index(node.host, node.nic) == index and link_facts(node.nic, node.host) == before


def test_a_pod_holding_the_nics_ifindex_is_refused_before_anything_moves(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    node.hooks = _older(node)
    index, before = _index(node.host, node.nic), link_facts(node.nic, node.host)
    subprocess.run(
        [
            "ip",
            "-n",
            node.pod_ns,
            "link",
            "add",
            "eth0",
            "index",
            str(index),
            "type",
            "veth",
            "peer",
            "name",
            "eth0p",
            "index",
            "9999",
        ],
        check=True,
    )
    with pytest.raises(HookError) as info:
        node.run({"name": "net1"})
    assert str(info.value).endswith(
        f"move failed: kernel {detect().release} cannot give a NIC another ifindex in a pod (IFLA_NEW_IFINDEX, "
        f"Linux 5.17): it keeps {index}, which the pod's eth0 has"
    ), info.value
    assert link_facts(node.nic, node.host) == before and node.store.read(lambda s: s.pods) == {}
    # The same pod on a kernel that can choose: the NIC goes in at another index.
    kernel.skip_if(not detect().has(MOVE_IFINDEX), "no IFLA_NEW_IFINDEX", "the refusal is all it can do")
    node.hooks = NRIHooks(node.store, host_netns=f"/run/netns/{node.host}")
    node.hooks.run_pod_sandbox(node.pod)
    assert _index(node.pod_ns, "net1") != index
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) == before
