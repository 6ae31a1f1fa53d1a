"""GSO/GRO size limits: the prepare-time check on a real veth, the problems and the encoding, and the
sizes through the real hooks (real namespaces and veths; the "host" is a throwaway namespace)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from driver.nic_settings import offload_sizes
from driver.nri.claim_reports import HookError
from harness.netns import NetnsFactory
from harness.nri import link_facts
from tests.support.hook_node import Node, sizes
from tests.support.kernel import features, release

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def test_prepare_check_on_a_real_nic(netns_factory: NetnsFactory) -> None:
    nic, _ = netns_factory.veth()
    if not features().has("ipv4BigTcp"):  # before Linux 6.3: refused at prepare, naming the kernel
        (problem,) = offload_sizes.check_host_nic(nic, {"gsoMaxSize": 131072, "groIPv4MaxSize": 65536})
        assert problem == (
            f"device {nic}: interface.groIPv4MaxSize: kernel {release()} has no groIPv4MaxSize setting "
            "(IPv4 sizes need Linux 6.3)"
        )
        assert offload_sizes.check_host_nic(nic, {"gsoMaxSize": 131072}) == []
        return
    assert offload_sizes.check_host_nic(nic, {"gsoMaxSize": 131072, "groIPv4MaxSize": 65536}) == []
    (problem,) = offload_sizes.check_host_nic(nic, {"gsoIPv4MaxSize": 600000})
    assert problem == f"device {nic}: interface.gsoIPv4MaxSize: 600000 is above the NIC's maximum TSO size 524280"
    assert offload_sizes.check_host_nic("nosuchnic0", {"gsoMaxSize": 1}) == [
        "device nosuchnic0: not found in the host namespace"
    ]


def test_problems_without_kernel_support_or_tso_limit() -> None:
    (missing,) = offload_sizes.problems({"groIPv4MaxSize": 1000}, {"groMaxSize": 65536}, None)
    assert f"kernel {release()} has no groIPv4MaxSize setting (IPv4 sizes need Linux 6.3)" in missing
    assert offload_sizes.problems({"gsoMaxSize": 10**6}, {"gsoMaxSize": 65536}, None) == []  # no limit reported


def test_encoding_in_the_kernel_order() -> None:
    raw = offload_sizes.encode({"groIPv4MaxSize": 4, "gsoMaxSize": 1})
    assert raw == struct.pack("=HHI", 8, 41, 1) + struct.pack("=HHI", 8, 64, 4)


def test_offload_sizes_travel_with_the_move_and_the_hosts_come_back(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    before = sizes(node.host, node.nic)
    want = {"gsoMaxSize": 131072, "groMaxSize": 196608, "gsoIPv4MaxSize": 98304, "groIPv4MaxSize": 98304}
    if not features().has("ipv4BigTcp"):  # the IPv4 sizes need Linux 6.3: the others travel alone
        want = {"gsoMaxSize": 131072, "groMaxSize": 196608}
    node.run({"name": "net1", **want})
    assert sizes(node.pod_ns, "net1") == want
    assert node.record("offload_sizes") == before
    node.hooks.stop_pod_sandbox(node.pod)
    assert sizes(node.host, node.nic) == before


def test_offload_sizes_above_the_nic_maximum_are_refused_before_the_move(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    with pytest.raises(HookError) as info:
        node.run({"gsoMaxSize": 600000, "groMaxSize": 600000})
    msg = str(info.value)
    assert "offload sizes failed" in msg and "gsoMaxSize: 600000 is above the NIC's maximum TSO size 524280" in msg
    assert "groMaxSize: 600000 is above the kernel's maximum GRO size 524280" in msg
    assert link_facts(node.nic, node.host) == before, "nothing moved"
