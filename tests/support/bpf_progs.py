"""Tiny eBPF programs for tests: loaded with the bpf system call from two raw instructions
(``r0 = <return value>; exit``) and attached to a link as XDP, classic TC (clsact ``bpf`` filter)
or tcx, the way loaders do, so the driver's detachment meets real programs."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess

from driver.netlink import kernel_features
from driver.netlink.channel import (
    IFINFOMSG,
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    NetlinkChannel,
    attr,
    inside_netns,
    netlink_socket,
    open_netns,
)
from driver.nic_settings.ebpf import BPF_PROG_QUERY, TC_PARENTS, TCMSG, TCX_ATTACH, _bpf

BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
PROG_TYPE_SCHED_CLS, PROG_TYPE_XDP = 3, 6
XDP_PASS, TC_ACT_OK = 2, 0


def load(prog_type: int, ret: int, name: bytes = b"dranet_test") -> int:
    """A loaded program (its fd) that returns ``ret``."""
    insns = ctypes.create_string_buffer(struct.pack("<BBhi", 0xB7, 0, 0, ret) + struct.pack("<BBhi", 0x95, 0, 0, 0))
    lic = ctypes.create_string_buffer(b"GPL")
    load_attr = struct.pack(
        "<IIQQIIQII16s", prog_type, 2, ctypes.addressof(insns), ctypes.addressof(lic), 0, 0, 0, 0, 0, name
    )
    fd, _ = _bpf(BPF_PROG_LOAD, load_attr)
    return fd


def has_tcx() -> bool:
    """Whether the running kernel has tcx (Linux 6.6): before, no tcx program can exist."""
    return kernel_features.detect().has("tcx")


def attach_all(netns: str, ifname: str, tcx_name: bytes = b"dranet_test") -> list[int]:
    """An XDP (generic), a clsact ingress ``bpf`` filter (named ``dranet_test``) and, where the kernel
    has tcx, a tcx ingress program (loaded as ``tcx_name``) on ``ifname``; their fds."""
    index = _index(netns, ifname)
    xdp, cls = load(PROG_TYPE_XDP, XDP_PASS), load(PROG_TYPE_SCHED_CLS, TC_ACT_OK)
    tcx = load(PROG_TYPE_SCHED_CLS, 0, tcx_name) if has_tcx() else None
    subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", ifname, "clsact"], check=True)
    fd = open_netns(netns)
    rtnl = NetlinkChannel(netlink_socket(socket.NETLINK_ROUTE, fd))
    try:
        flags = NLM_F_REQUEST | NLM_F_ACK
        xdp_attrs = attr(1, struct.pack("=i", xdp)) + attr(3, struct.pack("=I", 2))  # fd, XDP_FLAGS_SKB_MODE
        body = IFINFOMSG.pack(0, 0, index, 0, 0) + attr(43 | NLA_F_NESTED, xdp_attrs)
        opts = attr(6, struct.pack("=I", cls)) + attr(7, b"dranet_test\0") + attr(8, struct.pack("=I", 1))
        tc = TCMSG.pack(0, index, 0, TC_PARENTS["tc-ingress"], (1 << 16) | socket.htons(0x0003))
        tc += attr(1, b"bpf\0") + attr(2 | NLA_F_NESTED, opts)
        replies = rtnl.exchange([(16, flags, body), (44, flags | NLM_F_CREATE | NLM_F_EXCL, tc)])
        assert [r.error for r in replies] == [0, 0], replies
        if tcx is not None:
            with inside_netns(fd):
                _bpf(BPF_PROG_ATTACH, struct.pack("<IIIIIIQ", index, tcx, TCX_ATTACH["tcx-ingress"], 0, 0, 0, 0))
    finally:
        rtnl.close()
        os.close(fd)
    return [p for p in (xdp, cls, tcx) if p is not None]


def tcx_count(netns: str, ifname: str) -> int:
    """How many tcx ingress programs ``ifname`` has (``netns``: a name or a namespace file's path)."""
    index = _index(netns, ifname)
    fd = open_netns(netns)
    try:
        with inside_netns(fd):
            _, raw = _bpf(BPF_PROG_QUERY, struct.pack("<IIIIQII", index, TCX_ATTACH["tcx-ingress"], 0, 0, 0, 0, 0))
    finally:
        os.close(fd)
    return int(struct.unpack_from("<I", raw, 24)[0])


BPF_LINK_CREATE, BPF_XDP = 28, 37


def attach_xdp_link(netns: str, ifname: str) -> tuple[int, int]:
    """An XDP program attached through a bpf link (netlink cannot remove it); (program fd, link fd)."""
    index = _index(netns, ifname)
    prog = load(PROG_TYPE_XDP, XDP_PASS)
    fd = open_netns(netns)
    try:
        with inside_netns(fd):
            link, _ = _bpf(BPF_LINK_CREATE, struct.pack("<IIII", prog, index, BPF_XDP, 1 << 1))  # generic mode
    finally:
        os.close(fd)
    return prog, link


def _index(netns: str, ifname: str) -> int:
    """``ifname``'s index in ``netns``: a name under /run/netns, or a namespace file's path."""
    enter = ["nsenter", f"--net={netns}", "ip"] if "/" in netns else ["ip", "-n", netns]
    out = subprocess.run([*enter, "-o", "link", "show", ifname], capture_output=True, text=True, check=True)
    return int(out.stdout.split(":")[0])
