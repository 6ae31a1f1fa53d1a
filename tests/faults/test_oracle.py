"""The fault engine's oracle (`tests.faults.runner.snapshot`, one ``ip -batch`` per namespace): each
thing a return must restore is in what it reads, so a change of any of them is seen. In a
throwaway namespace, nothing else touched."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from harness.netns import NetnsFactory
from tests.faults.runner import dump, snapshot

pytestmark = pytest.mark.root


def _ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, text=True)


def _nic(netns: str) -> None:
    _ip(netns, "link", "add", "fo0", "type", "veth", "peer", "name", "fo1")
    _ip(netns, "link", "set", "fo1", "up")
    _ip(netns, "link", "set", "fo0", "up")
    _ip(netns, "addr", "add", "10.91.0.1/24", "dev", "fo0")
    _ip(netns, "addr", "add", "fd91::1/64", "dev", "fo0", "nodad")
    _ip(netns, "route", "add", "10.101.0.0/16", "via", "10.91.0.254", "dev", "fo0", "table", "500")
    _ip(netns, "-6", "route", "add", "fd92::/64", "via", "fd91::fe", "dev", "fo0")
    _ip(netns, "neigh", "add", "10.91.0.9", "lladdr", "02:00:00:00:09:09", "dev", "fo0", "nud", "permanent")


def test_what_a_return_restores_is_read(netns_factory: NetnsFactory) -> None:
    ns = netns_factory.netns()
    _nic(ns)
    (facts,) = snapshot(["fo0"], ns).values()
    assert facts is not None
    assert facts["addresses"] == ["10.91.0.1/24", "fd91::1/64"]
    assert "('10.101.0.0/16', '10.91.0.254', '500')" in facts["routes"]
    assert "('fd92::/64', 'fd91::fe', 'main')" in facts["routes"]
    assert facts["neighbors"] == ["10.91.0.9 02:00:00:00:09:09"]
    assert isinstance(facts["gso_max_size"], int) and facts["up"]
    assert snapshot(["absent0"], ns) == {"absent0": None}
    assert "lo" in dump(ns).links


@pytest.mark.parametrize(
    "change",
    [
        lambda ns: _ip(ns, "link", "set", "fo0", "mtu", "1400"),
        lambda ns: _ip(ns, "link", "set", "fo0", "address", "02:11:22:33:44:55"),
        lambda ns: _ip(ns, "link", "set", "fo0", "down"),
        lambda ns: _ip(ns, "addr", "del", "fd91::1/64", "dev", "fo0"),
        lambda ns: _ip(ns, "route", "del", "10.101.0.0/16", "table", "500"),
        lambda ns: _ip(ns, "-6", "route", "del", "fd92::/64"),
        lambda ns: _ip(ns, "neigh", "del", "10.91.0.9", "dev", "fo0"),
        lambda ns: _ip(ns, "link", "set", "fo0", "gso_max_size", "32768"),
    ],
    ids=["mtu", "mac", "down", "ipv6 address", "route in a table", "ipv6 route", "neighbour", "gso size"],
)
def test_every_change_is_seen(netns_factory: NetnsFactory, change: Callable[[str], None]) -> None:
    ns = netns_factory.netns()
    _nic(ns)
    before = snapshot(["fo0"], ns)
    change(ns)
    assert snapshot(["fo0"], ns) != before


def test_a_namespace_that_cannot_be_read_is_an_error(netns_factory: NetnsFactory) -> None:
    with pytest.raises(RuntimeError, match="ip -batch in dn-absent"):
        dump("dn-absent")
