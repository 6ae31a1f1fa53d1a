"""An SR-IOV VF's settings as its PF holds them: MAC, VLAN and QoS, spoof checking, trust, tx rates, link state.

These live in the PF's driver, not in the VF: the PF's ``RTM_GETLINK`` answer lists them per VF
(``IFLA_VFINFO_LIST``, asked for with ``RTEXT_FILTER_VF``) and an ``RTM_SETLINK`` on the PF sets
them (``ip link set <pf> vf N vlan 100``), wherever the VF's netdev is: in a pod's namespace the VF
keeps what its PF gives it. The messages are packed here to the uapi's structs (``if_link.h``):
pyroute2's ``IFLA_VF_VLAN_INFO`` is two bytes shorter than ``struct ifla_vf_vlan_info``, which the
kernel refuses (EINVAL), so the rest of the netlink layer's raw attributes are used instead.

:func:`locate` finds the PF by the VF's PCI function (``physfn``, its ``virtfn<N>`` link: never a
name), :func:`read` reads one VF's settings, :func:`apply` sets them one request per setting so
that a refusal names the setting and carries the PF driver's words (its extended ack, when it gives
one). A field the PF driver does not report (the kernel's -1 for spoof checking or trust) is None.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_EXT_MASK,
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_REQUEST,
    RTEXT_FILTER_SKIP_STATS,
    RTM_GETLINK,
    NetlinkChannel,
    attr,
    attr_list,
    pick_attrs,
)

RTM_SETLINK = 19
RTEXT_FILTER_VF = 1
IFLA_VFINFO_LIST, IFLA_VF_INFO = 22, 1
IFLA_VF_MAC, IFLA_VF_VLAN, IFLA_VF_SPOOFCHK, IFLA_VF_LINK_STATE, IFLA_VF_RATE, IFLA_VF_TRUST = 1, 2, 4, 5, 6, 9
IFLA_VF_VLAN_LIST, IFLA_VF_VLAN_INFO = 12, 1
VF_MAC = struct.Struct("=I32s")  # struct ifla_vf_mac: vf, mac (32 bytes, the first 6 an Ethernet MAC)
VF_VLAN = struct.Struct("=III")  # struct ifla_vf_vlan: vf, vlan, qos
VF_VLAN_INFO = struct.Struct("=III2sxx")  # struct ifla_vf_vlan_info: vf, vlan, qos, __be16 vlan_proto (padded)
VF_PAIR = struct.Struct("=II")  # ifla_vf_spoofchk, ifla_vf_trust, ifla_vf_link_state: vf, value
VF_RATE = struct.Struct("=III")  # struct ifla_vf_rate: vf, min_tx_rate, max_tx_rate
UNREPORTED = 0xFFFFFFFF
"""What the kernel reports for a VF setting its PF's driver has no notion of (``ivi.spoofchk = -1``)."""
ETH_P_8021Q, ETH_P_8021AD = 0x8100, 0x88A8
VLAN_PROTOCOLS = {"802.1Q": ETH_P_8021Q, "802.1ad": ETH_P_8021AD}
LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}
"""``IFLA_VF_LINK_STATE_*``: follow the PF's link, always up, always down."""
NO_MAC = "00:00:00:00:00:00"
"""A VF MAC its PF holds none of: set through the PF, it takes back an administratively set MAC
(igb, ixgbe: the VF may set its own again), so it is written before a VF's own MAC is restored."""


class VfError(Exception):
    """A PF that cannot be found or read, or that refused a VF setting (``setting``: its claim field)."""

    def __init__(self, setting: str, reason: str, err: int = 0) -> None:
        super().__init__(f"{setting}: {reason}")
        self.setting, self.reason, self.errno = setting, reason, err


@dataclass(frozen=True)
class VfPlace:
    """Where a VF's settings are: its PF (PCI function, netdev name and ifindex on the host) and its index there."""

    pf_pci: str
    pf_ifname: str
    pf_index: int
    vf: int


@dataclass(frozen=True)
class VfState:
    """One VF's settings as its PF reports them (None: not reported by this PF's driver)."""

    vlan: int = 0
    qos: int = 0
    vlan_proto: str = "802.1Q"
    mac: str = ""  # lower case; "" in records of before the MAC was kept: left as it is
    spoofchk: bool | None = None
    trust: bool | None = None
    min_tx_rate: int = 0  # Mbit/s; 0: no limit
    max_tx_rate: int = 0
    link_state: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        """The record's form (a pod state entry)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VfState:
        """Inverse of :meth:`to_dict` (keys it does not know are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


SETTINGS = ("mac", "vlan", "spoofchk", "trust", "rate", "link_state")
"""The requests :func:`apply` sends, in the kernel's own order of ``do_setvfinfo``."""


def locate(vf_pci: str, sysfs_root: str = "/sys") -> VfPlace:
    """The PF of the VF at PCI function ``vf_pci`` and the VF's index there, from sysfs (the VF's
    ``physfn`` link and the PF's ``virtfn<N>`` links); :class:`VfError` when it is not a VF or its
    PF has no netdev."""
    vf_real = os.path.realpath(f"{sysfs_root}/bus/pci/devices/{vf_pci}")
    if not os.path.exists(f"{vf_real}/physfn"):
        raise VfError("sriov", f"{vf_pci} is not an SR-IOV VF (no physfn)")
    pf_real = os.path.realpath(f"{vf_real}/physfn")
    for entry in os.listdir(pf_real):
        if entry.startswith("virtfn") and entry[6:].isdigit() and os.path.realpath(f"{pf_real}/{entry}") == vf_real:
            return pf_place(os.path.basename(pf_real), int(entry[6:]), sysfs_root)
    raise VfError("sriov", f"{vf_pci}: its PF {os.path.basename(pf_real)} does not list it (virtfn*)")


def pf_place(pf_pci: str, vf: int, sysfs_root: str = "/sys") -> VfPlace:
    """VF ``vf`` of the PF at PCI function ``pf_pci``, with the PF's netdev as the host has it now."""
    base = f"{sysfs_root}/bus/pci/devices/{pf_pci}/net"
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        names = []
    if not names:
        raise VfError("sriov", f"the PF {pf_pci} has no netdev on the host")
    try:
        with open(f"{base}/{names[0]}/ifindex") as f:
            pf_index = int(f.read())
    except (OSError, ValueError) as exc:
        raise VfError("sriov", f"the PF {pf_pci} ({names[0]}): its ifindex cannot be read: {exc}") from exc
    return VfPlace(pf_pci, names[0], pf_index, vf)


def read(channel: NetlinkChannel, place: VfPlace) -> VfState:
    """The VF's settings as its PF reports them now; :class:`VfError` when the PF does not list it."""
    mask = attr(IFLA_EXT_MASK, struct.pack("=I", RTEXT_FILTER_VF | RTEXT_FILTER_SKIP_STATS))
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, place.pf_index, 0, 0) + mask
    reply = channel.exchange([(RTM_GETLINK, NLM_F_REQUEST, body)])[0]
    if reply.error or not reply.payloads:
        why = os.strerror(reply.error) if reply.error else "no answer"
        raise VfError("sriov", f"the PF {place.pf_ifname} cannot be read: {why}", reply.error)
    vflist = pick_attrs(reply.payloads[0], IFINFOMSG.size, frozenset({IFLA_VFINFO_LIST})).get(IFLA_VFINFO_LIST, b"")
    for kind, info in attr_list(vflist):
        if kind != IFLA_VF_INFO:
            continue
        attrs = dict(attr_list(info))
        if IFLA_VF_VLAN in attrs and VF_VLAN.unpack_from(attrs[IFLA_VF_VLAN])[0] == place.vf:
            return _state(attrs)
    raise VfError("sriov", f"the PF {place.pf_ifname} reports no VF {place.vf}")


def _flag(raw: bytes | None) -> bool | None:
    if raw is None:
        return None
    value = VF_PAIR.unpack_from(raw)[1]
    return None if value == UNREPORTED else bool(value)


def _state(attrs: dict[int, bytes]) -> VfState:
    """One ``IFLA_VF_INFO``'s attributes as a :class:`VfState`."""
    _vf, vlan, qos = VF_VLAN.unpack_from(attrs[IFLA_VF_VLAN])
    proto = ETH_P_8021Q
    for kind, info in attr_list(attrs.get(IFLA_VF_VLAN_LIST, b"")):
        if kind == IFLA_VF_VLAN_INFO and len(info) >= 14:  # the __be16 after three u32
            proto = int.from_bytes(info[12:14], "big") or proto
    low = high = 0
    if IFLA_VF_RATE in attrs:
        _vf, low, high = VF_RATE.unpack_from(attrs[IFLA_VF_RATE])
    mac = ""
    if IFLA_VF_MAC in attrs:
        mac = ":".join(f"{b:02x}" for b in VF_MAC.unpack_from(attrs[IFLA_VF_MAC])[1][:6])
    link_state = "auto"
    if IFLA_VF_LINK_STATE in attrs:
        code = VF_PAIR.unpack_from(attrs[IFLA_VF_LINK_STATE])[1]
        link_state = next((k for k, v in LINK_STATES.items() if v == code), "auto")
    return VfState(
        vlan=vlan,
        qos=qos,
        vlan_proto=next((k for k, v in VLAN_PROTOCOLS.items() if v == proto), f"0x{proto:04x}"),
        spoofchk=_flag(attrs.get(IFLA_VF_SPOOFCHK)),
        trust=_flag(attrs.get(IFLA_VF_TRUST)),
        min_tx_rate=low,
        max_tx_rate=high,
        link_state=link_state,
        mac=mac,
    )


def changes(current: VfState, wanted: VfState) -> list[str]:
    """The settings of :data:`SETTINGS` that differ between ``current`` and ``wanted`` (a None in
    ``wanted``: leave it; spoof checking or trust the PF does not report is still set when asked; a
    MAC of none or all zeros is never written back: it would take the VF's unicast filter away)."""
    out = []
    if wanted.mac and wanted.mac != NO_MAC and wanted.mac.lower() != current.mac.lower():
        out.append("mac")
    if (wanted.vlan, wanted.qos, wanted.vlan_proto) != (current.vlan, current.qos, current.vlan_proto):
        out.append("vlan")
    for name in ("spoofchk", "trust"):
        value = getattr(wanted, name)
        if value is not None and value != getattr(current, name):
            out.append(name)
    if (wanted.min_tx_rate, wanted.max_tx_rate) != (current.min_tx_rate, current.max_tx_rate):
        out.append("rate")
    if wanted.link_state != current.link_state:
        out.append("link_state")
    return out


def setting_attr(setting: str, vf: int, state: VfState) -> bytes:
    """The attribute of ``IFLA_VF_INFO`` that sets ``setting`` of VF ``vf`` to ``state``'s value.
    An 802.1Q VLAN goes as ``IFLA_VF_VLAN`` (what ``ip link`` sends without a protocol, which every
    PF driver since 2.6.34 takes), another protocol in an ``IFLA_VF_VLAN_LIST``."""
    if setting == "mac":
        return attr(IFLA_VF_MAC, VF_MAC.pack(vf, bytes.fromhex(state.mac.replace(":", ""))))
    if setting == "vlan":
        proto = VLAN_PROTOCOLS.get(state.vlan_proto) or int(state.vlan_proto, 16)  # as read: "0x...."
        if proto == ETH_P_8021Q:
            return attr(IFLA_VF_VLAN, VF_VLAN.pack(vf, state.vlan, state.qos))
        info = VF_VLAN_INFO.pack(vf, state.vlan, state.qos, proto.to_bytes(2, "big"))
        return attr(IFLA_VF_VLAN_LIST | NLA_F_NESTED, attr(IFLA_VF_VLAN_INFO, info))
    if setting == "spoofchk":
        return attr(IFLA_VF_SPOOFCHK, VF_PAIR.pack(vf, int(bool(state.spoofchk))))
    if setting == "trust":
        return attr(IFLA_VF_TRUST, VF_PAIR.pack(vf, int(bool(state.trust))))
    if setting == "rate":
        return attr(IFLA_VF_RATE, VF_RATE.pack(vf, state.min_tx_rate, state.max_tx_rate))
    return attr(IFLA_VF_LINK_STATE, VF_PAIR.pack(vf, LINK_STATES[state.link_state]))


def set_request(place: VfPlace, setting: str, state: VfState) -> tuple[int, int, bytes]:
    """The ``RTM_SETLINK`` on the PF that sets one setting of the VF (``(type, flags, body)``)."""
    nested = attr(IFLA_VF_INFO | NLA_F_NESTED, setting_attr(setting, place.vf, state))
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, place.pf_index, 0, 0) + attr(IFLA_VFINFO_LIST | NLA_F_NESTED, nested)
    return RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, body


def put_back(
    channel: NetlinkChannel, pf_pci: str, vf: int, before: VfState, sysfs_root: str = "/sys", none_mac: bool = False
) -> list[VfError]:
    """Set through the PF what differs from ``before`` for VF ``vf`` (read first: a second call
    writes nothing); ``none_mac``: a MAC of none in ``before`` is written back too (see
    :func:`changes`). The refusals; :class:`VfError` when the PF is gone or no longer lists the VF
    (its count lowered, which resets its settings: nothing to put back)."""
    place = pf_place(pf_pci, vf, sysfs_root)
    current = read(channel, place)
    todo = changes(current, before)
    if none_mac and before.mac == NO_MAC and current.mac not in ("", NO_MAC):
        todo.insert(0, "mac")
    return apply(channel, place, before, todo)


def apply(channel: NetlinkChannel, place: VfPlace, state: VfState, settings: Sequence[str]) -> list[VfError]:
    """Set ``settings`` (of :data:`SETTINGS`) of the VF to ``state``'s values, one pipelined request
    each (the kernel goes on after a refusal, so each gets its own answer); the refusals, each
    naming its setting with the errno's text and the PF driver's message when it gave one."""
    if not settings:
        return []
    replies = channel.exchange([set_request(place, s, state) for s in settings])
    out = []
    for setting, reply in zip(settings, replies, strict=True):
        if reply.error:
            words = f" ({reply.message})" if reply.message else ""
            hint = " (the PF's driver has no such setting)" if reply.error == errno.EOPNOTSUPP else ""
            reason = f"the PF {place.pf_ifname} refused it for VF {place.vf}: {os.strerror(reply.error)}{words}{hint}"
            out.append(VfError(setting, reason, reply.error))
    return out
