"""Network namespaces: netlink sockets opened inside the host's and the pods' namespaces.

A netlink socket belongs to the netns of the thread that created it, so :class:`Namespaces`
opens sockets by entering the target netns with ``setns`` in the calling thread and leaving it
right away (:func:`inside_netns`). Use one :class:`Namespaces` per thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Iterator

from driver.config import HOST_NETNS
from driver.netlink.channel import libc, netlink_socket
from driver.netlink.rtnl import Rtnl

NSFS_MAGIC = 0x6E736673  # statfs f_type of a namespace file


class NetnsGone(Exception):
    """The pod network namespace no longer exists."""


class Namespaces:
    """Netlink sockets in the host netns and in pod netns, opened from one thread.

    ``host_netns`` is a path to the host network namespace (default
    :data:`driver.config.HOST_NETNS`: the daemon's own, a hostNetwork pod's).
    """

    def __init__(self, host_netns: str = HOST_NETNS) -> None:
        self.host_netns = host_netns
        self.host_fd = os.open(host_netns, os.O_RDONLY | os.O_CLOEXEC)
        self._libc = libc()
        self._local = threading.local()  # host sockets are per thread (a netlink socket is not thread-safe)

    def socket_in(self, ns_fd: int, proto: int) -> socket.socket:
        """A raw netlink socket of protocol ``proto`` that lives in ``ns_fd``'s netns (caller closes it)."""
        return netlink_socket(proto, ns_fd, c=self._libc)

    def _rtnl_in(self, ns_fd: int) -> Rtnl:
        return Rtnl(self.socket_in(ns_fd, socket.NETLINK_ROUTE))

    def host_rtnl(self) -> Rtnl:
        """The (cached, per-thread) raw rtnetlink socket in the host netns."""
        rtnl = getattr(self._local, "rtnl", None)
        if rtnl is None:
            rtnl = self._rtnl_in(self.host_fd)
            self._local.rtnl = rtnl
        return rtnl

    @contextlib.contextmanager
    def pod(self, netns_path: str) -> Iterator[tuple[Rtnl, int]]:
        """(raw rtnetlink socket, fd) for the pod netns at ``netns_path``; raises :class:`NetnsGone`."""
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise NetnsGone(netns_path) from exc
        try:
            if not _is_netns(fd):
                raise NetnsGone(netns_path)  # e.g. a bind mount whose namespace was released
            rtnl = self._rtnl_in(fd)
            try:
                yield rtnl, fd
            finally:
                rtnl.close()
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close this thread's host sockets and the host netns fd."""
        rtnl = getattr(self._local, "rtnl", None)
        if rtnl is not None:
            rtnl.close()
            self._local.rtnl = None
        with contextlib.suppress(OSError):
            os.close(self.host_fd)


def is_netns_fd(fd: int) -> bool:
    """True if ``fd`` refers to a network namespace (an nsfs inode)."""
    return _is_netns(fd)


def _is_netns(fd: int) -> bool:
    # An unmounted /run/netns/<name> file is a plain empty file, not an nsfs inode.
    buf = ctypes.create_string_buffer(120)
    if libc().fstatfs(fd, buf) != 0:
        return False
    return int.from_bytes(buf.raw[:8], "little") == NSFS_MAGIC
