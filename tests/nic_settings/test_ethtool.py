"""driver.netlink.ethtool and its client ethtool_genl on real veth NICs: features read and set over
ethtool genetlink, checked against the legacy SIOCETHTOOL ioctl (pyroute2's implementation, a
different kernel path).

veth facts this relies on (kernel 6.x): tx-checksum-ip-generic and tx-checksum-sctp are on
and changeable, rx-gro is off and changeable, tx-checksum-ipv4 is fixed off, and veth has no
private flags.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
from collections.abc import Iterator

import pytest
from pyroute2.ethtool.ioctl import IoctlEthtool

from driver.netlink import ethtool_genl
from driver.netlink.ethtool_genl import Ethtool, EthtoolError
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings import ethtool

pytestmark = [pytest.mark.root, pytest.mark.kernel]

CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def in_netns(netns: str | None) -> Iterator[None]:
    """This thread inside ``/run/netns/<netns>`` for the body (no-op for None)."""
    if netns is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        assert libc.setns(target, CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
        try:
            yield
        finally:
            assert libc.setns(own, CLONE_NEWNET) == 0, os.strerror(ctypes.get_errno())
    finally:
        os.close(target)
        os.close(own)


def ioctl_features(ifname: str, netns: str | None = None) -> dict[str, bool]:
    """Every feature of ``ifname`` and whether it is on, via SIOCETHTOOL (independent oracle)."""
    with in_netns(netns):
        eth = IoctlEthtool(ifname)  # its socket is created here, so it acts in that netns
    try:
        return {name: bool(on) for name, on, _avail, _set, _idx in eth.get_features() if name}
    finally:
        eth.close()


def ioctl_set(ifname: str, values: dict[str, bool], netns: str | None = None) -> None:
    """Set features via SIOCETHTOOL (test setup independent of the code under test)."""
    with in_netns(netns):
        eth = IoctlEthtool(ifname)
    try:
        feats = eth.get_features()
        for name, on in values.items():
            feats[name] = on
        eth.set_features(feats)
    finally:
        eth.close()


@pytest.fixture
def host_eth() -> Iterator[Ethtool]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    eth = Ethtool(ethtool_genl.open_socket())
    try:
        yield eth
    finally:
        eth.close()


def test_read_matches_the_ioctl_view(host_eth: Ethtool, netns_factory) -> None:
    a, _ = netns_factory.veth()
    state = host_eth.features(a)
    oracle = ioctl_features(a)
    assert state.active == {n for n, on in oracle.items() if on}
    assert {"rx-gro", "tx-checksum-ip-generic", "tx-checksum-sctp"} <= state.changeable
    assert "tx-checksum-ipv4" not in state.changeable
    assert set(oracle) == set(host_eth.feature_names(a))  # the same kernel string table


def test_set_in_pod_netns_and_restore_exactly(netns_factory) -> None:
    pod_ns = netns_factory.netns()
    ifname = f"pe{secrets.token_hex(3)}"
    netns_factory.veth(ifname, netns=pod_ns)
    before = ioctl_features(ifname, pod_ns)
    assert before["tx-checksum-ip-generic"] and not before["rx-gro"] and before["tx-tcp-segmentation"]
    eth = Ethtool(ethtool_genl.open_socket(f"/run/netns/{pod_ns}"))
    try:
        plan = ethtool.plan(eth, ifname, {"tx-checksum-ip-generic": False, "rx-gro": True}, None)
        assert plan.features == {"tx-checksum-ip-generic": False, "rx-gro": True}
        assert plan.original_features == {"tx-checksum-ip-generic": True, "rx-gro": False}
        ethtool.apply(eth, "nic-p", ifname, plan.features, plan.private_flags)
        during = ioctl_features(ifname, pod_ns)
        assert not during["tx-checksum-ip-generic"] and during["rx-gro"]
        # The kernel drops TSO once no IP checksum offload is left (sctp's does not count).
        assert not during["tx-tcp-segmentation"]
        ethtool.apply(eth, "nic-p", ifname, plan.original_features, plan.original_private_flags)
    finally:
        eth.close()
    assert ioctl_features(ifname, pod_ns) == before  # dependants (TSO) come back too


@pytest.mark.parametrize(
    ("alias", "expect"),
    [
        ("tx", {"tx-checksum-ip-generic", "tx-checksum-sctp"}),  # only the changeable tx-checksum-*
        ("tx-checksumming", {"tx-checksum-ip-generic", "tx-checksum-sctp"}),
        ("gro", {"rx-gro"}),
        ("generic-receive-offload", {"rx-gro"}),
        ("gso", {"tx-generic-segmentation"}),
        (
            "tso",
            {"tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-tcp-ecn-segmentation", "tx-tcp-mangleid-segmentation"},
        ),
    ],
)
def test_ethtool_cli_aliases_map_to_kernel_names(
    alias: str, expect: set[str], host_eth: Ethtool, netns_factory
) -> None:
    a, _ = netns_factory.veth()
    plan = ethtool.plan(host_eth, a, {alias: False}, None)
    # Kernels may add tx-tcp*-segmentation variants (accecn on 6.18): at least the classic ones.
    assert expect <= set(plan.features) and all(v is False for v in plan.features.values())
    assert all(n in host_eth.features(a).changeable for n in plan.features)
    before = ioctl_features(a)
    ethtool.apply(host_eth, "nic-a", a, plan.features, {})
    after = ioctl_features(a)
    assert all(not after[n] for n in plan.features)
    ethtool.apply(host_eth, "nic-a", a, plan.original_features, {})
    assert ioctl_features(a) == before


def test_unknown_and_fixed_features_are_errors_naming_device_and_feature(host_eth: Ethtool, netns_factory) -> None:
    a, _ = netns_factory.veth()
    before = ioctl_features(a)
    with pytest.raises(EthtoolError) as err:
        ethtool.plan(host_eth, a, {"no-such-offload": True, "tx-checksum-ipv4": True, "rx-gro": True}, None)
    msg = str(err.value)
    assert f"device {a}: ethtool feature 'no-such-offload' is unknown" in msg
    assert f"device {a}: ethtool feature 'tx-checksum-ipv4' is fixed off" in msg
    assert "rx-gro" not in msg  # a good name in the same config is not reported
    # Fixed and already as asked: nothing to do, not an error (ethtool -K behaves the same).
    assert ethtool.plan(host_eth, a, {"tx-checksum-ipv4": False}, None).empty()
    assert ioctl_features(a) == before  # refusing changes nothing


def test_kernel_refusing_a_dependent_feature_is_reported(host_eth: Ethtool, netns_factory) -> None:
    a, _ = netns_factory.veth()
    ioctl_set(a, {"tx-checksum-ip-generic": False, "tx-checksum-sctp": False, "tx-tcp-segmentation": False})
    assert not ioctl_features(a)["tx-tcp-segmentation"]
    with pytest.raises(NetnsOpError) as err:
        ethtool.apply(host_eth, "nic-a", a, {"tx-tcp-segmentation": True}, {})
    assert err.value.device == "nic-a" and err.value.step == "ethtool"
    assert "tx-tcp-segmentation=on" in str(err.value) and a in str(err.value)


def test_private_flags_on_a_nic_without_any(host_eth: Ethtool, netns_factory) -> None:
    a, _ = netns_factory.veth()
    with pytest.raises(
        EthtoolError, match=f"device {a} has no private flags.*cannot set ethtool private flags rx_striding_rq"
    ):
        ethtool.plan(host_eth, a, None, {"rx_striding_rq": True})
    with pytest.raises(EthtoolError, match=f"device {a}: set private flags rx_striding_rq=on"):
        host_eth.set_private_flags(a, {"rx_striding_rq": True})
    assert ethtool.resolve_private_flags("eth9", {"x": True, "a": False}, {"a": True, "b": False}) == [
        "device eth9: ethtool private flag 'x' does not exist on this NIC (it has: a, b)"
    ]


def test_check_features_for_prepare(netns_factory) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    a, _ = netns_factory.veth()
    assert ethtool.check_features(a, {"gro": True, "tx-checksum-ip-generic": False}) == []
    assert ethtool.check_features(a, None) == [] and ethtool.check_features(a, {}) == []
    errs = ethtool.check_features(a, {"bogus": True, "tx-checksum-ipv4": True}, private_flags={"p": True})
    assert len(errs) == 3 and all(e.startswith(f"device {a}") for e in errs), errs
    assert "'bogus'" in errs[0] and "'tx-checksum-ipv4'" in errs[1] and "private flags" in errs[2]
    # In another namespace, by path.
    pod_ns = netns_factory.netns()
    inner = f"pi{secrets.token_hex(3)}"
    netns_factory.veth(inner, netns=pod_ns)
    assert ethtool.check_features(inner, {"gro": True}, netns=f"/run/netns/{pod_ns}") == []
    missing = ethtool.check_features(inner, {"gro": True})  # not in this namespace
    assert len(missing) == 1 and inner in missing[0] and "No such device" in missing[0]
