"""The DHCP client against a real server (busybox udhcpd) across a veth pair, in namespaces of its own."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.dhcp import client
from driver.dhcp.client import DhcpError
from harness.netns import NetnsFactory
from tests.support.dhcp_server import UdhcpdServer, start_udhcpd

pytestmark = pytest.mark.root


def _mac(ifname: str, netns: str) -> str:
    return json.loads(subprocess.check_output(["ip", "-n", netns, "-j", "link", "show", ifname]))[0]["address"]


@pytest.fixture
def link(netns_factory: NetnsFactory, tmp_path: Path) -> Iterator[tuple[int, str, str, UdhcpdServer]]:
    """(client netns fd, client ifname, its MAC, the server) with the client end up."""
    server_ns, client_ns = netns_factory.netns(), netns_factory.netns()
    nic, peer = netns_factory.veth(netns=client_ns, peer_netns=server_ns)
    subprocess.run(["ip", "-n", client_ns, "link", "set", nic, "up"], check=True)
    server = start_udhcpd(server_ns, peer, "10.77.3", tmp_path / "dhcp", routes=[("10.203.0.0/16", "10.77.3.1")])
    fd = os.open(f"/run/netns/{client_ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd, nic, _mac(nic, client_ns), server
    finally:
        os.close(fd)
        server.stop()


def test_lease_then_release_reaches_the_server(link: tuple[int, str, str, UdhcpdServer]) -> None:
    fd, nic, mac, server = link
    exchange = client.acquire(fd, nic, mac, timeout=1.0)
    lease = exchange.lease
    assert lease.address.endswith("/24") and lease.address.startswith("10.77.3.")
    assert lease.server_id == server.address and lease.client_mac == mac
    assert lease.routes == (("10.203.0.0/16", "10.77.3.1"),)
    assert exchange.seconds < 0.5, exchange
    assert server.leases()[mac][0] == lease.ip and server.leases()[mac][1] != "expired"
    # The hook adds the leased address before anything can release it: a unicast release.
    subprocess.run(["nsenter", f"--net=/proc/{os.getpid()}/fd/{fd}", "ip", "addr", "add", lease.address, "dev", nic])
    client.release(fd, nic, lease)
    assert server.released(mac), server.log()


def test_no_server_times_out_within_the_deadline_naming_the_step(link: tuple[int, str, str, UdhcpdServer]) -> None:
    fd, nic, mac, server = link
    server.stop()
    with pytest.raises(DhcpError, match=r"no DHCPOFFER within 0.4s \(\d+ messages sent\)"):
        client.acquire(fd, nic, mac, timeout=0.4)


def test_a_missing_nic_is_a_clear_error(link: tuple[int, str, str, UdhcpdServer]) -> None:
    fd, _, mac, _ = link
    with pytest.raises(DhcpError, match="cannot open a DHCP client socket on nosuchnic0: No such device"):
        client.acquire(fd, "nosuchnic0", mac, timeout=0.2)


def test_release_without_the_address_is_broadcast_on_the_link(link: tuple[int, str, str, UdhcpdServer]) -> None:
    fd, nic, mac, server = link
    lease = client.acquire(fd, nic, mac, timeout=1.0).lease
    client.release(fd, nic, lease)  # the address was never added: no route to the server
    assert server.released(mac), server.log()


def test_an_infiniband_address_is_refused_before_anything_is_sent(link: tuple[int, str, str, UdhcpdServer]) -> None:
    fd, nic, _, server = link
    ib_mac = ":".join(["80"] + ["00"] * 19)
    with pytest.raises(DhcpError, match="20-octet hardware address .* not DHCP over InfiniBand"):
        client.acquire(fd, nic, ib_mac, timeout=0.2)
    assert "DISCOVER" not in server.log() and "OFFER" not in server.log()
