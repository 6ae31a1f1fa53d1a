"""Offload features and private flags by their ethtool names, over the ethtool genetlink family.

What ``ethtool -k/-K`` and ``--show-priv-flags/--set-priv-flags`` do, for the claim config's
``ethtool`` section: ``ETHTOOL_MSG_FEATURES_GET/SET`` and ``ETHTOOL_MSG_PRIVFLAGS_GET/SET``
with name-based ("verbose") bitsets, so the kernel's own feature names are used and no bit
numbers are hard-coded. pyroute2 0.9's ethtool netlink module has neither message (its
features go through the legacy ``SIOCETHTOOL`` ioctl, several ioctls per call and bound to the
netns of a socket it creates itself), hence this small raw client on the package's
:class:`~driver.netlink_channel.NetlinkChannel`, like :mod:`driver.netlink.rtnl`.

A genetlink socket acts on devices of the netns it was created in; the caller opens it there
(:meth:`driver.netlink.namespaces.Namespaces.socket_in`). Family ids are global, so one resolution
serves every namespace.

Names: a kernel feature name (``tx-checksum-ip-generic``), or an ethtool CLI alias, short or
long (``tx``/``tx-checksumming``), which expands to the kernel names matching its pattern and
sets those the NIC can change, as the CLI does. Unknown names are errors. A feature the NIC
cannot change ("[fixed]") is an error when the request differs from its fixed value, and a
no-op when it does not (the NIC already is as asked; ``ethtool -K`` behaves the same).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import socket
import struct
from dataclasses import dataclass, field

from driver.netlink.rtnl import NetnsOpError
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

# The ethtool CLI's legacy offload names (its off_flag_def table): short alias, long alias, and
# the glob of kernel feature names both stand for.
_OFF_FLAGS = """
rx      rx-checksumming                 rx-checksum
tx      tx-checksumming                 tx-checksum-*
sg      scatter-gather                  tx-scatter-gather*
tso     tcp-segmentation-offload        tx-tcp*-segmentation
ufo     udp-fragmentation-offload       tx-udp-fragmentation
gso     generic-segmentation-offload    tx-generic-segmentation
gro     generic-receive-offload         rx-gro
lro     large-receive-offload           rx-lro
rxvlan  rx-vlan-offload                 rx-vlan-hw-parse
txvlan  tx-vlan-offload                 tx-vlan-hw-insert
ntuple  ntuple-filters                  rx-ntuple-filter
rxhash  receive-hashing                 rx-hashing
"""
ALIASES: dict[str, str] = {
    alias: row[2] for row in map(str.split, _OFF_FLAGS.strip().splitlines()) for alias in row[:2]
}


class EthtoolError(Exception):
    """An ethtool request failed or was refused; the message names the device and the feature or flag."""


@dataclass
class FeatureState:
    """The features of one NIC (``ETHTOOL_MSG_FEATURES_GET``), as sets of kernel names."""

    changeable: set[str]  # "hw" features: the ones a user may toggle
    wanted: set[str]  # what was asked for (may differ from active when a dependency is off)
    active: set[str]  # what is on now
    fixed: set[str]  # never changeable ("nochange")


@dataclass
class EthtoolPlan:
    """Resolved settings for one NIC and the values to restore when it leaves the pod."""

    features: dict[str, bool] = field(default_factory=dict)  # kernel names only
    private_flags: dict[str, bool] = field(default_factory=dict)
    original_features: dict[str, bool] = field(default_factory=dict)  # "wanted" before the change
    original_private_flags: dict[str, bool] = field(default_factory=dict)

    def empty(self) -> bool:
        """Nothing to set (the NIC already is as asked, or nothing was asked)."""
        return not self.features and not self.private_flags


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
            self._request(self.family(), cmd, body, f"device {ifname}: set {what} {_fmt(values)}")

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


def _fmt(values: dict[str, bool]) -> str:
    return ", ".join(f"{k}={'on' if v else 'off'}" for k, v in sorted(values.items()))


# -- resolving a claim config against a NIC -----------------------------------------------------
def resolve_features(
    ifname: str, requested: dict[str, bool], state: FeatureState, names: frozenset[str]
) -> tuple[dict[str, bool], list[str]]:
    """Claim-config feature names -> (kernel names to set, errors naming the device and feature).

    Features already at the requested value but fixed are dropped (nothing to do).
    """
    out: dict[str, bool] = {}
    errors: list[str] = []
    for name, on in requested.items():
        if name in names:
            targets = [name]
        elif name.lower() in ALIASES:
            targets = sorted(n for n in names if fnmatch.fnmatchcase(n, ALIASES[name.lower()]))
        else:
            errors.append(
                f"device {ifname}: ethtool feature {name!r} is unknown (neither a kernel feature name "
                "as `ethtool -k` shows it nor an ethtool alias such as tx, rx, sg, tso, gso, gro)"
            )
            continue
        changeable = [t for t in targets if t in state.changeable]
        if not changeable:
            # The CLI's rule: the NIC already as asked is fine; otherwise it cannot be changed.
            stuck = [t for t in targets if (t in state.active) != on]
            if stuck:
                errors.append(
                    f"device {ifname}: ethtool feature {name!r}"
                    + (f" ({', '.join(stuck)})" if stuck != [name] else "")
                    + f" is fixed {'off' if on else 'on'} on this NIC and cannot be turned "
                    f"{'on' if on else 'off'}"
                )
            continue
        for t in changeable:
            out[t] = on
    return out, errors


def resolve_private_flags(ifname: str, requested: dict[str, bool], available: dict[str, bool]) -> list[str]:
    """Errors for private flags the NIC does not have (names are driver-defined, exact match)."""
    return [
        f"device {ifname}: ethtool private flag {name!r} does not exist on this NIC (it has: "
        f"{', '.join(sorted(available)) or 'none'})"
        for name in requested
        if name not in available
    ]


def plan(
    eth: Ethtool, ifname: str, features: dict[str, bool] | None, private_flags: dict[str, bool] | None
) -> EthtoolPlan:
    """Resolve a claim's ``ethtool`` section against ``ifname`` and record what to restore.

    Run where the NIC is (the host, before the move). Raises :class:`EthtoolError` with every
    problem in one message.
    """
    result, errors = _plan(eth, ifname, features, private_flags)
    if errors:
        raise EthtoolError("; ".join(errors))
    return result


def _plan(
    eth: Ethtool, ifname: str, features: dict[str, bool] | None, private_flags: dict[str, bool] | None
) -> tuple[EthtoolPlan, list[str]]:
    result = EthtoolPlan()
    errors: list[str] = []
    try:
        if features:
            state = eth.features(ifname)
            result.features, errors = resolve_features(ifname, features, state, eth.feature_names(ifname))
            result.original_features = {n: n in state.wanted for n in result.features}
        if private_flags:
            try:
                available = eth.private_flags(ifname)
            except EthtoolError as exc:
                errors.append(f"{exc}: cannot set ethtool private flags {', '.join(sorted(private_flags))}")
            else:
                errors += resolve_private_flags(ifname, private_flags, available)
                result.private_flags = dict(private_flags)
                result.original_private_flags = {n: available[n] for n in private_flags if n in available}
    except EthtoolError as exc:  # e.g. no such device
        errors.append(str(exc))
    return result, errors


def apply(
    eth: Ethtool,
    device: str,
    ifname: str,
    features: dict[str, bool],
    private_flags: dict[str, bool],
    step: str = "ethtool",
) -> None:
    """Set kernel-name ``features`` and ``private_flags`` on ``ifname`` and check they took.

    Raises :class:`driver.netlink.rtnl.NetnsOpError` naming ``device``, ``step`` and the feature.
    """
    try:
        eth.set_features(ifname, features)
        eth.set_private_flags(ifname, private_flags)
        if features:
            # The kernel may keep a feature off when one it depends on is off (e.g. TSO without
            # checksumming); it accepts the request silently, so look.
            active = eth.features(ifname).active
            wrong = {n: on for n, on in features.items() if (n in active) != on}
            if wrong:
                raise EthtoolError(
                    f"device {ifname}: feature(s) {_fmt(wrong)} requested but the kernel "
                    "kept the old value (a feature they depend on is off?)"
                )
    except EthtoolError as exc:
        raise NetnsOpError(device, step, str(exc)) from exc


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


def check_features(
    ifname: str,
    features: dict[str, bool] | None,
    netns: str | None = None,
    private_flags: dict[str, bool] | None = None,
) -> list[str]:
    """Prepare-time check of a claim's ``ethtool`` section against the NIC; [] when it can apply.

    Unknown feature names, features fixed at another value and private flags the NIC does not
    have each give one message naming the device and the name (the Go driver checks feature
    names at prepare too). ``netns``: path of the namespace the NIC is in (default: this one).
    """
    if not features and not private_flags:
        return []
    try:
        eth = Ethtool(open_socket(netns))
    except OSError as exc:
        return [f"device {ifname}: cannot check ethtool settings: {exc}"]
    try:
        return _plan(eth, ifname, features, private_flags)[1]
    finally:
        eth.close()
