"""LinkProbe against real veths: carrier follows the peer, in the host and inside a "pod" netns."""

from __future__ import annotations

import subprocess

import pytest

from driver.health.links import LinkProbe
from driver.netlink.namespaces import Namespaces

pytestmark = pytest.mark.root


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def test_carrier_follows_the_peer_in_the_host_and_in_a_pod_namespace(netns_factory) -> None:
    fabric, pod = netns_factory.netns(), netns_factory.netns()
    host_nic, host_peer = netns_factory.veth(peer_netns=fabric)
    pod_nic, pod_peer = netns_factory.veth(netns=pod, peer_netns=fabric)
    for args in (["link", "set", host_nic, "up"], ["-n", pod, "link", "set", pod_nic, "up"]):
        ip(*args)
    for peer in (host_peer, pod_peer):
        ip("-n", fabric, "link", "set", peer, "up")
    probe = LinkProbe(Namespaces())
    path = f"/run/netns/{pod}"
    host = probe.host([host_nic, "nosuchlink0"])
    assert set(host) == {host_nic}, "absent links are left out"
    assert host[host_nic].admin_up and host[host_nic].carrier and host[host_nic].operstate == "up"
    inside = probe.pod(path, [pod_nic], "ns/pod")
    assert inside[pod_nic].carrier and inside[pod_nic].where == "ns/pod"

    ip("-n", fabric, "link", "set", host_peer, "down")
    ip("-n", fabric, "link", "set", pod_peer, "down")
    host, inside = probe.host([host_nic]), probe.pod(path, [pod_nic], "ns/pod")
    assert (
        host[host_nic].admin_up
        and not host[host_nic].carrier
        and host[host_nic].operstate in ("down", "lowerlayerdown")
    )
    assert inside[pod_nic].admin_up and not inside[pod_nic].carrier

    ip("-n", fabric, "link", "set", pod_peer, "up")
    assert probe.pod(path, [pod_nic], "ns/pod")[pod_nic].carrier
    assert probe.pod("/run/netns/does-not-exist", [pod_nic], "x") == {}
