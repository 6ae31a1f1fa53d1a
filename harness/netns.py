"""Throwaway network namespaces and veth pairs for tests that need real netlink.

Every namespace and link is created with a random name and removed at fixture
teardown even when the test fails. This kernel has no dummy/vlan/ipvlan links,
so fake NICs are veth pairs.

Addresses and routes a test puts in the host's namespace come from :meth:`NetnsFactory.subnet`:
the host namespace is shared by every pytest worker (and any other test run on the machine), and
two host routes to one destination in one table are one too many (``ip route add``: EEXIST), two
links with one address make the driver's address-to-link map see only one of them.
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


SUBNET_LOCKS = Path("/run/dranet-tests/subnets")
"""One lock file per block of :data:`BLOCKS_V4`; a process holds its block's flock until it exits."""
BLOCKS_V4 = ipaddress.IPv4Network("10.128.0.0/10")
"""64 /16 blocks, one per process that makes host subnets; no test's literal address is in it."""
BLOCKS_V6 = ipaddress.IPv6Network("fd7e:57::/32")
"""The IPv6 blocks: a /48 per process, the same index as its IPv4 one."""

_block: int | None = None  # this process's block (index into the /16s of BLOCKS_V4)
_picks = itertools.count()


@dataclass(frozen=True)
class Subnet:
    """A /24 and a /64 that only one test uses while it runs (see :meth:`NetnsFactory.subnet`)."""

    v4: ipaddress.IPv4Network
    v6: ipaddress.IPv6Network

    def ip(self, host: int) -> str:
        """The IPv4 address ``host`` of the subnet, without a prefix."""
        return str(self.v4[host])

    def cidr(self, host: int) -> str:
        """The IPv4 address ``host`` of the subnet as a CIDR (``/24``)."""
        return f"{self.v4[host]}/{self.v4.prefixlen}"

    def ip6(self, host: int) -> str:
        """The IPv6 address ``host`` of the subnet, without a prefix."""
        return str(self.v6[host])

    def cidr6(self, host: int) -> str:
        """The IPv6 address ``host`` of the subnet as a CIDR (``/64``)."""
        return f"{self.v6[host]}/{self.v6.prefixlen}"


def _own_block() -> int:
    """This process's block: the first one whose lock no live process holds. flock, not a pid file:
    the kernel drops it when its holder dies, however it died."""
    global _block
    if _block is None:
        SUBNET_LOCKS.mkdir(parents=True, exist_ok=True)
        for index in range(2 ** (16 - BLOCKS_V4.prefixlen)):
            fd = os.open(SUBNET_LOCKS / f"{index}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _block = index  # fd stays open (and locked) for the process's lifetime
            break
        else:
            raise RuntimeError(f"every block of {BLOCKS_V4} is held by a running test process ({SUBNET_LOCKS})")
    return _block


def _host_routes() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The destination of every route of the host's namespace, all tables (addresses included:
    the local table routes each one)."""
    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for family in ("-4", "-6"):
        for route in json.loads(_ip("-j", family, "route", "show", "table", "all").stdout or "[]"):
            dst = route.get("dst", "default")
            if dst != "default":
                out.append(ipaddress.ip_network(dst, strict=False))
    return out


def free_subnet() -> Subnet:
    """A /24 of this process's /16 (and a /64 of its /48) that no route of the host's namespace
    touches: the block keeps other processes out, the route check leftovers of an earlier run."""
    block = _own_block()
    v4_base = int(BLOCKS_V4.network_address) + (block << 16)
    v6_base = int(BLOCKS_V6.network_address) + (block << 80)
    used = _host_routes()
    for _ in range(256):
        k = next(_picks) % 256
        subnet = Subnet(
            ipaddress.IPv4Network((v4_base + (k << 8), 24)), ipaddress.IPv6Network((v6_base + (k << 64), 64))
        )
        if not any(subnet.v4.overlaps(n) or subnet.v6.overlaps(n) for n in used):  # type: ignore[arg-type]
            return subnet
    raise RuntimeError(f"no free /24 in {ipaddress.IPv4Network((v4_base, 16))}: every one is routed on the host")


@dataclass
class NetnsFactory:
    """Creates namespaces (``dn-<hex>``) and veth pairs, and removes them all on :meth:`cleanup`."""

    namespaces: list[str] = field(default_factory=list)
    host_links: list[str] = field(default_factory=list)

    def netns(self) -> str:
        """A new empty named network namespace (``/run/netns/<name>``) with lo up."""
        name = f"dn-{secrets.token_hex(4)}"
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def subnet(self) -> Subnet:
        """A subnet for the host's namespace no other test uses meanwhile (:func:`free_subnet`)."""
        return free_subnet()

    def veth(
        self,
        name: str | None = None,
        peer: str | None = None,
        *,
        netns: str | None = None,
        peer_netns: str | None = None,
    ) -> tuple[str, str]:
        """A veth pair; ``name`` lives in ``netns`` (host if None), ``peer`` in ``peer_netns``."""
        name = name or f"vt{secrets.token_hex(4)}"
        peer = peer or f"vp{secrets.token_hex(4)}"
        if netns:
            # Sent from inside ``netns``: kernels before the 2025 rtnetlink change (6.1) look a new
            # link's name up in the sender's namespace, so "eth0" made into a pod from a host that
            # has an eth0 fails (EEXIST). The host, seen from there, is PID 1's namespace.
            args = ["-n", netns, "link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_netns or "1"]
        else:
            args = ["link", "add", name, "type", "veth", "peer", "name", peer]
            if peer_netns:
                args += ["netns", peer_netns]
        _ip(*args)
        if not netns:
            self.host_links.append(name)
        if not peer_netns:
            self.host_links.append(peer)
        return name, peer

    def cleanup(self) -> None:
        """Delete every namespace and host link this factory made (deleting one veth end removes both)."""
        for link in self.host_links:
            _ip("link", "del", link, check=False)
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)
        self.host_links.clear()
        self.namespaces.clear()


@pytest.fixture
def netns_factory() -> Iterator[NetnsFactory]:
    """A :class:`NetnsFactory`; skips the test when not root."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    factory = NetnsFactory()
    try:
        yield factory
    finally:
        factory.cleanup()
