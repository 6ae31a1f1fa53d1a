"""The registry of NIC settings: the kernel's order, one name each, nothing paid for what a claim
does not ask, and a setting added through the interface alone (one object, one registry entry) on
real namespaces and veths."""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.checkpoint.state import MovedDevice, PreparedClaim, PreparedDevice
from driver.model.device import Device, HostFacts
from driver.netlink.channel import IFINFOMSG, NLM_F_REQUEST, RTM_GETLINK, attr, pick_attrs
from driver.netlink.link_info import LinkInfo
from driver.netlink.nic_moves import LinkState, PodLinkConfig, PodLinkResult
from driver.netlink.rtnl import SKIP_STATS, Request, Rtnl, newlink
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns
from harness.netns import NetnsFactory
from tests.support.hook_node import Node, NoKernel, ipj

ALWAYS = {"addresses", "rules", "neighbors"}
"""Settings that record every NIC's host state (what the host has is given back whether or not the
claim set anything)."""


def test_the_settings_run_in_the_kernels_order_under_one_name_each() -> None:
    names = [s.name for s in SETTINGS]
    assert len(set(names)) == len(names)
    order = {name: i for i, name in enumerate(names)}
    assert order["rdma"] == 0, "the RDMA device follows its netdev before anything else is set"
    assert order["ethtool"] < order["addresses"], "features are set before the NIC comes up"
    assert order["vrf"] < order["addresses"], "a NIC is enslaved to its VRF before it gets addresses"
    assert order["addresses"] < min(order["neighbors"], order["rules"]), "addresses and link up, then the rest"
    assert order["addresses"] < order["sysctls"] < order["dhcp"], "sysctls once up, DHCP once configured"


def _plain_nic() -> Nic:
    device = PreparedDevice(
        "nic",
        "node",
        "d0",
        Device("d0", host=HostFacts(ifname="eth5")),
        decode_config({"interface": {"name": "net1"}}, "p"),
    )
    nic = Nic(
        PreparedClaim("c", "ns", "c"),
        device,
        LinkState("eth5", 1500, "02:00:00:00:00:05", index=7),
        PodLinkConfig("net1"),
    )
    nic.link = LinkInfo(index=9, ifname="net1", mtu=1500, mac="02:00:00:00:00:05")
    nic.result = PodLinkResult("net1", "02:00:00:00:00:05", [])
    return nic


def test_a_nic_that_asks_for_none_of_them_costs_the_other_settings_nothing() -> None:
    """No socket, no read, no setns: every moment of the trip, with stand-ins that fail on any use."""
    nic, host, pod = _plain_nic(), NoKernel(), NoKernel(("eth0",))
    moved = MovedDevice("d0", "eth5", "net1")
    for setting in SETTINGS:
        if setting.name in ALWAYS:
            continue
        assert setting.prepare_problems(nic.device.snapshot, nic.config) == []
        setting.plan([nic], host, pod)  # type: ignore[arg-type]
        assert setting.link_attrs(nic) == b"" and setting.requests(nic) == []
        setting.in_pod([nic], pod)  # type: ignore[arg-type]
        setting.after_configure([nic], pod)  # type: ignore[arg-type]
        setting.before_return([moved], pod)  # type: ignore[arg-type]
        assert setting.restore_requests(moved, 7) == []
        setting.after_return(moved, host)  # type: ignore[arg-type]
    assert nic.records == {}


IFLA_TXQLEN = 13


def _txqlen(rtnl: Rtnl, index: int) -> int:
    (reply,) = rtnl.exchange(
        [(RTM_GETLINK, NLM_F_REQUEST, IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + SKIP_STATS)]
    )
    raw = pick_attrs(reply.payloads[0], IFINFOMSG.size, frozenset({IFLA_TXQLEN}))[IFLA_TXQLEN]
    return int(struct.unpack("=I", raw)[0])


class TxQueueLength(NicSetting):
    """A setting the driver does not have (``ip link set NIC txqueuelen N`` in the pod), written the way
    a new one would be: check and record on the host, a link attribute in the pod, undone from its record."""

    name = "tx_queue_length"

    def __init__(self, length: int) -> None:
        self.length = length

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        for nic in nics:
            nic.records[self.name] = _txqlen(host.rtnl(), nic.host.index or 0)

    def link_attrs(self, nic: Nic) -> bytes:
        return attr(IFLA_TXQLEN, struct.pack("=I", self.length))

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        length = nic.records[self.name]
        return [newlink(nic.device, index, extra=attr(IFLA_TXQLEN, struct.pack("=I", length)), step="restore")]


@pytest.mark.root
def test_a_new_setting_is_one_object_and_one_registry_entry(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node = Node(netns_factory, tmp_path, settings=(*SETTINGS, TxQueueLength(77)))
    host_length = ipj(node.host, "link", "show", node.nic)[0]["txqlen"]
    node.run({"name": "net1"})
    assert ipj(node.pod_ns, "link", "show", "net1")[0]["txqlen"] == 77
    assert node.record("tx_queue_length") == host_length
    node.hooks.stop_pod_sandbox(node.pod)
    assert ipj(node.host, "link", "show", node.nic)[0]["txqlen"] == host_length
