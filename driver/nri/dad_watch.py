"""IPv6 duplicate address detection of the pods' new addresses, followed off the hooks' path.

A claim's new IPv6 address (and a share's lease) is added *optimistically* (RFC 4429,
``IFA_F_OPTIMISTIC``, the link's ``optimistic_dad`` set first: :mod:`driver.nic_settings.sysctls`):
the kernel lets it be bound and used at once while it probes the link, so RunPodSandbox does not
wait the 1-2 s detection takes. The runtime handles one NRI event at a time for every pod of the
node, so a hook that waited would make each pod starting after it wait too, and a pod with many
addresses would pass the runtime's 2 s and lose the driver its connection.

:class:`DadWatch` follows each pod's tentative addresses in one thread of its own until the kernel
decides: it joins the pod's ``RTMGRP_IPV6_IFADDR`` group (the kernel announces the outcome of each
detection there) and reads the addresses' flags once after joining and again at each
announcement, so it costs nothing while nothing happens. An address found in use (``IFA_F_DADFAILED``)
is reported once (``on_failed``: the claim's ``Ready`` False, a Warning event, a metric) and kept:
:meth:`DadWatch.failure` refuses the pod's containers, as the kernel refuses to use the address. A
kernel that took the address without the optimistic flag (no ``CONFIG_IPV6_OPTIMISTIC_DAD``, a
``/proc/sys`` the driver cannot write) leaves it unbindable until detection ends: then
:meth:`DadWatch.wait` lets the pod's containers wait for it, within :data:`CONTAINER_WAIT_S`, and
outside the hooks' lock. A link that never decides (no carrier) is given up after
:data:`WATCH_S`: the address works once the link does.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from driver.netlink.channel import netlink_socket
from driver.netlink.namespaces import is_netns_fd
from driver.netlink.rtnl import IFA_F_DADFAILED, IFA_F_OPTIMISTIC, IFA_F_TENTATIVE, Rtnl, ipv6_address_states

log = logging.getLogger(__name__)

RTMGRP_IPV6_IFADDR = 0x100
"""The rtnetlink multicast group of IPv6 address changes (``include/uapi/linux/rtnetlink.h``)."""
WATCH_S = 10.0
"""Seconds a pod's tentative addresses are followed: Linux decides within about 2 s by default
(a random delay up to ``router_solicitation_delay``, then ``retrans_time`` per probe); a link that
takes longer has no carrier, and the address works once it does."""
CONTAINER_WAIT_S = 1.0
"""Seconds a container of a pod whose addresses are tentative *and not optimistic* waits for their
detection (a kernel that cannot add them optimistically): half the runtime's 2 s NRI budget."""

Address = tuple[int, str]
"""``(ifindex in the pod, CIDR)``, as :func:`~driver.netlink.rtnl.ipv6_address_states` keys them."""
OnFailed = Callable[[str, str, str, str], None]
"""``(pod UID, device, CIDR, message)``: an address of the pod is in use on its link."""


@dataclass
class _Pod:
    """One pod's addresses under detection."""

    netns: str
    pending: dict[Address, str]  # address -> device
    optimistic: bool  # every pending address can be used while it is tentative
    deadline: float
    sock: socket.socket | None = None  # the pod's RTMGRP_IPV6_IFADDR subscription
    rtnl: Rtnl | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.rtnl is not None:
            self.rtnl.close()
            self.rtnl = None


def tentative(states: Mapping[Address, int], addresses: Mapping[Address, str]) -> dict[Address, str]:
    """The ``addresses`` still tentative in ``states``; :class:`DuplicateAddress` for one found in use."""
    for key, device in addresses.items():
        if states.get(key, 0) & IFA_F_DADFAILED:
            raise DuplicateAddress(device, key[1])
    return {key: device for key, device in addresses.items() if states.get(key, 0) & IFA_F_TENTATIVE}


def optimistic(states: Mapping[Address, int], addresses: Mapping[Address, str]) -> bool:
    """Whether every one of ``addresses`` is usable while tentative (the kernel kept the flag)."""
    return all(states.get(key, 0) & IFA_F_OPTIMISTIC for key in addresses)


class DuplicateAddress(Exception):
    """An IPv6 address of a pod's NIC is in use on its link; the message names it."""

    def __init__(self, device: str, cidr: str) -> None:
        super().__init__(f"interface.addresses: {cidr} is in use on the link (IPv6 duplicate address detection)")
        self.device, self.cidr = device, cidr


class DadWatch:
    """Follows the pods' tentative IPv6 addresses in one thread (started on first use)."""

    def __init__(self, on_failed: OnFailed | None = None, watch_s: float = WATCH_S) -> None:
        self.on_failed = on_failed or (lambda _pod, _device, _cidr, _message: None)
        self.watch_s = watch_s
        self._lock = threading.Lock()
        self._pods: dict[str, _Pod] = {}
        self._failed: dict[str, DuplicateAddress] = {}  # pod UID -> its first address found in use
        self._retired: list[_Pod] = []  # forgotten or replaced: their sockets are the thread's to close
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, pod_uid: str, netns: str, pending: Mapping[Address, str], optimistic: bool) -> None:
        """Follow ``pending`` (address -> device) of the pod whose namespace is at ``netns`` (a path
        that stays valid: the hooks' pinned fd). Returns at once."""
        if not pending:
            return
        pod = _Pod(netns, dict(pending), optimistic, time.monotonic() + self.watch_s)
        with self._lock:
            if self._closed:
                return
            self._retire(self._pods.pop(pod_uid, None))
            self._pods[pod_uid] = pod
            self._failed.pop(pod_uid, None)
            self._start()
        self._wake()

    def failure(self, pod_uid: str) -> DuplicateAddress | None:
        """The pod's address found in use, if any (its containers must not start)."""
        with self._lock:
            return self._failed.get(pod_uid)

    def wait(self, pod_uid: str, timeout: float = CONTAINER_WAIT_S) -> bool:
        """Before a container of the pod starts: wait (up to ``timeout``) for its addresses that
        cannot be used while tentative; True when none is left waiting."""
        with self._lock:
            pod = self._pods.get(pod_uid)
        if pod is None or pod.optimistic:
            return True
        return pod.done.wait(timeout)

    def forget(self, pod_uid: str) -> None:
        """The pod's NICs are going home: stop following them, forget its failure."""
        with self._lock:
            self._retire(self._pods.pop(pod_uid, None))
            self._failed.pop(pod_uid, None)
        self._wake()

    def pending(self) -> int:
        """Pods with addresses under detection (tests, metrics)."""
        with self._lock:
            return len(self._pods)

    def close(self) -> None:
        """Stop the thread (the addresses' outcome is then no longer reported)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(5.0)

    # -- the thread ---------------------------------------------------------------------------
    def _start(self) -> None:
        """(under the lock) The thread and its wake-up pipe, once."""
        if self._thread is None:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._thread = threading.Thread(target=self._run, name="ipv6-dad", daemon=True)
            self._thread.start()

    def _retire(self, pod: _Pod | None) -> None:
        """(under the lock) ``pod`` is no longer followed: its waiters go on, the thread closes it."""
        if pod is not None:
            pod.done.set()
            self._retired.append(pod)

    def _wake(self) -> None:
        if self._wake_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed:
                        break
                    pods, retired, self._retired = dict(self._pods), self._retired, []
                for pod in retired:
                    pod.close()
                ready = self._select(pods)
                for uid, pod in pods.items():
                    if pod.sock is None or pod.sock.fileno() in ready or time.monotonic() >= pod.deadline:
                        self._look(uid, pod)
        finally:
            with self._lock:
                left, self._pods = [*self._pods.values(), *self._retired], {}
                self._retired = []
            for each in left:
                each.close()
                each.done.set()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _select(self, pods: Mapping[str, _Pod]) -> set[int]:
        """Wait for an announcement, a new pod or the nearest deadline; the readable fds, drained."""
        socks: list[socket.socket] = [p.sock for p in pods.values() if p.sock is not None]
        if any(p.sock is None for p in pods.values()):
            timeout: float | None = 0.0  # a new pod: subscribe now
        elif pods:
            timeout = max(0.0, min(p.deadline for p in pods.values()) - time.monotonic())
        else:
            timeout = None
        fds = [self._wake_r, *(s.fileno() for s in socks)]
        readable, _, _ = select.select(fds, [], [], timeout)
        ready: set[int] = set()
        for fd in readable:
            if fd == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            ready.add(fd)
            sock = next(s for s in socks if s.fileno() == fd)
            _drain(sock)
        return ready

    def _look(self, uid: str, pod: _Pod) -> None:
        """Read the pod's pending addresses' flags (subscribing first); finish the pod when decided."""
        try:
            if pod.sock is None:
                self._open(pod)
            assert pod.rtnl is not None
            pod.pending = tentative(ipv6_address_states(pod.rtnl, {i for i, _ in pod.pending}), pod.pending)
        except DuplicateAddress as exc:
            self._finish(uid, pod, exc)
            return
        except OSError as exc:  # the namespace went away with its pod
            log.info("IPv6 duplicate address detection not followed", extra={"kv": {"pod": uid, "error": str(exc)}})
            pod.pending = {}
        if pod.pending and time.monotonic() >= pod.deadline:
            log.warning(
                "IPv6 addresses still tentative",
                extra={"kv": {"pod": uid, "addresses": [f"{d} {k[1]}" for k, d in pod.pending.items()]}},
            )
            pod.pending = {}
        if not pod.pending:
            self._finish(uid, pod, None)

    def _open(self, pod: _Pod) -> None:
        """The pod's subscription, then a socket to read its addresses (joined first: no outcome
        can fall between the first read and the subscription)."""
        fd = os.open(pod.netns, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if not is_netns_fd(fd):
                raise OSError(errno.ENOENT, f"{pod.netns} is no network namespace")
            pod.sock = netlink_socket(socket.NETLINK_ROUTE, fd, groups=RTMGRP_IPV6_IFADDR)
            pod.sock.setblocking(False)
            pod.rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE, fd))
        finally:
            os.close(fd)

    def _finish(self, uid: str, pod: _Pod, failed: DuplicateAddress | None) -> None:
        pod.close()
        with self._lock:
            current = self._pods.get(uid) is pod
            if current:
                del self._pods[uid]
                if failed is not None:
                    self._failed[uid] = failed
        pod.done.set()
        if current and failed is not None:
            log.error(
                "IPv6 address in use on the link",
                extra={"kv": {"pod": uid, "device": failed.device, "address": failed.cidr}},
            )
            try:
                self.on_failed(uid, failed.device, failed.cidr, str(failed))
            except Exception:
                log.exception("reporting a duplicate address failed", extra={"kv": {"pod": uid}})


def _drain(sock: socket.socket) -> None:
    """Read what is queued (the announcements only wake the thread; ENOBUFS too: it re-reads)."""
    while True:
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                return
