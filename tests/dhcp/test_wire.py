"""DHCP messages: what the client sends, how replies and leases are read (no I/O)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from driver.dhcp import wire
from driver.dhcp.wire import Lease, MessageError

MAC = "92:0e:50:89:7a:97"


def _reply(kind: int, xid: int = 7, yiaddr: str = "172.17.11.66", options: bytes = b"", mac: str = MAC) -> bytes:
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s",
        wire.BOOTREPLY,
        1,
        6,
        0,
        xid,
        0,
        0,
        bytes(4),
        ipaddress.IPv4Address(yiaddr).packed,
        bytes(4),
        bytes(4),
        bytes(int(x, 16) for x in mac.split(":")) + bytes(10),
        bytes(64),
        bytes(128),
    )
    return header + wire.MAGIC + bytes([wire.OPT_MESSAGE_TYPE, 1, kind]) + options + b"\xff"


def _opt(code: int, data: bytes) -> bytes:
    return bytes([code, len(data)]) + data


SERVER = _opt(wire.OPT_SERVER_ID, bytes([172, 17, 11, 1]))
MASK = _opt(wire.OPT_SUBNET_MASK, bytes([255, 255, 255, 0]))


def test_discover_asks_for_broadcast_replies_and_the_options_we_use() -> None:
    msg = wire.parse(wire.discover(0xDEADBEEF, MAC))
    assert msg.xid == 0xDEADBEEF and msg.chaddr == MAC and msg.kind == wire.DISCOVER
    raw = wire.discover(1, MAC)
    assert struct.unpack_from("!H", raw, 10)[0] == wire.BROADCAST_FLAG
    assert set(msg.options[wire.OPT_PARAMETER_LIST]) >= {wire.OPT_SUBNET_MASK, wire.OPT_CLASSLESS_ROUTES}
    assert len(raw) >= 300, "BOOTP minimum size"


def test_request_names_the_offered_address_and_its_server() -> None:
    msg = wire.parse(wire.request(5, MAC, "172.17.11.66", "172.17.11.1"))
    assert msg.kind == wire.REQUEST
    assert msg.ip_option(wire.OPT_REQUESTED_IP) == "172.17.11.66"
    assert msg.ip_option(wire.OPT_SERVER_ID) == "172.17.11.1"


def test_release_is_unicast_from_the_leased_address_with_the_leased_mac() -> None:
    lease = Lease(address="172.17.11.66/24", server_id="172.17.11.1", client_mac=MAC)
    raw = wire.release(9, lease)
    msg = wire.parse(raw)
    assert msg.kind == wire.RELEASE and msg.chaddr == MAC
    assert raw[12:16] == bytes([172, 17, 11, 66]), "ciaddr is the leased address"
    assert struct.unpack_from("!H", raw, 10)[0] == 0, "a release is not broadcast"
    assert msg.ip_option(wire.OPT_SERVER_ID) == "172.17.11.1"


def test_lease_from_ack_reads_address_mask_routes_and_records_the_rest() -> None:
    routes = bytes([16, 10, 200, 172, 17, 11, 1]) + bytes([32, 10, 0, 0, 9, 0, 0, 0, 0]) + bytes([0, 172, 17, 11, 254])
    options = (
        SERVER
        + MASK
        + _opt(wire.OPT_CLASSLESS_ROUTES, routes)
        + _opt(wire.OPT_ROUTER, bytes([172, 17, 11, 1]))
        + _opt(wire.OPT_MTU, (9000).to_bytes(2, "big"))
        + _opt(wire.OPT_LEASE_TIME, (600).to_bytes(4, "big"))
    )
    lease = wire.lease_from_ack(wire.parse(_reply(wire.ACK, options=options)))
    assert lease == Lease(
        address="172.17.11.66/24",
        server_id="172.17.11.1",
        client_mac=MAC,
        routes=(("10.200.0.0/16", "172.17.11.1"), ("10.0.0.9/32", None), ("0.0.0.0/0", "172.17.11.254")),
        lease_seconds=600,
        router="172.17.11.1",
        mtu=9000,
    )
    assert Lease.from_dict(lease.to_dict()) == lease


def test_an_ack_without_a_mask_is_a_host_address() -> None:
    assert wire.lease_from_ack(wire.parse(_reply(wire.ACK, options=SERVER))).address == "172.17.11.66/32"


def test_long_options_split_in_two_are_joined() -> None:
    routes = bytes([16, 10, 200, 172, 17, 11, 1])
    options = SERVER + _opt(wire.OPT_CLASSLESS_ROUTES, routes[:3]) + _opt(wire.OPT_CLASSLESS_ROUTES, routes[3:])
    lease = wire.lease_from_ack(wire.parse(_reply(wire.ACK, options=options)))
    assert lease.routes == (("10.200.0.0/16", "172.17.11.1"),)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (MASK, "no server identifier"),
        (SERVER + _opt(wire.OPT_SUBNET_MASK, bytes([255, 0, 255, 0])), "not a contiguous mask"),
        (SERVER + _opt(wire.OPT_CLASSLESS_ROUTES, bytes([33, 1, 2, 3, 4, 5, 6, 7, 8])), "more than 32"),
        (SERVER + _opt(wire.OPT_CLASSLESS_ROUTES, bytes([24, 10, 0])), "past the end"),
        (SERVER + _opt(wire.OPT_CLASSLESS_ROUTES, bytes([8, 10, 0, 0, 0])), "past the end"),
    ],
)
def test_unusable_acks_are_refused_with_the_reason(options: bytes, reason: str) -> None:
    with pytest.raises(MessageError, match=reason):
        wire.lease_from_ack(wire.parse(_reply(wire.ACK, options=options)))


def test_an_ack_without_an_address_is_refused() -> None:
    with pytest.raises(MessageError, match="no address"):
        wire.lease_from_ack(wire.parse(_reply(wire.ACK, yiaddr="0.0.0.0", options=SERVER)))


@pytest.mark.parametrize(
    "data",
    [b"", b"\x02" * 100, _reply(wire.ACK)[:236] + b"xxxx", _reply(wire.ACK, options=b"\x01\x09\x00")[:-1]],
    ids=["empty", "short", "no-magic", "truncated-option"],
)
def test_garbage_is_a_message_error_never_a_crash(data: bytes) -> None:
    with pytest.raises(MessageError):
        wire.parse(data)
