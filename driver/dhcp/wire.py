"""DHCPv4 messages as bytes: the three a client sends, the replies it reads, the lease it keeps.

RFC 2131 (the BOOTP header and the exchange), RFC 2132 (options), RFC 3442 (classless static
routes, option 121), RFC 3396 (a long option split over several instances: concatenated). The
option-overload extension (option 52: more options in ``sname``/``file``) is not read; servers
only use it when the options do not fit a 576-byte message, which a lease with our few
requested parameters never needs. No I/O here.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Any

CLIENT_PORT = 68
SERVER_PORT = 67
MAGIC = b"\x63\x82\x53\x63"
BOOTREQUEST, BOOTREPLY = 1, 2
BROADCAST_FLAG = 0x8000  # ask for broadcast replies: the NIC has no address to receive unicast on yet

# Message types (option 53).
DISCOVER, OFFER, REQUEST, DECLINE, ACK, NAK, RELEASE = 1, 2, 3, 4, 5, 6, 7

# Options.
OPT_PAD, OPT_END = 0, 255
OPT_SUBNET_MASK, OPT_ROUTER, OPT_MTU = 1, 3, 26
OPT_REQUESTED_IP, OPT_LEASE_TIME, OPT_MESSAGE_TYPE, OPT_SERVER_ID = 50, 51, 53, 54
OPT_PARAMETER_LIST, OPT_MESSAGE, OPT_MAX_SIZE, OPT_CLASSLESS_ROUTES = 55, 56, 57, 121

REQUESTED = bytes([OPT_SUBNET_MASK, OPT_ROUTER, OPT_MTU, OPT_LEASE_TIME, OPT_SERVER_ID, OPT_CLASSLESS_ROUTES])
"""What we ask for (option 55). Only the mask and option 121 are applied (see :class:`Lease`)."""

_HEADER = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s")  # 236 bytes, then the magic cookie


class MessageError(ValueError):
    """Bytes that are not a DHCP reply we can read (a reason, never a traceback)."""


@dataclass(frozen=True)
class Message:
    """A parsed BOOTP/DHCP message: the header fields a client uses and every option."""

    op: int
    xid: int
    yiaddr: str
    chaddr: str  # "aa:bb:cc:dd:ee:ff" (the first 6 octets)
    options: dict[int, bytes] = field(default_factory=dict)

    @property
    def kind(self) -> int | None:
        """The message type (option 53), or None."""
        value = self.options.get(OPT_MESSAGE_TYPE)
        return value[0] if value and len(value) == 1 else None

    def ip_option(self, code: int) -> str | None:
        """An option holding one IPv4 address (mask, server identifier), as text; None when absent or malformed."""
        value = self.options.get(code)
        return str(ipaddress.IPv4Address(value[:4])) if value is not None and len(value) >= 4 else None

    def int_option(self, code: int, size: int) -> int | None:
        """An option holding one unsigned integer of ``size`` bytes; None when absent or malformed."""
        value = self.options.get(code)
        return int.from_bytes(value[:size], "big") if value is not None and len(value) >= size else None


@dataclass(frozen=True)
class Lease:
    """What a DHCPACK granted, as stored with the pod (``pods.json``) until its DHCPRELEASE.

    Applied in the pod, as dranet applies its lease: ``address`` (the offered address with the
    subnet mask's prefix) and ``routes`` (option 121 only; option 33 and the router, option 3,
    are not turned into routes: a default route through a secondary NIC would take the pod's
    default away from its primary interface). ``router`` and ``mtu`` are recorded, not applied.
    A release needs ``address``, ``client_mac`` (the lease's key at the server) and ``server_id``
    (where it is unicast to).
    """

    address: str  # CIDR, e.g. "192.0.2.10/24"
    server_id: str
    client_mac: str
    routes: tuple[tuple[str, str | None], ...] = ()  # (destination CIDR, gateway or None = on-link)
    lease_seconds: int | None = None
    router: str | None = None
    mtu: int | None = None

    @property
    def ip(self) -> str:
        """The leased address without its prefix length."""
        return self.address.split("/", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint form (plain JSON)."""
        return {
            "address": self.address,
            "serverID": self.server_id,
            "clientMAC": self.client_mac,
            "routes": [[dst, gw] for dst, gw in self.routes],
            "leaseSeconds": self.lease_seconds,
            "router": self.router,
            "mtu": self.mtu,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lease:
        """Inverse of :meth:`to_dict` (state this driver wrote; a wrong shape raises KeyError/TypeError)."""
        return cls(
            address=data["address"],
            server_id=data["serverID"],
            client_mac=data["clientMAC"],
            routes=tuple((dst, gw) for dst, gw in data.get("routes") or ()),
            lease_seconds=data.get("leaseSeconds"),
            router=data.get("router"),
            mtu=data.get("mtu"),
        )


def _mac_bytes(mac: str) -> bytes:
    raw = bytes(int(x, 16) for x in mac.split(":"))
    if len(raw) != 6:
        raise ValueError(f"not a 6-octet MAC address: {mac!r}")
    return raw


def _option(code: int, data: bytes) -> bytes:
    return bytes([code, len(data)]) + data


def _build(kind: int, xid: int, mac: str, options: bytes, *, ciaddr: str = "0.0.0.0", broadcast: bool = True) -> bytes:
    header = _HEADER.pack(
        BOOTREQUEST,
        1,  # htype: Ethernet
        6,
        0,
        xid,
        0,
        BROADCAST_FLAG if broadcast else 0,
        ipaddress.IPv4Address(ciaddr).packed,
        bytes(4),
        bytes(4),
        bytes(4),
        _mac_bytes(mac) + bytes(10),
        bytes(64),
        bytes(128),
    )
    body = header + MAGIC + _option(OPT_MESSAGE_TYPE, bytes([kind])) + options + bytes([OPT_END])
    return body + bytes(max(0, 300 - len(body)))  # BOOTP minimum size: some relays drop shorter ones


def discover(xid: int, mac: str) -> bytes:
    """A DHCPDISCOVER from ``mac`` asking for broadcast replies and the :data:`REQUESTED` options."""
    return _build(DISCOVER, xid, mac, _option(OPT_PARAMETER_LIST, REQUESTED) + _option(OPT_MAX_SIZE, b"\x05\xdc"))


def request(xid: int, mac: str, requested_ip: str, server_id: str) -> bytes:
    """A DHCPREQUEST (SELECTING state) for the address ``server_id`` offered."""
    options = (
        _option(OPT_REQUESTED_IP, ipaddress.IPv4Address(requested_ip).packed)
        + _option(OPT_SERVER_ID, ipaddress.IPv4Address(server_id).packed)
        + _option(OPT_PARAMETER_LIST, REQUESTED)
        + _option(OPT_MAX_SIZE, b"\x05\xdc")
    )
    return _build(REQUEST, xid, mac, options)


def release(xid: int, lease: Lease) -> bytes:
    """A DHCPRELEASE of ``lease``: unicast, from the leased address, to its server (RFC 2131 4.4.6)."""
    options = _option(OPT_SERVER_ID, ipaddress.IPv4Address(lease.server_id).packed)
    return _build(RELEASE, xid, lease.client_mac, options, ciaddr=lease.ip, broadcast=False)


def parse(data: bytes) -> Message:
    """A message from bytes; :class:`MessageError` when they are not a BOOTP message with DHCP options."""
    if len(data) < _HEADER.size + len(MAGIC):
        raise MessageError(f"{len(data)} bytes: shorter than a DHCP message")
    op, _htype, hlen, _hops, xid, _secs, _flags, _ci, yi, _si, _gi, chaddr, _sname, _file = _HEADER.unpack_from(data)
    if data[_HEADER.size : _HEADER.size + 4] != MAGIC:
        raise MessageError("no DHCP magic cookie")
    if hlen != 6:
        raise MessageError(f"hardware address length {hlen}, not Ethernet's 6")
    options: dict[int, bytes] = {}
    off, end = _HEADER.size + 4, len(data)
    while off < end:
        code = data[off]
        if code == OPT_END:
            break
        if code == OPT_PAD:
            off += 1
            continue
        if off + 2 > end or off + 2 + data[off + 1] > end:
            raise MessageError(f"option {code} runs past the end of the message")
        size = data[off + 1]
        options[code] = options.get(code, b"") + data[off + 2 : off + 2 + size]  # RFC 3396: concatenate
        off += 2 + size
    return Message(
        op=op,
        xid=xid,
        yiaddr=str(ipaddress.IPv4Address(yi)),
        chaddr=":".join(f"{b:02x}" for b in chaddr[:6]),
        options=options,
    )


def classless_routes(value: bytes) -> tuple[tuple[str, str | None], ...]:
    """Option 121 (RFC 3442) as (destination CIDR, gateway); gateway 0.0.0.0 means on-link (None).

    :class:`MessageError` when the encoding is broken (a server bug: better refuse the lease than
    apply half of its routes).
    """
    routes: list[tuple[str, str | None]] = []
    off = 0
    while off < len(value):
        width = value[off]
        if width > 32:
            raise MessageError(f"option 121: prefix length {width} is more than 32")
        significant = (width + 7) // 8
        if off + 1 + significant + 4 > len(value):
            raise MessageError("option 121: a route runs past the end of the option")
        dest = value[off + 1 : off + 1 + significant] + bytes(4 - significant)
        gateway = ipaddress.IPv4Address(value[off + 1 + significant : off + 5 + significant])
        try:
            network = ipaddress.IPv4Network((dest, width))
        except ValueError as exc:  # host bits set beyond the prefix
            raise MessageError(f"option 121: {exc}") from None
        routes.append((str(network), None if int(gateway) == 0 else str(gateway)))
        off += 1 + significant + 4
    return tuple(routes)


def lease_from_ack(ack: Message) -> Lease:
    """The :class:`Lease` a DHCPACK grants; :class:`MessageError` naming what is missing or broken."""
    server_id = ack.ip_option(OPT_SERVER_ID)
    if server_id is None or server_id == "0.0.0.0":
        raise MessageError("the DHCPACK has no server identifier (option 54): the lease could never be released")
    if ack.yiaddr == "0.0.0.0":
        raise MessageError("the DHCPACK offers no address (yiaddr 0.0.0.0)")
    mask = ack.ip_option(OPT_SUBNET_MASK)
    try:
        prefix = ipaddress.IPv4Network(f"0.0.0.0/{mask}").prefixlen if mask else 32
    except ValueError:
        raise MessageError(f"subnet mask {mask} (option 1) is not a contiguous mask") from None
    routes = classless_routes(ack.options[OPT_CLASSLESS_ROUTES]) if OPT_CLASSLESS_ROUTES in ack.options else ()
    return Lease(
        address=f"{ack.yiaddr}/{prefix}",
        server_id=server_id,
        client_mac=ack.chaddr,
        routes=routes,
        lease_seconds=ack.int_option(OPT_LEASE_TIME, 4),
        router=ack.ip_option(OPT_ROUTER),
        mtu=ack.int_option(OPT_MTU, 2),
    )
