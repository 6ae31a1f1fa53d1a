"""Permanent neighbor entries: the claim's and the host's in the pod (pure), the message byte by byte,
and the host's recorded, carried along and put back through the real hooks (real namespaces and veths)."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.nic_settings.neighbors import Neighbor, newneigh, pod_neighbors
from harness.netns import NetnsFactory
from tests.support.hook_node import Node, neighbors, sh

pytestmark = pytest.mark.kernel

HOST = [Neighbor("10.5.0.9", "02:00:00:00:05:09"), Neighbor("10.5.0.1", "02:00:00:00:05:01")]


def test_claim_neighbors_win_over_the_hosts_for_the_same_ip() -> None:
    config = decode_config({"neighbors": [{"destination": "10.5.0.1", "hardwareAddr": "02:aa:00:00:00:01"}]}, "p")
    assert pod_neighbors(config, HOST) == [HOST[0], Neighbor("10.5.0.1", "02:aa:00:00:00:01")]
    assert pod_neighbors(decode_config({}, "p"), HOST) == HOST


def test_the_request_byte_by_byte() -> None:
    req = newneigh("d0", 7, Neighbor("10.5.0.1", "02:aa:00:00:00:01"))
    assert req.kind == 28 and req.flags == 0x400 | 0x100  # RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE
    header = struct.pack("=BxxxiHBB", socket.AF_INET, 7, 0x80, 0, 0)  # NUD_PERMANENT
    dst = struct.pack("=HH", 8, 1) + socket.inet_aton("10.5.0.1")
    lladdr = struct.pack("=HH", 10, 2) + bytes.fromhex("02aa00000001") + b"\0\0"
    assert req.body == header + dst + lladdr


@pytest.mark.root
def test_the_hosts_permanent_entries_go_along_and_come_back(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "neigh", "add", "10.61.0.9", "lladdr", "02:00:00:00:61:09", "dev", node.nic, "nud", "permanent")
    sh(node.host, "neigh", "add", "10.61.0.8", "lladdr", "02:00:00:00:61:08", "dev", node.nic, "nud", "reachable")
    node.run({"name": "net1"})
    assert neighbors(node.pod_ns, "net1") == [("10.61.0.9", "02:00:00:00:61:09", ["PERMANENT"])]
    assert node.record("neighbors") == [{"dst": "10.61.0.9", "lladdr": "02:00:00:00:61:09"}]
    node.hooks.stop_pod_sandbox(node.pod)
    assert ("10.61.0.9", "02:00:00:00:61:09", ["PERMANENT"]) in neighbors(node.host, node.nic)
