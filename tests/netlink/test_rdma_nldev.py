"""RDMA netlink byte for byte against the kernel uapi, the answers' parsing, and the netns mode
detected on this kernel."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from driver.netlink import rdma_nldev
from driver.netlink.channel import NLMSGHDR, NetlinkChannel

pytestmark = pytest.mark.kernel

# include/uapi/rdma/rdma_netlink.h
UAPI = {
    "RDMA_NL_NLDEV": 5,  # enum after RDMA_NL_RDMA_CM = 1, IWCM, RSVD, LS
    "RDMA_NLDEV_CMD_GET": 1,
    "RDMA_NLDEV_CMD_SET": 2,
    "RDMA_NLDEV_CMD_NEWLINK": 3,
    "RDMA_NLDEV_CMD_SYS_GET": 6,  # after NEWLINK 3, DELLINK 4, PORT_GET 5
    "RDMA_NLDEV_ATTR_DEV_INDEX": 1,
    "RDMA_NLDEV_ATTR_DEV_NAME": 2,
    "RDMA_NLDEV_ATTR_NDEV_NAME": 51,  # after ..., RES_UNSAFE_GLOBAL_RKEY 49, NDEV_INDEX 50
    "RDMA_NLDEV_ATTR_LINK_TYPE": 65,
    "RDMA_NLDEV_SYS_ATTR_NETNS_MODE": 66,  # after ..., RES_CTXN 64, LINK_TYPE 65
    "RDMA_NLDEV_NET_NS_FD": 68,  # after DEV_PROTOCOL 67
}


def test_constants_are_the_uapi_ones() -> None:
    for name, value in UAPI.items():
        assert getattr(rdma_nldev, name) == value, name
    assert rdma_nldev.NETLINK_RDMA == 20  # include/uapi/linux/netlink.h


def test_set_netns_message_byte_for_byte() -> None:
    kind, flags, body = rdma_nldev.set_netns_request(3, 7)
    assert kind == (5 << 10) + 2 == 0x1402
    assert flags == 0x1 | 0x4  # NLM_F_REQUEST | NLM_F_ACK
    assert body == bytes.fromhex("0800 0100 03000000 0800 4400 07000000".replace(" ", ""))
    message = NLMSGHDR.pack(16 + len(body), kind, flags, 42, 0) + body
    assert message == struct.pack("=IHHII", 32, 0x1402, 5, 42, 0) + body


def test_sys_get_message_byte_for_byte() -> None:
    assert rdma_nldev.sys_get_request() == (0x1406, 0x1, b"")


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def test_answers_are_parsed() -> None:
    assert rdma_nldev.parse_netns_mode(_attr(66, b"\x00")) == "exclusive"
    assert rdma_nldev.parse_netns_mode(_attr(66, b"\x01") + _attr(67, b"\x01")) == "shared"
    assert rdma_nldev.parse_netns_mode(b"") == "unknown"
    dump = [
        _attr(1, struct.pack("=I", 0)) + _attr(2, b"mlx5_0\0") + _attr(3, struct.pack("=I", 1)),
        _attr(1, struct.pack("=I", 5)) + _attr(2, b"mlx5_1\0"),
    ]
    assert rdma_nldev.parse_devices(dump) == {"mlx5_0": 0, "mlx5_1": 5}


class FakeRdmaSocket:
    """Answers like the kernel's nldev: a device dump, then an error (or ack) for the SET."""

    def __init__(self, set_errno: int = 0) -> None:
        self.sent: list[bytes] = []
        self.set_errno = set_errno
        self.queue: list[bytes] = []

    def setsockopt(self, *a: object) -> None:
        pass

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        _length, kind, _flags, seq, _pid = NLMSGHDR.unpack_from(data)
        if kind == 0x1401:  # GET dump
            payload = _attr(1, struct.pack("=I", 4)) + _attr(2, b"mlx5_3\0")
            self.queue.append(NLMSGHDR.pack(16 + len(payload), kind, 2, seq, 0) + payload)
            self.queue.append(NLMSGHDR.pack(20, 3, 2, seq, 0) + b"\0" * 4)  # NLMSG_DONE
        else:
            err = struct.pack("=i", -self.set_errno) + data[:16]
            self.queue.append(NLMSGHDR.pack(16 + len(err), 2, 0, seq, 0) + err)  # NLMSG_ERROR / ack
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.queue.pop(0)

    def close(self) -> None:
        pass


def test_move_sends_the_set_for_the_named_device() -> None:
    sock = FakeRdmaSocket()
    rdma_nldev.move(NetlinkChannel(sock), "mlx5_3", 9)  # type: ignore[arg-type]
    set_msg = sock.sent[-1]
    assert set_msg[16:] == rdma_nldev.set_netns_request(4, 9)[2]
    with pytest.raises(rdma_nldev.RdmaMoveError, match="RDMA device mlx5_9: not in the namespace it should move from"):
        rdma_nldev.move(NetlinkChannel(FakeRdmaSocket()), "mlx5_9", 9)  # type: ignore[arg-type]
    with pytest.raises(rdma_nldev.RdmaMoveError) as refused:
        rdma_nldev.move(NetlinkChannel(FakeRdmaSocket(errno.EOPNOTSUPP)), "mlx5_3", 9)  # type: ignore[arg-type]
    # The kernel's reason, once: EOPNOTSUPP in exclusive mode is a driver that cannot change namespace.
    why = os.strerror(errno.EOPNOTSUPP)
    assert str(refused.value) == f"RDMA device mlx5_3: move refused: its driver cannot change network namespace ({why})"


def test_newlink_message_byte_for_byte() -> None:
    kind, flags, body = rdma_nldev.newlink_request("rxe0", "rxe", "eth1")
    assert (kind, flags) == ((5 << 10) + 3, 0x1 | 0x4)  # RDMA_NLDEV_CMD_NEWLINK, NLM_F_REQUEST | NLM_F_ACK
    # RDMA_NLDEV_ATTR_DEV_NAME 2, RDMA_NLDEV_ATTR_LINK_TYPE 65, RDMA_NLDEV_ATTR_NDEV_NAME 51 (iproute2's order)
    assert body == _attr(2, b"rxe0\0") + _attr(65, b"rxe\0") + _attr(51, b"eth1\0")


def test_mode_on_this_kernel_and_without_rdma_netlink() -> None:
    def missing() -> socket.socket:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    assert rdma_nldev.netns_mode(missing) == "unknown"
    assert rdma_nldev.netns_mode() in ("unknown", "shared", "exclusive")  # here: no NETLINK_RDMA -> unknown
