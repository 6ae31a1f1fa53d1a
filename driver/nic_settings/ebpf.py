"""eBPF programs attached to a NIC moved into a pod: XDP, tcx and classic TC (clsact ``bpf`` filters).

``interface.disableEbpfPrograms`` detaches every program from a NIC moved into a pod (dranet does
the same for TC and tcx). What survives a namespace move and what does not (measured on 6.18):
XDP programs and tcx programs stay attached; the clsact qdisc and its filters are destroyed by the
move. So the TC filters are listed on the host before the move (recorded as removed by it) and
XDP and tcx programs are detached in the pod afterwards, through rtnetlink (XDP, TC) and the
``bpf`` system call (tcx: ``BPF_PROG_QUERY``, then ``BPF_PROG_DETACH`` or, for programs held by a
bpf link, ``BPF_LINK_DETACH``). Programs are referenced by id only: none is pinned or kept, so
a detached program cannot be attached again when the NIC returns (its loader owns it): the pod
state records which programs left and how (``{"hook", "id", "how"}``), nothing is undone. A program
that cannot be detached (an XDP program held by a bpf link, for one) is recorded as left attached
and logged, and the pod starts (dranet too only attempts it).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from driver.netlink.rtnl import SKIP_STATS, NetnsOpError, Request, Rtnl, newlink
from driver.netlink_channel import (
    IFINFOMSG,
    NLA_F_NESTED,
    NLM_F_REQUEST,
    RTM_GETLINK,
    attr,
    inside_netns,
    libc,
    parse_attrs,
    pick_attrs,
    text,
)
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

log = logging.getLogger(__name__)

IFLA_XDP = 43
IFLA_XDP_FD, IFLA_XDP_ATTACHED, IFLA_XDP_FLAGS, IFLA_XDP_PROG_ID = 1, 2, 3, 4
IFLA_XDP_DRV_PROG_ID, IFLA_XDP_SKB_PROG_ID, IFLA_XDP_HW_PROG_ID = 5, 6, 7
XDP_MODES = {IFLA_XDP_SKB_PROG_ID: ("xdp-generic", 1 << 1), IFLA_XDP_DRV_PROG_ID: ("xdp-driver", 1 << 2)}
XDP_MODES[IFLA_XDP_HW_PROG_ID] = ("xdp-offload", 1 << 3)
XDP_ATTACHED_MODE = {1: IFLA_XDP_DRV_PROG_ID, 2: IFLA_XDP_SKB_PROG_ID, 3: IFLA_XDP_HW_PROG_ID}
RTM_DELTFILTER, RTM_GETTFILTER = 45, 46
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info (priority << 16 | protocol)
TCA_KIND, TCA_OPTIONS, TCA_BPF_ID = 1, 2, 11
TC_PARENTS = {"tc-ingress": 0xFFFFFFF2, "tc-egress": 0xFFFFFFF3}  # clsact's ingress and egress
BPF_PROG_DETACH, BPF_PROG_GET_FD_BY_ID, BPF_PROG_QUERY = 9, 13, 16
BPF_LINK_GET_FD_BY_ID, BPF_LINK_DETACH = 30, 34
TCX_ATTACH = {"tcx-ingress": 46, "tcx-egress": 47}  # BPF_TCX_INGRESS, BPF_TCX_EGRESS
SYS_BPF = {"x86_64": 321, "aarch64": 280}
MAX_PROGS = 64


@dataclass(frozen=True)
class Program:
    """One program on a NIC: where (``xdp-generic``, ``tcx-ingress``, ``tc-egress``...), its id, and
    for a TC filter its handle and ``info`` (to delete it); ``link``: held by a bpf link of that id."""

    hook: str
    id: int
    link: int = 0
    handle: int = 0
    info: int = 0


class EbpfError(Exception):
    """A program could not be listed or detached; names it and the reason."""


def _bpf(cmd: int, attr_bytes: bytes) -> tuple[int, bytes]:
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise EbpfError(f"bpf system call number unknown on {platform.machine()}")
    buf = ctypes.create_string_buffer(attr_bytes, 128)
    ret = libc().syscall(nr, cmd, buf, 128)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret, buf.raw


def xdp_programs(rtnl: Rtnl, index: int) -> list[Program]:
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


def xdp_detach(device: str, index: int, program: Program) -> Request:
    """RTM_NEWLINK removing the XDP program of ``program``'s mode (fd -1)."""
    flags = next(f for name, f in XDP_MODES.values() if name == program.hook)
    nested = attr(IFLA_XDP_FD, struct.pack("=i", -1)) + attr(IFLA_XDP_FLAGS, struct.pack("=I", flags))
    return newlink(device, index, extra=attr(IFLA_XDP | NLA_F_NESTED, nested), step="ebpf detach")


def tc_programs(rtnl: Rtnl, index: int) -> list[Program]:
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
            prog = parse_attrs(attrs.get(TCA_OPTIONS, b""), 0).get(TCA_BPF_ID)
            out.append(Program(hook, struct.unpack("=I", prog)[0] if prog else 0, handle=handle, info=info))
    return out


def tc_detach(device: str, index: int, program: Program) -> Request:
    """RTM_DELTFILTER of one ``bpf`` filter."""
    body = TCMSG.pack(socket.AF_UNSPEC, index, program.handle, TC_PARENTS[program.hook], program.info)
    body += attr(TCA_KIND, b"bpf\0")
    return Request(RTM_DELTFILTER, 0, body, device, "ebpf detach", f"{program.hook} filter prog {program.id}")


def tcx_programs(ns_fd: int, index: int) -> list[Program]:
    """The tcx programs on link ``index`` of ``ns_fd``'s netns (the ifindex is resolved in the caller's netns)."""
    out = []
    with inside_netns(ns_fd):
        for hook, attach in TCX_ATTACH.items():
            progs, links = (ctypes.c_uint32 * MAX_PROGS)(), (ctypes.c_uint32 * MAX_PROGS)()
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


def tcx_detach(ns_fd: int, index: int, program: Program) -> None:
    """Detach one tcx program (through its bpf link when a link holds it)."""
    with inside_netns(ns_fd):
        try:
            if program.link:
                fd, _ = _bpf(BPF_LINK_GET_FD_BY_ID, struct.pack("<III", program.link, 0, 0))
                try:
                    _bpf(BPF_LINK_DETACH, struct.pack("<I", fd))
                finally:
                    os.close(fd)
                return
            fd, _ = _bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("<III", program.id, 0, 0))
            try:
                _bpf(BPF_PROG_DETACH, struct.pack("<IIIIIIQ", index, fd, TCX_ATTACH[program.hook], 0, 0, 0, 0))
            finally:
                os.close(fd)
        except OSError as exc:
            raise EbpfError(f"{program.hook} program {program.id}: detach: {exc.strerror}") from None


def _program(p: Program, how: str) -> dict[str, object]:
    return {"hook": p.hook, "id": p.id, "how": how}


def detach_all(rtnl: Rtnl, ns_fd: int, device: str, ifname: str) -> list[dict[str, object]]:
    """Detach every program of NIC ``ifname`` (in ``rtnl``'s and ``ns_fd``'s namespace), each on its
    own; what was done to each. Listing them failing is a :class:`NetnsOpError`."""
    link = rtnl.link(ifname)
    if link is None:
        raise NetnsOpError(device, "ebpf detach", f"{ifname} not found in the pod namespace")
    try:
        xdp, tc = xdp_programs(rtnl, link.index), tc_programs(rtnl, link.index)
        tcx = tcx_programs(ns_fd, link.index)
    except (EbpfError, OSError) as exc:
        raise NetnsOpError(device, "ebpf detach", f"{ifname}: listing programs: {exc}") from exc
    reqs: list[Request] = [xdp_detach(device, link.index, p) for p in xdp]
    reqs += [tc_detach(device, link.index, p) for p in tc]
    errors: list[str | None] = [None if e is None else e.reason for e in rtnl.run_each(reqs)]
    for p in tcx:
        try:
            tcx_detach(ns_fd, link.index, p)
            errors.append(None)
        except EbpfError as exc:
            errors.append(str(exc))
    done = [
        _program(p, "detached" if err is None else f"left attached: {err}")
        for p, err in zip((*xdp, *tc, *tcx), errors, strict=True)
    ]
    if any(err is not None for err in errors):
        log.warning("eBPF programs left attached", extra={"kv": {"device": device, "programs": done}})
    elif done:
        log.info("eBPF programs detached", extra={"kv": {"device": device, "programs": done}})
    return done


class Ebpf(NicSetting):
    """``interface.disableEbpfPrograms``: every program off the NIC in the pod."""

    name = "ebpf"

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Record the TC programs the move itself will remove (their clsact qdisc does not survive it)."""
        for nic in nics:
            if nic.interface.disable_ebpf_programs:
                try:
                    tc = tc_programs(host.rtnl(), nic.host.index or 0)
                except OSError as exc:
                    raise SettingRefused(nic.name, "ebpf", str(exc)) from exc
                nic.records[self.name] = [_program(p, "removed by the namespace move") for p in tc]

    def in_pod(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Detach what survived the move (XDP, tcx) and record it."""
        for nic in nics:
            if nic.interface.disable_ebpf_programs:
                done = detach_all(pod.rtnl, pod.fd, nic.name, nic.pod.ifname)
                nic.records[self.name] = [*nic.records.get(self.name, []), *done]
