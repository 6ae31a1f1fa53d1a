"""The ethtool generic-netlink client: message vocabulary, verbose bitsets, get/set requests.

``ETHTOOL_MSG_FEATURES_GET/SET`` and ``ETHTOOL_MSG_PRIVFLAGS_GET/SET`` with name-based
("verbose") bitsets, so the kernel's own feature names are used and no bit numbers are
hard-coded, and ``ETHTOOL_MSG_STRSET_GET`` for the kernel's feature-name table. pyroute2 0.9's
ethtool netlink module has neither message (its features go through the legacy ``SIOCETHTOOL``
ioctl, several ioctls per call and bound to the netns of a socket it creates itself), hence this
small raw client on the package's :class:`~driver.netlink_channel.NetlinkChannel`, like
:mod:`driver.netlink.rtnl`. What a claim asks for is resolved and applied in
:mod:`driver.netlink.ethtool`.

A genetlink socket acts on devices of the netns it was created in; the caller opens it there
(:meth:`driver.netlink.namespaces.Namespaces.socket_in`, or :func:`open_socket`). Family ids are
global, so one resolution serves every namespace.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

from driver.netlink_channel import (
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NetlinkChannel,
    attr,
    attr_list,
    inside_netns,
    text,
)

NETLINK_GENERIC = 16  # not exported by the socket module
GENL_ID_CTRL, CTRL_CMD_GETFAMILY, CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 0x10, 3, 1, 2
ETHTOOL_GENL_VERSION = 1
MSG_STRSET_GET, MSG_FEATURES_GET, MSG_FEATURES_SET, MSG_PRIVFLAGS_GET, MSG_PRIVFLAGS_SET = 1, 11, 12, 13, 14
A_HEADER_DEV_NAME = 2
A_STRSET_HEADER, A_STRSET_STRINGSETS = 1, 2
A_STRINGSETS_STRINGSET, A_STRINGSET_ID, A_STRINGSET_STRINGS = 1, 1, 3
A_STRINGS_STRING, A_STRING_VALUE = 1, 2
ETH_SS_FEATURES = 4
A_FEATURES_HEADER, A_FEATURES_HW, A_FEATURES_WANTED, A_FEATURES_ACTIVE, A_FEATURES_NOCHANGE = 1, 2, 3, 4, 5
A_PRIVFLAGS_HEADER, A_PRIVFLAGS_FLAGS = 1, 2
A_BITSET_NOMASK, A_BITSET_BITS = 1, 3
A_BITSET_BITS_BIT, A_BITSET_BIT_NAME, A_BITSET_BIT_VALUE = 1, 2, 3
_GENLMSGHDR = struct.Struct("=BBH")


class EthtoolError(Exception):
    """An ethtool request failed or was refused; the message names the device and the feature or flag."""


@dataclass
class FeatureState:
    """The features of one NIC (``ETHTOOL_MSG_FEATURES_GET``), as sets of kernel names."""

    changeable: set[str]  # "hw" features: the ones a user may toggle
    wanted: set[str]  # what was asked for (may differ from active when a dependency is off)
    active: set[str]  # what is on now
    fixed: set[str]  # never changeable ("nochange")


# -- attribute encoding/decoding --------------------------------------------------------------
def _nest(kind: int, *parts: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(parts))


def _str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def _bitset(data: bytes) -> dict[str, bool]:
    """A verbose bitset: name -> value. A list-type bitset (NOMASK) names only its set bits."""
    attrs = attr_list(data)
    is_list = any(k == A_BITSET_NOMASK for k, _ in attrs)
    out: dict[str, bool] = {}
    for kind, bits in attrs:
        if kind != A_BITSET_BITS:
            continue
        for bkind, bit in attr_list(bits):
            if bkind != A_BITSET_BITS_BIT:
                continue
            battrs = attr_list(bit)
            name = next((text(v) for k, v in battrs if k == A_BITSET_BIT_NAME), "")
            if name:
                out[name] = is_list or any(k == A_BITSET_BIT_VALUE for k, _ in battrs)
    return out


def _bitset_request(values: dict[str, bool]) -> bytes:
    """A verbose value/mask bitset: exactly the named bits change, to the given values."""
    bits = b"".join(
        _nest(A_BITSET_BITS_BIT, _str(A_BITSET_BIT_NAME, name), attr(A_BITSET_BIT_VALUE, b"") if on else b"")
        for name, on in sorted(values.items())
    )
    return _nest(A_BITSET_BITS, bits)


# -- the client -------------------------------------------------------------------------------
class Ethtool(NetlinkChannel):
    """A raw generic-netlink socket speaking the ethtool family, in the netns it was created in.

    ``family`` (from another client) skips the family lookup; ``names`` shares the kernel's
    feature-name table, which is the same in every namespace.
    """

    def __init__(self, sock: socket.socket, family: int | None = None, names: frozenset[str] | None = None) -> None:
        super().__init__(sock, ext_ack=True)  # kernel error strings make refusals readable
        self._family = family
        self._names = names

    def sibling(self, sock: socket.socket) -> Ethtool:
        """A client on ``sock`` (e.g. in a pod netns) sharing this one's family id and name table."""
        return Ethtool(sock, family=self.family(), names=self._names)

    def _request(self, family: int, cmd: int, body: bytes, what: str) -> list[bytes]:
        """One acked request; the genetlink payloads (attributes) of its replies. Raises EthtoolError."""
        msg = _GENLMSGHDR.pack(cmd, ETHTOOL_GENL_VERSION, 0) + body
        reply = self.exchange([(family, NLM_F_REQUEST | NLM_F_ACK, msg)])[0]
        if reply.error:
            note = f" ({reply.message})" if reply.message else ""
            raise EthtoolError(f"{what}: {os.strerror(reply.error)}{note}") from OSError(reply.error, what)
        return [p[_GENLMSGHDR.size :] for p in reply.payloads]

    def family(self) -> int:
        """The ethtool genetlink family id (looked up once)."""
        if self._family is None:
            body = _str(CTRL_ATTR_FAMILY_NAME, "ethtool")
            for reply in self._request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, body, "genetlink family ethtool"):
                for kind, value in attr_list(reply):
                    if kind == CTRL_ATTR_FAMILY_ID:
                        self._family = struct.unpack_from("=H", value)[0]
            if self._family is None:
                raise EthtoolError("genetlink family ethtool: no id in the kernel's answer")
        return self._family

    def feature_names(self, ifname: str) -> frozenset[str]:
        """Every feature name the kernel knows (the ``ETH_SS_FEATURES`` string set), cached."""
        if self._names is None:
            body = _nest(A_STRSET_HEADER, _str(A_HEADER_DEV_NAME, ifname))
            body += _nest(
                A_STRSET_STRINGSETS,
                _nest(A_STRINGSETS_STRINGSET, attr(A_STRINGSET_ID, struct.pack("=I", ETH_SS_FEATURES))),
            )
            names: set[str] = set()
            for reply in self._request(self.family(), MSG_STRSET_GET, body, f"device {ifname}: feature names"):
                for _k, sets in attr_list(reply):
                    for _k2, sset in attr_list(sets):
                        for k3, strings in attr_list(sset):
                            if k3 != A_STRINGSET_STRINGS:
                                continue
                            for _k4, string in attr_list(strings):
                                names.update(text(v) for k5, v in attr_list(string) if k5 == A_STRING_VALUE)
            names.discard("")
            self._names = frozenset(names)
        return self._names

    def features(self, ifname: str) -> FeatureState:
        """``ETHTOOL_MSG_FEATURES_GET`` for ``ifname``."""
        body = _nest(A_FEATURES_HEADER, _str(A_HEADER_DEV_NAME, ifname))
        sets: dict[int, set[str]] = {}
        for reply in self._request(self.family(), MSG_FEATURES_GET, body, f"device {ifname}: read features"):
            for kind, value in attr_list(reply):
                if kind in (A_FEATURES_HW, A_FEATURES_WANTED, A_FEATURES_ACTIVE, A_FEATURES_NOCHANGE):
                    sets[kind] = {n for n, on in _bitset(value).items() if on}
        return FeatureState(
            changeable=sets.get(A_FEATURES_HW, set()),
            wanted=sets.get(A_FEATURES_WANTED, set()),
            active=sets.get(A_FEATURES_ACTIVE, set()),
            fixed=sets.get(A_FEATURES_NOCHANGE, set()),
        )

    def _set_bits(self, ifname: str, cmd: int, header: int, bitset: int, values: dict[str, bool], what: str) -> None:
        """One ``*_SET`` request changing exactly the named bits of one bitset attribute."""
        if values:
            body = _nest(header, _str(A_HEADER_DEV_NAME, ifname)) + _nest(bitset, _bitset_request(values))
            self._request(self.family(), cmd, body, f"device {ifname}: set {what} {describe(values)}")

    def set_features(self, ifname: str, values: dict[str, bool]) -> None:
        """``ETHTOOL_MSG_FEATURES_SET``: the named (kernel-name) features become wanted on or off."""
        self._set_bits(ifname, MSG_FEATURES_SET, A_FEATURES_HEADER, A_FEATURES_WANTED, values, "features")

    def private_flags(self, ifname: str) -> dict[str, bool]:
        """``ETHTOOL_MSG_PRIVFLAGS_GET``: every private flag of the NIC and its value."""
        body = _nest(A_PRIVFLAGS_HEADER, _str(A_HEADER_DEV_NAME, ifname))
        what = f"device {ifname}: read private flags"
        try:
            replies = self._request(self.family(), MSG_PRIVFLAGS_GET, body, what)
        except EthtoolError as exc:
            if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EOPNOTSUPP:
                raise EthtoolError(f"device {ifname} has no private flags (its driver does not support them)") from exc
            raise
        flags: dict[str, bool] = {}
        for reply in replies:
            for kind, value in attr_list(reply):
                if kind == A_PRIVFLAGS_FLAGS:
                    flags.update(_bitset(value))
        return flags

    def set_private_flags(self, ifname: str, values: dict[str, bool]) -> None:
        """``ETHTOOL_MSG_PRIVFLAGS_SET``: the named private flags become on or off."""
        self._set_bits(ifname, MSG_PRIVFLAGS_SET, A_PRIVFLAGS_HEADER, A_PRIVFLAGS_FLAGS, values, "private flags")


def describe(values: dict[str, bool]) -> str:
    """``name=on, other=off`` (sorted), for the messages that name what was set."""
    return ", ".join(f"{k}={'on' if v else 'off'}" for k, v in sorted(values.items()))


def open_socket(netns: str | None = None) -> socket.socket:
    """A generic-netlink socket in this thread's netns, or in the one at path ``netns``."""

    def make() -> socket.socket:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)

    if netns is None:
        sock = make()
    else:
        fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with inside_netns(fd):
                sock = make()
        finally:
            os.close(fd)
    sock.bind((0, 0))
    return sock
