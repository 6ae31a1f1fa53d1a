"""Which eBPF programs are attached to a link, and their names: XDP (rtnetlink ``IFLA_XDP``), classic
TC (``bpf`` filters of a clsact qdisc, ``RTM_GETTFILTER``) and tcx (the ``bpf`` system call's
``BPF_PROG_QUERY``). Read by discovery (``dra.net/ebpf``, ``tcFilterNames``, ``tcxProgramNames``,
as dranet publishes them) and by ``interface.disableEbpfPrograms``
(:mod:`driver.nic_settings.ebpf`), which detaches what it finds. Nothing here changes a link.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import socket
import struct
from dataclasses import dataclass

from driver.netlink.channel import (
    IFINFOMSG,
    NLM_F_REQUEST,
    RTM_GETLINK,
    SKIP_STATS,
    NetlinkChannel,
    inside_netns,
    libc,
    parse_attrs,
    pick_attrs,
    text,
)

IFLA_XDP = 43
IFLA_XDP_FD, IFLA_XDP_ATTACHED, IFLA_XDP_FLAGS, IFLA_XDP_PROG_ID = 1, 2, 3, 4
IFLA_XDP_DRV_PROG_ID, IFLA_XDP_SKB_PROG_ID, IFLA_XDP_HW_PROG_ID = 5, 6, 7
XDP_MODES = {IFLA_XDP_SKB_PROG_ID: ("xdp-generic", 1 << 1), IFLA_XDP_DRV_PROG_ID: ("xdp-driver", 1 << 2)}
XDP_MODES[IFLA_XDP_HW_PROG_ID] = ("xdp-offload", 1 << 3)
XDP_ATTACHED_MODE = {1: IFLA_XDP_DRV_PROG_ID, 2: IFLA_XDP_SKB_PROG_ID, 3: IFLA_XDP_HW_PROG_ID}
RTM_GETQDISC, RTM_DELTFILTER, RTM_GETTFILTER = 38, 45, 46
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info (priority << 16 | protocol)
TCA_KIND, TCA_OPTIONS, TCA_BPF_NAME, TCA_BPF_ID = 1, 2, 7, 11
TC_PARENTS = {"tc-ingress": 0xFFFFFFF2, "tc-egress": 0xFFFFFFF3}  # clsact's ingress and egress
BPF_PROG_DETACH, BPF_PROG_GET_FD_BY_ID, BPF_PROG_QUERY = 9, 13, 16
BPF_LINK_GET_FD_BY_ID, BPF_LINK_DETACH = 30, 34
TCX_ATTACH = {"tcx-ingress": 46, "tcx-egress": 47}  # BPF_TCX_INGRESS, BPF_TCX_EGRESS
SYS_BPF = {"x86_64": 321, "aarch64": 280}
MAX_PROGS = 64

BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_INFO_NAME = slice(64, 80)  # struct bpf_prog_info: char name[BPF_OBJ_NAME_LEN] at offset 64


@dataclass(frozen=True)
class Program:
    """One program on a NIC: where (``xdp-generic``, ``tcx-ingress``, ``tc-egress``...), its id, and
    for a TC filter its handle and ``info`` (to delete it); ``link``: held by a bpf link of that id."""

    hook: str
    id: int
    link: int = 0
    handle: int = 0
    info: int = 0
    name: str = ""  # a TC filter's name (TCA_BPF_NAME: what the loader called it; `tc filter show`)


class EbpfError(Exception):
    """A program could not be listed or detached; names it and the reason."""


@functools.cache
def _sys_bpf() -> int | None:
    return SYS_BPF.get(platform.machine())


def _bpf(cmd: int, attr_bytes: bytes) -> tuple[int, bytes]:
    nr = _sys_bpf()
    if nr is None:
        raise EbpfError(f"bpf system call number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr_bytes, 128)
    ret = libc().syscall(nr, cmd, buf, 128)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret, buf.raw


def xdp_programs(rtnl: NetlinkChannel, index: int) -> list[Program]:
    """The XDP programs on link ``index`` (one per mode)."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + SKIP_STATS
    (reply,) = rtnl.exchange([(RTM_GETLINK, NLM_F_REQUEST, body)])
    if reply.error:
        raise OSError(reply.error, f"RTM_GETLINK {index}: {os.strerror(reply.error)}")
    xdp = pick_attrs(reply.payloads[0], IFINFOMSG.size, frozenset({IFLA_XDP})).get(IFLA_XDP)
    return parse_xdp(xdp or b"")


def parse_xdp(nested: bytes) -> list[Program]:
    """The programs an ``IFLA_XDP`` attribute names (one mode: ``IFLA_XDP_PROG_ID``; several: per mode)."""
    attrs = parse_attrs(nested, 0)
    mode = attrs.get(IFLA_XDP_ATTACHED, b"\0")[0]
    ids = {k: struct.unpack("=I", v)[0] for k, v in attrs.items() if k in XDP_MODES}
    if mode in XDP_ATTACHED_MODE and IFLA_XDP_PROG_ID in attrs:
        ids.setdefault(XDP_ATTACHED_MODE[mode], struct.unpack("=I", attrs[IFLA_XDP_PROG_ID])[0])
    return [Program(XDP_MODES[k][0], v) for k, v in sorted(ids.items()) if v]


def tc_programs(rtnl: NetlinkChannel, index: int) -> list[Program]:
    """The ``bpf`` filters of link ``index``'s clsact qdisc (none without one)."""
    out = []
    for hook, parent in TC_PARENTS.items():
        try:
            payloads = rtnl.dump(RTM_GETTFILTER, TCMSG.pack(socket.AF_UNSPEC, index, 0, parent, 0))
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):
                continue  # no clsact qdisc: no filters
            raise
        for payload in payloads:
            _fam, _index, handle, _parent, info = TCMSG.unpack_from(payload)
            attrs = parse_attrs(payload, TCMSG.size)
            if handle == 0 or text(attrs.get(TCA_KIND, b"")) != "bpf":
                continue  # handle 0: the chain's header, not a filter
            opts = parse_attrs(attrs.get(TCA_OPTIONS, b""), 0)
            prog, name = opts.get(TCA_BPF_ID), text(opts.get(TCA_BPF_NAME, b""))
            out.append(Program(hook, struct.unpack("=I", prog)[0] if prog else 0, handle=handle, info=info, name=name))
    return out


def tcx_programs(ns_fd: int | None, index: int) -> list[Program]:
    """The tcx programs on link ``index`` of ``ns_fd``'s netns (None: this thread's; the ifindex is
    resolved in the netns the thread is in)."""
    out = []
    with inside_netns(ns_fd) if ns_fd is not None else contextlib.nullcontext():
        progs, links = (ctypes.c_uint32 * MAX_PROGS)(), (ctypes.c_uint32 * MAX_PROGS)()
        for hook, attach in TCX_ATTACH.items():
            query = struct.pack("<IIIIQII", index, attach, 0, 0, ctypes.addressof(progs), MAX_PROGS, 0)
            query += struct.pack("<QQ", 0, ctypes.addressof(links))
            try:
                _, raw = _bpf(BPF_PROG_QUERY, query)
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP):
                    continue  # a kernel without tcx
                raise
            count = struct.unpack_from("<I", raw, 24)[0]
            out += [Program(hook, progs[i], link=links[i]) for i in range(min(count, MAX_PROGS))]
    return out


def program_name(prog_id: int) -> str:
    """The name a program was loaded with (``bpf_prog_info.name``; "" when it has none)."""
    fd, _ = _bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("<III", prog_id, 0, 0))
    try:
        info = ctypes.create_string_buffer(BPF_PROG_INFO_NAME.stop)
        _bpf(BPF_OBJ_GET_INFO_BY_FD, struct.pack("<IIQ", fd, len(info), ctypes.addressof(info)))
        return text(info.raw[BPF_PROG_INFO_NAME])
    finally:
        os.close(fd)


@dataclass(frozen=True)
class AttachedNames:
    """What dranet publishes of a link's programs: its TC ``bpf`` filters' names and its tcx programs'."""

    tc_filters: tuple[str, ...] = ()
    tcx_programs: tuple[str, ...] = ()


def qdisc_links(rtnl: NetlinkChannel) -> set[int]:
    """The links with a clsact (or ingress) qdisc, the only ones that can have TC filters: one dump
    for all links."""
    out = set()
    for payload in rtnl.dump(RTM_GETQDISC, TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        _fam, index, _handle, _parent, _info = TCMSG.unpack_from(payload)
        kind = pick_attrs(payload, TCMSG.size, frozenset({TCA_KIND})).get(TCA_KIND)
        if kind is not None and text(kind) in ("clsact", "ingress"):
            out.add(index)
    return out


def attached_names(
    rtnl: NetlinkChannel, ns_fd: int | None, index: int, tc: bool = True, tcx: bool = True
) -> AttachedNames:
    """The TC filter and tcx program names of link ``index`` in ``rtnl``'s netns (``ns_fd``'s, None:
    this thread's). ``tc`` False: it has no clsact qdisc (:func:`qdisc_links`), ``tcx`` False: a
    kernel without tcx; not asked. A program that went away between the listing and the name
    lookup is left out."""
    filters = [p.name or f"prog{p.id}" for p in tc_programs(rtnl, index)] if tc else []
    names = []
    for p in tcx_programs(ns_fd, index) if tcx else ():
        try:
            names.append(program_name(p.id) or f"prog{p.id}")
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
    return AttachedNames(tuple(dict.fromkeys(filters)), tuple(dict.fromkeys(names)))
