"""GSO/GRO size limits: the prepare-time check on a real veth, the problems and the encoding."""

from __future__ import annotations

import struct

import pytest

from driver.netlink import offload_sizes
from tests.plugins.netns import NetnsFactory

pytestmark = pytest.mark.root


def test_prepare_check_on_a_real_nic(netns_factory: NetnsFactory) -> None:
    nic, _ = netns_factory.veth()
    assert offload_sizes.check_host_nic(nic, {"gsoMaxSize": 131072, "groIPv4MaxSize": 65536}) == []
    (problem,) = offload_sizes.check_host_nic(nic, {"gsoIPv4MaxSize": 600000})
    assert problem == f"device {nic}: interface.gsoIPv4MaxSize: 600000 is above the NIC's maximum TSO size 524280"
    assert offload_sizes.check_host_nic("nosuchnic0", {"gsoMaxSize": 1}) == [
        "device nosuchnic0: not found in the host namespace"
    ]


def test_problems_without_kernel_support_or_tso_limit() -> None:
    (missing,) = offload_sizes.problems({"groIPv4MaxSize": 1000}, {"groMaxSize": 65536}, None)
    assert "this kernel has no groIPv4MaxSize setting" in missing
    assert offload_sizes.problems({"gsoMaxSize": 10**6}, {"gsoMaxSize": 65536}, None) == []  # no limit reported


def test_encoding_in_the_kernel_order() -> None:
    raw = offload_sizes.encode({"groIPv4MaxSize": 4, "gsoMaxSize": 1})
    assert raw == struct.pack("=HHI", 8, 41, 1) + struct.pack("=HHI", 8, 64, 4)
