"""Is an IPv4 address in use on a NIC's link? An ARP probe (RFC 5227) with a bounded wait.

A probe is an ARP request whose sender address is 0.0.0.0 (so no neighbour cache learns anything
from it) for the address in question, sent on the NIC; any host holding the address answers. Sent
and heard on one raw ``AF_PACKET`` socket bound to the NIC in its namespace. The answer is waited
for a bounded time only (a pod start waits on it): silence means free as far as the link can
tell; a NIC that cannot send (down, no carrier) cannot tell, and says so.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import time

from driver.netlink.channel import inside_netns

ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800
ARP_REQUEST, ARP_REPLY = 1, 2
_ARP = struct.Struct("!HHBBH6s4s6s4s")  # htype, ptype, hlen, plen, oper, sha, spa, tha, tpa
BROADCAST = b"\xff" * 6


def probe_frame(mac: bytes, address: str) -> bytes:
    """The Ethernet frame of an ARP probe for ``address`` from a NIC whose MAC is ``mac``."""
    target = ipaddress.IPv4Address(address).packed
    arp = _ARP.pack(1, ETH_P_IP, 6, 4, ARP_REQUEST, mac, b"\0" * 4, b"\0" * 6, target)
    return BROADCAST + mac + struct.pack("!H", ETH_P_ARP) + arp


def answers(frame: bytes, address: str) -> bool:
    """Whether ``frame`` (Ethernet) is an ARP message from a host that holds ``address``: its reply,
    or its own request or announcement (a host probing or using it too)."""
    if len(frame) < 14 + _ARP.size or struct.unpack_from("!H", frame, 12)[0] != ETH_P_ARP:
        return False
    _h, ptype, _hl, _pl, oper, _sha, spa, _tha, _tpa = _ARP.unpack_from(frame, 14)
    return ptype == ETH_P_IP and oper in (ARP_REQUEST, ARP_REPLY) and spa == ipaddress.IPv4Address(address).packed


class ProbeError(OSError):
    """The probe could not be sent (the NIC is down, or gone): nothing is known."""


def in_use(netns_fd: int, ifname: str, mac: str, address: str, wait: float) -> bool:
    """Whether a host on ``ifname``'s link (in ``netns_fd``'s namespace) answers an ARP probe for
    ``address`` within ``wait`` seconds; :class:`ProbeError` when it cannot be sent."""
    with inside_netns(netns_fd):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.htons(ETH_P_ARP))
    try:
        sock.bind((ifname, ETH_P_ARP))
        sock.setblocking(False)
        try:
            sock.send(probe_frame(bytes.fromhex(mac.replace(":", "")), address))
        except OSError as exc:
            raise ProbeError(exc.errno, f"ARP probe of {address} on {ifname}: {exc.strerror}") from exc
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            try:
                frame = sock.recv(2048)
            except BlockingIOError:
                continue
            if answers(frame, address):
                return True
        return False
    finally:
        sock.close()
