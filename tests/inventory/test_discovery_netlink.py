"""Discovery against real netlink: veth pairs and a bridge in throwaway network namespaces.

/sys/class/net shows the reader's netns, so the scan runs in a subprocess under
``ip netns exec`` (which also mounts that namespace's sysfs on /sys).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import bpf_progs

pytestmark = [pytest.mark.root, pytest.mark.kernel]
REPO = str(Path(__file__).resolve().parents[2])
SCAN = (
    "import json, sys; sys.path.insert(0, %r); from driver.inventory.discovery import Scanner; "
    "print(json.dumps([{'name': d.name, 'attributes': d.attributes, 'host': d.to_dict()['host']} "
    "for d in Scanner(pci_ids_paths=()).scan()]))"
) % REPO


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def scan_in(ns: str) -> dict[str, dict]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SCAN], check=True, capture_output=True, text=True, timeout=300
    )
    return {d["name"]: d for d in json.loads(out.stdout)}


def test_veth_attributes_and_addresses(netns_factory) -> None:
    ns = netns_factory.netns()
    a, b = netns_factory.veth(netns=ns, peer_netns=ns)
    ip("-n", ns, "link", "set", a, "address", "02:00:00:aa:bb:01", "mtu", "1400", "up")
    ip("-n", ns, "link", "set", b, "up")
    ip("-n", ns, "addr", "add", "10.9.0.2/24", "dev", a)
    ip("-n", ns, "addr", "add", "10.10.0.1/16", "dev", a)
    ip("-n", ns, "addr", "add", "2001:db8::5/64", "dev", a, "nodad")
    devices = scan_in(ns)
    assert "lo" not in devices
    dev = devices[a]
    attrs = dev["attributes"]
    assert attrs["dra.net/ifName"] == a and attrs["dra.net/mac"] == "02:00:00:aa:bb:01"
    assert attrs["dra.net/mtu"] == 1400 and attrs["dra.net/type"] == "veth"
    assert attrs["dra.net/virtual"] is True and attrs["dra.net/encapsulation"] == "ether"
    assert attrs["dra.net/state"] in ("up", "lowerlayerdown", "unknown")
    assert attrs["dra.net/ipv4"] == "10.10.0.1/16,10.9.0.2/24"  # sorted strings, global unicast only
    assert attrs["dra.net/ipv6"] == "2001:db8::5/64"  # the fe80:: link-local is not published
    assert attrs["dra.net/rdma"] is False and "dra.net/pciAddress" not in attrs
    assert dev["host"]["ifname"] == a and dev["host"]["virtual"] is True
    assert devices[b]["attributes"]["dra.net/state"] == "up"
    assert "dra.net/ipv4" not in devices[b]["attributes"]


def test_default_route_interface_and_slaves_excluded(netns_factory) -> None:
    ns = netns_factory.netns()
    up, up_peer = netns_factory.veth(netns=ns, peer_netns=ns)
    free, free_peer = netns_factory.veth(netns=ns, peer_netns=ns)
    br = "br" + up[2:]
    ip("-n", ns, "link", "add", br, "type", "bridge")
    ip("-n", ns, "link", "set", up, "master", br)
    for link in (br, up, up_peer, free, free_peer):
        ip("-n", ns, "link", "set", link, "up")
    ip("-n", ns, "addr", "add", "10.77.0.2/24", "dev", br)
    ip("-n", ns, "route", "add", "default", "via", "10.77.0.1", "dev", br)
    devices = scan_in(ns)
    assert br not in devices and up not in devices  # the uplink bridge and its slave
    assert {free, free_peer, up_peer} <= set(devices)  # the rest is still published
    # The uplink is recomputed every scan: move the default route and rescan.
    ip("-n", ns, "route", "del", "default")
    ip("-n", ns, "addr", "add", "10.78.0.2/24", "dev", free)
    ip("-n", ns, "route", "add", "default", "via", "10.78.0.1", "dev", free)
    devices = scan_in(ns)
    assert free not in devices and br in devices and up in devices


def test_exclude_interfaces_in_netns(netns_factory) -> None:
    ns = netns_factory.netns()
    a, b = netns_factory.veth(netns=ns, peer_netns=ns)
    code = SCAN.replace("Scanner(pci_ids_paths=())", f"Scanner(pci_ids_paths=(), exclude_interfaces=[{a!r}])")
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300
    )
    names = {d["name"] for d in json.loads(out.stdout)}
    assert a not in names and b in names


def test_ebpf_programs_are_published_by_name(netns_factory) -> None:
    """As dranet: ``dra.net/ebpf`` on every netdev, the TC ``bpf`` filters' and tcx programs' names
    of a NIC that has them (listed over rtnetlink and the bpf system call), and gone once removed."""
    ns = netns_factory.netns()
    a, b = netns_factory.veth(netns=ns, peer_netns=ns)
    fds = bpf_progs.attach_all(ns, a, tcx_name=b"dranet_tcx")
    try:
        devices = scan_in(ns)
    finally:
        for fd in fds:
            os.close(fd)
    attrs = devices[a]["attributes"]
    assert attrs["dra.net/ebpf"] is True
    assert attrs["dra.net/tcFilterNames"] == "dranet_test"
    if bpf_progs.has_tcx():
        assert attrs["dra.net/tcxProgramNames"] == "dranet_tcx"
    quiet = devices[b]["attributes"]
    assert quiet["dra.net/ebpf"] is False and "dra.net/tcFilterNames" not in quiet
    assert "dra.net/tcxProgramNames" not in quiet
    ip("-n", ns, "link", "set", a, "xdpgeneric", "off")
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", a, "clsact"], check=True)
    again = scan_in(ns)[a]["attributes"]
    assert "dra.net/tcFilterNames" not in again
    assert again["dra.net/ebpf"] is bpf_progs.has_tcx()  # the tcx program stays until detached
