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

import logging
import os
import socket
import struct
from collections.abc import Sequence

from driver.netlink.bpf_attachments import (
    BPF_LINK_DETACH,
    BPF_LINK_GET_FD_BY_ID,
    BPF_PROG_DETACH,
    BPF_PROG_GET_FD_BY_ID,
    BPF_PROG_QUERY,
    IFLA_XDP,
    IFLA_XDP_FD,
    IFLA_XDP_FLAGS,
    RTM_DELTFILTER,
    TC_PARENTS,
    TCA_KIND,
    TCMSG,
    TCX_ATTACH,
    XDP_MODES,
    EbpfError,
    Program,
    _bpf,
    tc_programs,
    tcx_programs,
    xdp_programs,
)
from driver.netlink.channel import NLA_F_NESTED, attr, inside_netns
from driver.netlink.rtnl import NetnsOpError, Request, Rtnl, newlink
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

__all__ = ["BPF_PROG_QUERY", "TCMSG", "TC_PARENTS", "TCX_ATTACH", "Ebpf", "Program", "_bpf", "detach_all"]
log = logging.getLogger(__name__)


def xdp_detach(device: str, index: int, program: Program) -> Request:
    """RTM_NEWLINK removing the XDP program of ``program``'s mode (fd -1)."""
    flags = next(f for name, f in XDP_MODES.values() if name == program.hook)
    nested = attr(IFLA_XDP_FD, struct.pack("=i", -1)) + attr(IFLA_XDP_FLAGS, struct.pack("=I", flags))
    return newlink(device, index, extra=attr(IFLA_XDP | NLA_F_NESTED, nested), step="ebpf detach")


def tc_detach(device: str, index: int, program: Program) -> Request:
    """RTM_DELTFILTER of one ``bpf`` filter."""
    body = TCMSG.pack(socket.AF_UNSPEC, index, program.handle, TC_PARENTS[program.hook], program.info)
    body += attr(TCA_KIND, b"bpf\0")
    return Request(RTM_DELTFILTER, 0, body, device, "ebpf detach", f"{program.hook} filter prog {program.id}")


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
