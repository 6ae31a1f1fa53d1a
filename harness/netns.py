"""Throwaway network namespaces and veth pairs for tests that need real netlink.

Every namespace and link is created with a random name and removed at fixture
teardown even when the test fails. This kernel has no dummy/vlan/ipvlan links,
so fake NICs are veth pairs.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


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
