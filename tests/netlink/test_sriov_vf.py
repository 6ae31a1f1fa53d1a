"""An SR-IOV VF's settings through its PF, against a fake PF that answers as the kernel does: the
PF found by the VF's PCI function in a sysfs tree, what the PF reports read back, only what differs
written, one request per setting, and a refusal naming its setting with the PF driver's words.

The real PF (QEMU's igb in the stock-kernel tier's SR-IOV guest) is in
tests/inventory/test_sriov_vfs.py."""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from driver.netlink import sriov_vf
from driver.netlink.channel import IFINFOMSG, NLMSGHDR, NetlinkChannel
from driver.netlink.sriov_vf import VfError, VfPlace, VfState

PF_INDEX = 7
RTM_NEWLINK = 16


UAPI_SIZES = {1: 36, 2: 12, 4: 8, 5: 8, 6: 12, 9: 8}
"""``IFLA_VF_*`` -> sizeof its struct in include/uapi/linux/if_link.h (mac, vlan, spoofchk, link
state, rate, trust); ``struct ifla_vf_vlan_info`` is 16 (three u32 and a __be16, padded)."""
VLAN_INFO_SIZE = 16


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(data: bytes) -> list[tuple[int, bytes]]:
    out, off = [], 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        out.append((kind & 0x3FFF, data[off + 4 : off + length]))
        off += (length + 3) & ~3
    return out


class FakePf:
    """A PF's netlink side as rtnetlink's ``do_setvfinfo`` and ``rtnl_fill_vfinfo`` see it: ``vfs``
    VFs' settings, a GETLINK answered with their ``IFLA_VFINFO_LIST``, each SETLINK checked against
    the uapi structs' sizes (EINVAL when short, as the kernel's) and applied or refused (``refuse``:
    setting name -> (errno, extended-ack text))."""

    def __init__(self, vfs: int = 2, refuse: dict[str, tuple[int, str]] | None = None) -> None:
        self.state = {vf: VfState(spoofchk=True, trust=False, mac=f"02:00:00:00:00:0{vf}") for vf in range(vfs)}
        self.refuse = refuse or {}
        self.sets: list[str] = []
        self.queue: list[bytes] = []

    def setsockopt(self, *a: object) -> None:
        pass

    def getsockopt(self, *a: object) -> int:
        return 212992  # the kernel's default receive buffer

    def close(self) -> None:
        pass

    def recv(self, size: int) -> bytes:
        out, self.queue = b"".join(self.queue), []
        return out

    def send(self, data: bytes) -> int:
        off = 0
        while off < len(data):
            length, kind, _flags, seq, _pid = NLMSGHDR.unpack_from(data, off)
            body = data[off + 16 : off + length]
            _family, _type, index, _f, _c = IFINFOMSG.unpack_from(body)
            assert index == PF_INDEX
            if kind == sriov_vf.RTM_GETLINK:
                (mask,) = struct.unpack("=I", dict(_attrs(body[IFINFOMSG.size :]))[29])
                assert mask & 1, "RTEXT_FILTER_VF: the kernel lists no VF without it"
                self.queue.append(self._link(seq))
            else:
                self.queue.append(self._ack(seq, *self._set(body[IFINFOMSG.size :])))
            off += length
        return len(data)

    def _ack(self, seq: int, err: int, text: str) -> bytes:
        body = struct.pack("=i", -err) + NLMSGHDR.pack(16, 0, 0, seq, 0)
        flags = 0
        if text:
            body += _attr(1, text.encode() + b"\0")
            flags = 0x100 | 0x200  # capped, ack TLVs
        return NLMSGHDR.pack(16 + len(body), 2, flags, seq, 0) + body

    def _set(self, attrs: bytes) -> tuple[int, str]:
        ((top, vflist),) = _attrs(attrs)
        assert top == 22  # IFLA_VFINFO_LIST
        ((info_kind, info),) = _attrs(vflist)
        assert info_kind == 1  # IFLA_VF_INFO
        ((kind, raw),) = _attrs(info)
        setting = {1: "mac", 2: "vlan", 12: "vlan", 4: "spoofchk", 9: "trust", 6: "rate", 5: "link_state"}[kind]
        self.sets.append(setting)
        if kind == 12:  # IFLA_VF_VLAN_LIST: each IFLA_VF_VLAN_INFO at least sizeof(struct ifla_vf_vlan_info)
            ((_, raw),) = _attrs(raw)
            if len(raw) < VLAN_INFO_SIZE:
                return errno.EINVAL, ""
            vf, vlan, qos = struct.unpack_from("=III", raw)
            proto = int.from_bytes(raw[12:14], "big")
        elif len(raw) < UAPI_SIZES[kind]:
            return errno.EINVAL, ""
        if setting in self.refuse:
            return self.refuse[setting]
        vf = struct.unpack_from("=I", raw)[0]
        if vf not in self.state:
            return errno.EINVAL, ""
        current = self.state[vf]
        if kind == 1:
            new = replace(current, mac=":".join(f"{b:02x}" for b in raw[4:10]))
        elif kind == 2:
            _, vlan, qos = struct.unpack_from("=III", raw)
            new = replace(current, vlan=vlan, qos=qos, vlan_proto="802.1Q")
        elif kind == 12:
            name = next(k for k, v in sriov_vf.VLAN_PROTOCOLS.items() if v == proto)
            new = replace(current, vlan=vlan, qos=qos, vlan_proto=name)
        elif kind == 6:
            _, low, high = struct.unpack_from("=III", raw)
            new = replace(current, min_tx_rate=low, max_tx_rate=high)
        elif kind == 5:
            states = {v: k for k, v in sriov_vf.LINK_STATES.items()}
            new = replace(current, link_state=states[struct.unpack_from("=II", raw)[1]])
        else:
            new = replace(current, **{setting: bool(struct.unpack_from("=II", raw)[1])})
        self.state[vf] = new
        return 0, ""

    def _link(self, seq: int) -> bytes:
        infos = b""
        for vf, s in self.state.items():
            proto = sriov_vf.VLAN_PROTOCOLS[s.vlan_proto].to_bytes(2, "big")
            trust = sriov_vf.UNREPORTED if s.trust is None else int(s.trust)
            spoofchk = sriov_vf.UNREPORTED if s.spoofchk is None else int(s.spoofchk)
            info = (
                _attr(1, struct.pack("=I32s", vf, bytes.fromhex(s.mac.replace(":", ""))))  # IFLA_VF_MAC
                + _attr(2, struct.pack("=III", vf, s.vlan, s.qos))
                + _attr(12 | 0x8000, _attr(1, struct.pack("=III2sxx", vf, s.vlan, s.qos, proto)))
                + _attr(6, struct.pack("=III", vf, s.min_tx_rate, s.max_tx_rate))
                + _attr(4, struct.pack("=II", vf, spoofchk))
                + _attr(5, struct.pack("=II", vf, sriov_vf.LINK_STATES[s.link_state]))
                + _attr(9, struct.pack("=II", vf, trust))
            )
            infos += _attr(1 | 0x8000, info)
        body = IFINFOMSG.pack(0, 1, PF_INDEX, 0, 0) + _attr(3, b"enp65s0\0") + _attr(22 | 0x8000, infos)
        return NLMSGHDR.pack(16 + len(body), RTM_NEWLINK, 0, seq, 0) + body


PLACE = VfPlace("0000:41:00.0", "enp65s0", PF_INDEX, 1)


def _channel(pf: FakePf) -> NetlinkChannel:
    return NetlinkChannel(pf, ext_ack=True)  # type: ignore[arg-type]


def test_what_the_pf_reports_is_read_for_the_vf_asked() -> None:
    pf = FakePf()
    pf.state[1] = VfState(
        vlan=7, qos=2, vlan_proto="802.1ad", spoofchk=False, trust=None, max_tx_rate=300, mac="52:54:00:aa:bb:cc"
    )
    assert sriov_vf.read(_channel(pf), PLACE) == pf.state[1]
    assert sriov_vf.read(_channel(pf), replace(PLACE, vf=0)) == VfState(
        spoofchk=True, trust=False, mac="02:00:00:00:00:00"
    )
    with pytest.raises(VfError, match="reports no VF 5"):
        sriov_vf.read(_channel(pf), replace(PLACE, vf=5))


def test_only_what_differs_is_written_and_reads_back() -> None:
    pf = FakePf()
    before = sriov_vf.read(_channel(pf), PLACE)
    goal = replace(before, vlan=100, qos=3, trust=True, max_tx_rate=1000, mac="52:54:00:12:34:56")
    todo = sriov_vf.changes(before, goal)
    assert todo == ["mac", "vlan", "trust", "rate"], "in the kernel's order: the MAC first"
    assert sriov_vf.apply(_channel(pf), PLACE, goal, todo) == []
    assert pf.sets == todo and sriov_vf.read(_channel(pf), PLACE) == goal
    assert pf.state[0] == VfState(spoofchk=True, trust=False, mac="02:00:00:00:00:00"), "the other VF untouched"
    assert sriov_vf.changes(goal, goal) == [] and sriov_vf.apply(_channel(pf), PLACE, goal, []) == []
    # Back as it was: the restore is the same call the other way.
    assert sriov_vf.apply(_channel(pf), PLACE, before, sriov_vf.changes(goal, before)) == []
    assert sriov_vf.read(_channel(pf), PLACE) == before


def test_an_8021ad_vlan_goes_in_a_vlan_list_of_the_kernels_size() -> None:
    pf = FakePf()
    goal = replace(pf.state[1], vlan=30, qos=1, vlan_proto="802.1ad")
    assert sriov_vf.apply(_channel(pf), PLACE, goal, ["vlan"]) == []
    assert sriov_vf.read(_channel(pf), PLACE) == goal
    _kind, _flags, body = sriov_vf.set_request(PLACE, "vlan", goal)
    assert len(body) == IFINFOMSG.size + 4 + 4 + 4 + 4 + VLAN_INFO_SIZE, (
        "nested VFINFO_LIST/VF_INFO/VLAN_LIST/VLAN_INFO"
    )


def test_a_trust_the_pf_does_not_report_is_still_set_when_asked() -> None:
    current = VfState(trust=None, spoofchk=None)
    assert sriov_vf.changes(current, replace(current, trust=True)) == ["trust"]
    assert sriov_vf.changes(current, current) == []


def test_each_refusal_names_its_setting_and_the_pfs_words_the_rest_still_applied() -> None:
    pf = FakePf(refuse={"rate": (errno.EINVAL, "min tx rate not supported"), "link_state": (errno.EOPNOTSUPP, "")})
    goal = replace(pf.state[1], vlan=10, min_tx_rate=5, max_tx_rate=50, link_state="disable")
    refused = sriov_vf.apply(_channel(pf), PLACE, goal, ["vlan", "rate", "link_state"])
    assert [(e.setting, e.errno) for e in refused] == [("rate", errno.EINVAL), ("link_state", errno.EOPNOTSUPP)]
    assert "min tx rate not supported" in refused[0].reason and "enp65s0" in refused[0].reason
    assert "has no such setting" in refused[1].reason
    assert pf.state[1].vlan == 10, "each setting is its own request"


def _sysfs(root: Path) -> Path:
    """A PF at 0000:41:00.0 (netdev enp65s0, ifindex 7) with VFs 0000:41:10.0 and 0000:41:10.2."""
    devices = root / "devices/pci0000:40/0000:40:01.0"
    pf = devices / "0000:41:00.0"
    (pf / "net/enp65s0").mkdir(parents=True)
    (pf / "net/enp65s0/ifindex").write_text(f"{PF_INDEX}\n")
    bus = root / "bus/pci/devices"
    bus.mkdir(parents=True)
    bus.joinpath("0000:41:00.0").symlink_to(pf)
    for index, bdf in enumerate(("0000:41:10.0", "0000:41:10.2")):
        vf = devices / bdf
        vf.mkdir()
        (vf / "physfn").symlink_to(pf)
        (pf / f"virtfn{index}").symlink_to(vf)
        bus.joinpath(bdf).symlink_to(vf)
    return bus


def test_the_pf_and_index_are_found_by_the_vfs_pci_function(tmp_path: Path) -> None:
    _sysfs(tmp_path)
    root = str(tmp_path)
    assert sriov_vf.locate("0000:41:10.2", root) == VfPlace("0000:41:00.0", "enp65s0", PF_INDEX, 1)
    with pytest.raises(VfError, match="not an SR-IOV VF"):
        sriov_vf.locate("0000:41:00.0", root)
    os.unlink(tmp_path / "devices/pci0000:40/0000:40:01.0/0000:41:00.0/net/enp65s0/ifindex")
    with pytest.raises(VfError, match="ifindex cannot be read"):
        sriov_vf.pf_place("0000:41:00.0", 0, root)
    with pytest.raises(VfError, match="has no netdev"):
        sriov_vf.pf_place("0000:99:00.0", 0, root)


def test_a_mac_of_none_is_never_written_back() -> None:
    """A VF whose PF held no MAC before (all zeros, or a record of before MACs were kept): writing it
    back would take the VF's unicast filter away, so the restore leaves the MAC as the VF has it."""
    now = VfState(mac="52:54:00:12:34:56")
    assert sriov_vf.changes(now, replace(now, mac=sriov_vf.NO_MAC)) == []
    assert sriov_vf.changes(now, replace(now, mac="")) == []
    assert sriov_vf.changes(now, replace(now, mac="52:54:00:12:34:57")) == ["mac"]
    assert sriov_vf.changes(now, replace(now, mac="52:54:00:12:34:56".upper())) == []


def test_the_pfs_mac_is_cleared_with_the_kernels_struct() -> None:
    """``struct ifla_vf_mac`` is a u32 and 32 bytes: the MAC in the first six."""
    pf = FakePf()
    cleared = replace(pf.state[1], mac=sriov_vf.NO_MAC)
    assert sriov_vf.apply(_channel(pf), PLACE, cleared, ["mac"]) == []
    assert pf.state[1].mac == sriov_vf.NO_MAC and pf.state[0].mac == "02:00:00:00:00:00"
    _kind, _flags, body = sriov_vf.set_request(PLACE, "mac", cleared)
    assert len(body) == IFINFOMSG.size + 4 + 4 + 4 + 36
