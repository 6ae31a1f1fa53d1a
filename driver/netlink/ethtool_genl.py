"""The ethtool generic-netlink client: features and private flags of a NIC, on pyroute2's message classes.

``ETHTOOL_MSG_FEATURES_GET/SET`` and ``ETHTOOL_MSG_PRIVFLAGS_GET/SET``, and
``ETHTOOL_MSG_STRSET_GET`` for the kernel's feature-name table; the messages are pyroute2's
classes (:mod:`driver.netlink.ethtool_messages`), pipelined on the package's
:class:`~driver.netlink.channel.NetlinkChannel`. Features are read as compact bitsets (bit ``i``
is string ``i`` of the kernel's ``ETH_SS_FEATURES`` table, read once: no bit number is written
here) and set by name; private flags, whose names are the NIC driver's own, are read and set by
name. What a claim asks for is resolved and applied in :mod:`driver.netlink.ethtool`.

Features are read in the kernel's compact answer (the verbose one cost more to build and parse
than pyroute2's decoding); most of a set is pyroute2's encoding; the name table is read once per
process. A pod cycle of NICs with features costs a little more than hand-packed messages would
(measured on veths: docs/performance.md, "pyroute2 or hand-packed netlink"): only pods whose claims
set ethtool options pay it, and none of it is in ``bench.bench_hooks``' pod start.

A genetlink socket acts on devices of the netns it was created in; the caller opens it there
(:meth:`driver.netlink.namespaces.Namespaces.socket_in`, or :func:`open_socket`). Family ids are
global, so one resolution serves every namespace.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from driver.netlink.channel import NLM_F_ACK, NLM_F_REQUEST, NetlinkChannel, inside_netns

NETLINK_GENERIC = 16  # not exported by the socket module
ETH_SS_FEATURES = 4  # the string set naming the features' bits
ETHTOOL_FLAG_COMPACT_BITSETS = 1  # answer bitsets as u32 words, not one nested attribute per bit


class EthtoolError(Exception):
    """An ethtool request failed or was refused; the message names the device and the feature or flag."""


@dataclass
class FeatureState:
    """The features of one NIC (``ETHTOOL_MSG_FEATURES_GET``), as sets of kernel names."""

    changeable: set[str]  # "hw" features: the ones a user may toggle
    wanted: set[str]  # what was asked for (may differ from active when a dependency is off)
    active: set[str]  # what is on now
    fixed: set[str]  # never changeable ("nochange")


def _messages() -> Any:
    """pyroute2's ethtool message classes, loaded with the first request (not at daemon start)."""
    from driver.netlink import ethtool_messages

    return ethtool_messages


def _header(message: str, ifname: str, flags: int = 0) -> tuple[str, dict[str, list[tuple[str, object]]]]:
    """The request header attribute of ``message`` (``FEATURES``, ``PRIVFLAGS``, ``STRSET``) for ``ifname``."""
    attrs: list[tuple[str, object]] = [("ETHTOOL_A_HEADER_DEV_NAME", ifname)]
    if flags:
        attrs.append(("ETHTOOL_A_HEADER_FLAGS", flags))
    return f"ETHTOOL_A_{message}_HEADER", {"attrs": attrs}


def _named_bits(bitset: Any) -> dict[str, bool]:
    """A verbose bitset: name -> value. A list-type bitset (NOMASK) names only its set bits."""
    is_list = bitset.get_attr("ETHTOOL_A_BITSET_NOMASK") is not None
    bits = bitset.get_attr("ETHTOOL_A_BITSET_BITS")
    out: dict[str, bool] = {}
    for bit in bits.get_attrs("ETHTOOL_A_BITSET_BITS_BIT") if bits is not None else ():
        name = bit.get_attr("ETHTOOL_A_BITSET_BIT_NAME")
        if name:
            out[name] = is_list or bit.get_attr("ETHTOOL_A_BITSET_BIT_VALUE") is not None
    return out


def _compact_on(bitset: Any, table: Sequence[str]) -> set[str]:
    """The names of the set bits of a compact bitset (``VALUE``, within ``MASK`` when there is one)."""
    if bitset is None:
        return set()
    value = bitset.get_attr("ETHTOOL_A_BITSET_VALUE") or ()
    mask = bitset.get_attr("ETHTOOL_A_BITSET_MASK")
    out = set()
    for word_index, word in enumerate(value):
        if mask is not None:
            word &= mask[word_index] if word_index < len(mask) else 0
        base = 32 * word_index
        while word:
            low = word & -word
            index = base + low.bit_length() - 1
            if index < len(table):
                out.add(table[index])
            word ^= low
    return out


@functools.lru_cache(maxsize=4)
def _bit_index(table: tuple[str, ...]) -> dict[str, int]:
    """Feature name -> bit index, per name table (one table per kernel)."""
    return {name: i for i, name in enumerate(table) if name}


def _compact_request(values: dict[str, bool], table: tuple[str, ...]) -> dict[str, list[tuple[str, object]]]:
    """A compact value/mask bitset over ``table``'s bits: exactly the named bits change, to the
    given values (one pair of u32 arrays: far cheaper to encode than one attribute per bit)."""
    index = _bit_index(table)
    words = (len(table) + 31) // 32
    value, mask = [0] * words, [0] * words
    for name, on in values.items():
        bit = index[name]
        mask[bit // 32] |= 1 << (bit % 32)
        if on:
            value[bit // 32] |= 1 << (bit % 32)
    return {
        "attrs": [
            ("ETHTOOL_A_BITSET_SIZE", len(table)),
            ("ETHTOOL_A_BITSET_VALUE", value),
            ("ETHTOOL_A_BITSET_MASK", mask),
        ]
    }


def _bits_request(values: dict[str, bool]) -> dict[str, list[tuple[str, object]]]:
    """A verbose value/mask bitset: exactly the named bits change, to the given values."""
    bits = []
    for name, on in sorted(values.items()):
        bit: list[tuple[str, object]] = [("ETHTOOL_A_BITSET_BIT_NAME", name)]
        if on:
            bit.append(("ETHTOOL_A_BITSET_BIT_VALUE", True))
        bits.append(("ETHTOOL_A_BITSET_BITS_BIT", {"attrs": bit}))
    return {"attrs": [("ETHTOOL_A_BITSET_BITS", {"attrs": bits})]}


class Ethtool(NetlinkChannel):
    """A generic-netlink socket speaking the ethtool family, in the netns it was created in.

    ``family`` (from another client) skips the family lookup; ``names`` shares the kernel's
    feature-name table (bit index -> name), which is the same in every namespace.
    """

    def __init__(self, sock: socket.socket, family: int | None = None, names: tuple[str, ...] | None = None) -> None:
        super().__init__(sock, ext_ack=True)  # kernel error strings make refusals readable
        self._family = family
        self._table = names

    def sibling(self, sock: socket.socket) -> Ethtool:
        """A client on ``sock`` (e.g. in a pod netns) sharing this one's family id and name table."""
        return Ethtool(sock, family=self.family(), names=self._table)

    def _request(self, cls: Any, family: int, cmd: int, attrs: Iterable[tuple[str, object]], what: str) -> list[Any]:
        """One acked request of message class ``cls``; its decoded replies. Raises EthtoolError."""
        msg = cls()
        msg["cmd"], msg["version"] = cmd, _messages().ETHTOOL_GENL_VERSION
        msg["attrs"] = list(attrs)
        msg["header"]["type"], msg["header"]["flags"] = family, NLM_F_REQUEST | NLM_F_ACK
        reply = self.exchange_messages([msg])[0]
        if reply.error:
            note = f" ({reply.message})" if reply.message else ""
            raise EthtoolError(f"{what}: {os.strerror(reply.error)}{note}") from OSError(reply.error, what)
        out = []
        for frame in reply.frames:
            answer = cls(frame)
            answer.decode()
            out.append(answer)
        return out

    def family(self) -> int:
        """The ethtool genetlink family id (looked up once)."""
        if self._family is None:
            m = _messages()
            attrs, what = [("CTRL_ATTR_FAMILY_NAME", "ethtool")], "genetlink family ethtool"
            for reply in self._request(m.ctrlmsg, m.GENL_ID_CTRL, m.CTRL_CMD_GETFAMILY, attrs, what):
                self._family = reply.get_attr("CTRL_ATTR_FAMILY_ID")
            if self._family is None:
                raise EthtoolError("genetlink family ethtool: no id in the kernel's answer")
        return self._family

    def _feature_table(self, ifname: str) -> tuple[str, ...]:
        """The kernel's ``ETH_SS_FEATURES`` string set: feature name by bit index (read once)."""
        if self._table is None:
            m = _messages()
            stringset = {"attrs": [("ETHTOOL_A_STRINGSET_ID", ETH_SS_FEATURES)]}
            attrs = [
                _header("STRSET", ifname),
                ("ETHTOOL_A_STRSET_STRINGSETS", {"attrs": [("ETHTOOL_A_STRINGSETS_STRINGSET", stringset)]}),
            ]
            what = f"device {ifname}: feature names"
            names: dict[int, str] = {}
            for reply in self._request(m.ethtool_strset_msg, self.family(), m.ETHTOOL_MSG_STRSET_GET, attrs, what):
                sets = reply.get_attr("ETHTOOL_A_STRSET_STRINGSETS")
                for sset in sets.get_attrs("ETHTOOL_A_STRINGSETS_STRINGSET") if sets is not None else ():
                    for strings in sset.get_attrs("ETHTOOL_A_STRINGSET_STRINGS"):
                        for string in strings.get_attrs("ETHTOOL_A_STRINGS_STRING"):
                            names[string.get_attr("ETHTOOL_A_STRING_INDEX")] = string.get_attr("ETHTOOL_A_STRING_VALUE")
            self._table = tuple(names.get(i) or "" for i in range(max(names, default=-1) + 1))
        return self._table

    def feature_names(self, ifname: str) -> frozenset[str]:
        """Every feature name the kernel knows (the ``ETH_SS_FEATURES`` string set), cached."""
        return frozenset(_bit_index(self._feature_table(ifname)))

    def features(self, ifname: str) -> FeatureState:
        """``ETHTOOL_MSG_FEATURES_GET`` for ``ifname``."""
        m, table = _messages(), self._feature_table(ifname)
        attrs = [_header("FEATURES", ifname, ETHTOOL_FLAG_COMPACT_BITSETS)]
        what = f"device {ifname}: read features"
        sets: dict[str, set[str]] = {"HW": set(), "WANTED": set(), "ACTIVE": set(), "NOCHANGE": set()}
        for reply in self._request(m.features_msg, self.family(), m.ETHTOOL_MSG_FEATURES_GET, attrs, what):
            for key in sets:
                sets[key] |= _compact_on(reply.get_attr(f"ETHTOOL_A_FEATURES_{key}"), table)
        return FeatureState(changeable=sets["HW"], wanted=sets["WANTED"], active=sets["ACTIVE"], fixed=sets["NOCHANGE"])

    def set_features(self, ifname: str, values: dict[str, bool]) -> None:
        """``ETHTOOL_MSG_FEATURES_SET``: the named (kernel-name) features become wanted on or off."""
        if values:
            m, table = _messages(), self._feature_table(ifname)
            what = f"device {ifname}: set features {describe(values)}"
            unknown = sorted(set(values) - _bit_index(table).keys())
            if unknown:
                raise EthtoolError(f"{what}: the kernel has no feature {', '.join(unknown)}")
            attrs = [_header("FEATURES", ifname), ("ETHTOOL_A_FEATURES_WANTED", _compact_request(values, table))]
            self._request(m.features_msg, self.family(), m.ETHTOOL_MSG_FEATURES_SET, attrs, what)

    def private_flags(self, ifname: str) -> dict[str, bool]:
        """``ETHTOOL_MSG_PRIVFLAGS_GET``: every private flag of the NIC and its value."""
        m = _messages()
        what = f"device {ifname}: read private flags"
        try:
            attrs = [_header("PRIVFLAGS", ifname)]
            replies = self._request(m.privflags_msg, self.family(), m.ETHTOOL_MSG_PRIVFLAGS_GET, attrs, what)
        except EthtoolError as exc:
            if isinstance(exc.__cause__, OSError) and exc.__cause__.errno == errno.EOPNOTSUPP:
                raise EthtoolError(f"device {ifname} has no private flags (its driver does not support them)") from exc
            raise
        flags: dict[str, bool] = {}
        for reply in replies:
            bitset = reply.get_attr("ETHTOOL_A_PRIVFLAGS_FLAGS")
            if bitset is not None:
                flags.update(_named_bits(bitset))
        return flags

    def set_private_flags(self, ifname: str, values: dict[str, bool]) -> None:
        """``ETHTOOL_MSG_PRIVFLAGS_SET``: the named private flags become on or off."""
        if values:
            m = _messages()
            attrs = [_header("PRIVFLAGS", ifname), ("ETHTOOL_A_PRIVFLAGS_FLAGS", _bits_request(values))]
            what = f"device {ifname}: set private flags {describe(values)}"
            self._request(m.privflags_msg, self.family(), m.ETHTOOL_MSG_PRIVFLAGS_SET, attrs, what)


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
