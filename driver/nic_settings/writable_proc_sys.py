"""Writing ``/proc/sys`` where the driver's container mounts it read-only (not privileged).

Container runtimes mount ``/proc/sys`` read-only in every container that is not ``privileged``,
whatever its capabilities. The driver needs to write a few per-interface files there that the
kernel takes nowhere else (IPv6's ``conf/<if>/forwarding``: rtnetlink sets IPv4's interface
settings, :mod:`driver.nic_settings.sysctls`, but for IPv6 only the token and the address
generation mode). With ``CAP_SYS_ADMIN`` (the chart's default) a thread can have a mount
namespace of its own: :class:`WritableProcSys` keeps one such thread, in which ``/proc/sys`` is
bound onto itself and remounted read-write. That changes nothing any other process or thread
sees (the namespace is private to the thread, its mounts marked private first), and the writes
still go through the kernel's sysctl handlers, with their checks, for the network namespace the
thread enters. The same is done for ``/sys`` (``WritableProcSys(SYS)``): a VF's ``driver_override``
and its driver's ``bind`` and ``unbind`` files, and a PF's ``sriov_numvfs``, are there only.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from driver.netlink.channel import libc

T = TypeVar("T")
PROC_SYS = "/proc/sys"
SYS = "/sys"
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REMOUNT, MS_REC, MS_PRIVATE = 4096, 32, 16384, 1 << 18
# Kept on the read-write remount: the kernel refuses to clear these on a bind remount where they
# are locked (a container in a user namespace), and the driver has no use for clearing them.
_KEPT = os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC


class ProcSysReadOnly(OSError):
    """``/proc/sys`` (or ``/sys``) could not be made writable for the driver's writes; says why."""


def read_only(path: str = PROC_SYS) -> bool:
    """Whether ``path`` is on a read-only mount in this thread's mount namespace."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


class WritableProcSys:
    """One thread whose mount namespace has a writable ``/proc/sys`` (or ``path``); :meth:`run` calls
    a function there.

    The thread and its namespace are made on first use (a node whose claims never need it pays
    nothing) and kept: one ``unshare`` and two mounts per driver process, not per write."""

    def __init__(self, c: ctypes.CDLL | None = None, path: str = PROC_SYS) -> None:
        self._c = c
        self.path = path
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ready = False  # touched only by the pool's one thread

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the thread with the writable ``/proc/sys``; :class:`ProcSysReadOnly` when
        it cannot be made so, else whatever ``fn`` returns or raises."""
        with self._lock:
            if self._pool is None:
                name = "writable" + self.path.replace("/", "-")
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
            pool = self._pool
        return pool.submit(self._call, fn, args).result()

    def close(self) -> None:
        """End the thread (its mount namespace goes with it)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _call(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        if not self._ready:
            self._make_writable()
            self._ready = True
        return fn(*args)

    def _make_writable(self) -> None:
        c = self._c or libc()
        path = self.path

        def mount(source: bytes | None, target: bytes, flags: int) -> int:
            return int(c.mount(source, target, None, ctypes.c_ulong(flags), None))

        def check(rc: int, what: str) -> None:
            if rc != 0:
                err = ctypes.get_errno()
                hint = " (the driver needs CAP_SYS_ADMIN for this)" if err == 1 else ""
                raise ProcSysReadOnly(err, f"{path} is read-only and {what} failed: {os.strerror(err)}{hint}")

        check(c.unshare(CLONE_NEWNS), "a mount namespace of the driver's own (unshare)")
        # Private first: nothing done below may propagate back to the container's or the host's mounts.
        check(mount(None, b"/", MS_REC | MS_PRIVATE), "making its mounts private")
        if not read_only(path):
            return
        kept = os.statvfs(path).f_flag & _KEPT
        check(mount(path.encode(), path.encode(), MS_BIND | MS_REC), "binding it onto itself")
        check(mount(None, path.encode(), MS_REMOUNT | MS_BIND | kept), "remounting it read-write")
        if read_only(path):
            raise ProcSysReadOnly(30, f"{path} is still read-only after a read-write remount")
