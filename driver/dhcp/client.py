"""The DHCP exchange on one NIC inside a pod's network namespace, within a deadline.

One UDP socket, created in the pod's namespace (a socket lives in the netns of the thread that
creates it: :func:`driver.netlink.channel.inside_netns`), bound to port 68 and to the NIC
(``SO_BINDTODEVICE``). The NIC has no address yet, so the client asks for broadcast replies
(the BROADCAST flag); the kernel delivers limited-broadcast datagrams to a socket bound to
0.0.0.0 on a NIC without an IPv4 address. DISCOVER and REQUEST are retransmitted every
:data:`RETRANSMIT` seconds until the deadline, which is far shorter than RFC 2131's backoff
(4 s, 8 s, ...): the whole exchange has to fit the NRI hook. The release is a single unicast
datagram (the server does not answer it).
"""

from __future__ import annotations

import logging
import secrets
import socket
import time
from dataclasses import dataclass

from driver.dhcp import wire
from driver.dhcp.wire import Lease, MessageError
from driver.netlink.channel import inside_netns

log = logging.getLogger(__name__)

RETRANSMIT = 0.25
"""Seconds between retransmissions of an unanswered DISCOVER or REQUEST."""

IP_FREEBIND = 15  # <linux/in.h>: bind to an address the NIC may no longer (or not yet) have


class DhcpError(Exception):
    """No lease (or no release): ``reason`` says why, for a message that names the NIC."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Exchange:
    """The outcome of :func:`acquire`: the lease and what it took."""

    lease: Lease
    seconds: float  # from the first DISCOVER to the ACK
    sent: int  # datagrams sent (DISCOVERs and REQUESTs, retransmissions included)


def _socket(ns_fd: int, ifname: str, address: str = "0.0.0.0") -> socket.socket:
    """A UDP socket in ``ns_fd``'s netns, bound to ``ifname`` and ``address``:68."""
    with inside_netns(ns_fd):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        sock.bind((address, wire.CLIENT_PORT))
    except OSError:
        sock.close()
        raise
    return sock


class _Transaction:
    """One DISCOVER-OFFER-REQUEST-ACK transaction: what to send now, and what a reply does to it."""

    def __init__(self, mac: str) -> None:
        self.mac = mac
        self.xid = secrets.randbits(32)
        self.packet, self.waiting_for = wire.discover(self.xid, mac), wire.OFFER
        self.server_id = ""

    def waiting(self) -> str:
        """What it waits for, for an error message."""
        return "DHCPOFFER" if self.waiting_for == wire.OFFER else f"DHCPACK from server {self.server_id}"

    def answer(self, reply: wire.Message) -> Lease | None:
        """Take ``reply`` (ours: this transaction, this MAC): the lease on an ACK, else None (an OFFER
        turns the transaction into a REQUEST; anything else is ignored). :class:`DhcpError` on a NAK or
        an unusable ACK. OFFERs without a server identifier are ignored."""
        if self.waiting_for == wire.OFFER and reply.kind == wire.OFFER:
            offered_by = reply.ip_option(wire.OPT_SERVER_ID)
            if offered_by is not None and reply.yiaddr != "0.0.0.0":
                self.server_id = offered_by
                self.packet, self.waiting_for = wire.request(self.xid, self.mac, reply.yiaddr, offered_by), wire.ACK
            return None
        if self.waiting_for != wire.ACK or reply.ip_option(wire.OPT_SERVER_ID) not in (self.server_id, None):
            return None
        if reply.kind == wire.NAK:
            text = reply.options.get(wire.OPT_MESSAGE, b"").decode("utf-8", "replace")
            raise DhcpError(f"server {self.server_id} refused the address (DHCPNAK{': ' + text if text else ''})")
        if reply.kind != wire.ACK:
            return None
        try:
            return wire.lease_from_ack(reply)
        except MessageError as exc:
            raise DhcpError(f"unusable DHCPACK from {self.server_id}: {exc}") from None


def acquire(ns_fd: int, ifname: str, mac: str, timeout: float, retransmit: float = RETRANSMIT) -> Exchange:
    """DISCOVER, OFFER, REQUEST, ACK on ``ifname`` (up, in ``ns_fd``'s netns) as ``mac``, within ``timeout`` s.

    Raises :class:`DhcpError` when no server answers in time, a server refuses (DHCPNAK), the
    ACK cannot be used, or the socket cannot be opened or written. Replies for other
    transactions or other MACs are ignored, and so are OFFERs without a server identifier.
    """
    if len(mac.split(":")) != 6:
        raise DhcpError(
            f"{ifname} has a {len(mac.split(':'))}-octet hardware address ({mac}): only Ethernet (6 octets) is "
            "supported, not DHCP over InfiniBand (RFC 4390)"
        )
    start = time.monotonic()
    deadline = start + timeout
    tx = _Transaction(mac)
    sent, next_send, sending = 0, start, tx.packet
    try:
        sock = _socket(ns_fd, ifname)
    except OSError as exc:
        raise DhcpError(f"cannot open a DHCP client socket on {ifname}: {exc.strerror or exc}") from None
    with sock:
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise DhcpError(f"no {tx.waiting()} within {timeout:g}s ({sent} messages sent)")
            if now >= next_send or sending is not tx.packet:  # a new message goes out at once
                try:
                    sock.sendto(tx.packet, ("255.255.255.255", wire.SERVER_PORT))
                except OSError as exc:
                    raise DhcpError(f"cannot send a DHCP message: {exc.strerror or exc}") from None
                sent, next_send, sending = sent + 1, now + retransmit, tx.packet
            sock.settimeout(max(0.001, min(next_send, deadline) - now))
            reply = _receive(sock, ifname)
            if reply is None or reply.op != wire.BOOTREPLY or reply.xid != tx.xid or reply.chaddr != mac.lower():
                continue
            lease = tx.answer(reply)
            if lease is not None:
                return Exchange(lease=lease, seconds=time.monotonic() - start, sent=sent)


def _receive(sock: socket.socket, ifname: str) -> wire.Message | None:
    """The next datagram as a DHCP message; None on the socket's timeout or for one that does not parse."""
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None
    try:
        return wire.parse(data)
    except MessageError as exc:
        log.debug("DHCP: unreadable datagram ignored", extra={"kv": {"ifname": ifname, "reason": str(exc)}})
        return None


def release(ns_fd: int, ifname: str, lease: Lease) -> None:
    """Send a DHCPRELEASE of ``lease`` from ``ifname`` (in ``ns_fd``'s netns) to its server.

    The server does not answer; the lease is freed at once instead of when it expires. Unicast
    from the leased address (RFC 2131 4.4.6); broadcast on the link when there is no route to
    the server. :class:`DhcpError` when the datagram cannot be sent at all (NIC gone or down).
    """
    try:
        sock = _socket(ns_fd, ifname, lease.ip)
    except OSError as exc:
        raise DhcpError(f"cannot open a DHCP client socket on {ifname}: {exc.strerror or exc}") from None
    packet = wire.release(secrets.randbits(32), lease)
    with sock:
        try:
            sock.sendto(packet, (lease.server_id, wire.SERVER_PORT))
        except OSError as exc:
            # No route to the server (the leased address or its routes are gone): a server on
            # the link still gets it broadcast, and it matches releases by MAC and address.
            try:
                with _socket(ns_fd, ifname) as anywhere:  # from 0.0.0.0: the leased address is not local
                    anywhere.sendto(packet, ("255.255.255.255", wire.SERVER_PORT))
            except OSError:
                raise DhcpError(f"cannot send DHCPRELEASE to {lease.server_id}: {exc.strerror or exc}") from None
