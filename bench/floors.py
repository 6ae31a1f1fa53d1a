"""The floors of ``bench.bench_hooks``: the hooks' bare kernel work on twin NICs, raw and through pyroute2.

:class:`Floor` does it in the fewest round trips with the driver's own raw rtnetlink. The
:class:`Pyroute2Floor` does the same moves, renames, MTUs, addresses, link-ups and routes,
sockets opened beforehand, in two ways the library offers, timed in the same cycles on the same
NICs:

- **messages**: pyroute2's message classes (``ifinfmsg``, ``ifaddrmsg``, ``rtmsg``) sent as one
  pipelined batch per namespace on its socket (``IPRoute.nlm_request_batch``): the fewest round
  trips pyroute2 allows, the shape of the raw floor.
- **api**: its asyncio API (``AsyncIPRoute.link``/``addr``/``route``), one request at a time, run
  by one event loop call per hook, as a synchronous hook thread would run it.

The difference to the raw floor is what pyroute2 costs the fewest requests a pod start needs; the
driver sends and reads more messages than the floor (host record, checks, reading back), so its
cost on the library would be at least that. Each socket is created with the thread inside the
target namespace (``IPRoute(netns=...)`` forks a helper process instead); :func:`open_cost_ms`
times that opening, which the driver pays once per hook in the pod's namespace.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from pyroute2 import AsyncIPRoute, IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from driver.netlink.channel import inside_netns
from driver.netlink.namespaces import Namespaces
from driver.netlink.rtnl import Request, Route, Rtnl, newaddr, newlink, newroute

POD_MTU = 1400
HOST_MTU = 1500

IFF_UP = 0x1
RTN_UNICAST, RTPROT_BOOT, RT_TABLE_MAIN = 1, 3, 254
ACK, CREATE = NLM_F_REQUEST | NLM_F_ACK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL


@dataclass
class Nic:
    """A host veth end with its host config and what the pod config gives it."""

    ifname: str
    index: int
    host_cidr: str
    host_route: Route
    pod_name: str
    pod_cidr: str
    pod_route: Route


FLOORS = ("batched", "down-first", "down-interleaved")
"""The kernel sequences raced for the floor, each reaching the same end state:

- ``batched``: one pipelined batch of 4 RTM_NEWLINK (move + rename + MTU each), then one batch of
  address, link-up and route requests on the other side;
- ``down-first``: one batch setting the 4 links down, then the ``batched`` sequence (a link that is
  down when it moves skips the close the move would do);
- ``down-interleaved``: down and move of each link in one batch of 8 requests, then the configuration.

The floor of each row is the candidate with the lowest median in the same run."""


class Floor:
    """The bare kernel work of the hooks on the twin NICs, raw netlink, sockets opened once."""

    def __init__(self, nics: list[Nic], netns_path: str) -> None:
        self.nics = nics
        self.ns = Namespaces("/proc/self/ns/net")
        self.host = self.ns.host_rtnl()
        self.pod_fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        self.pod = Rtnl(self.ns.socket_in(self.pod_fd, socket.NETLINK_ROUTE))
        self.moves_ms = 0.0

    def _move_and_configure(self, src: Rtnl, dst: Rtnl, dst_fd: int, home: bool, sequence: str) -> float:
        """All moves from ``src``'s netns to ``dst_fd``'s (``sequence``: one of :data:`FLOORS`), then
        in ``dst`` all addresses, link-ups and routes in one batch; ms (the moves alone in :attr:`moves_ms`)."""
        t0 = time.perf_counter()
        moves = [
            newlink(
                "f", n.index, ns_fd=dst_fd, ifname=n.ifname if home else n.pod_name, mtu=HOST_MTU if home else POD_MTU
            )
            for n in self.nics
        ]
        downs = [newlink("f", n.index, up=False) for n in self.nics]
        if sequence == "down-first":
            src.run(downs)
            src.run(moves)
        elif sequence == "down-interleaved":
            src.run([r for pair in zip(downs, moves, strict=True) for r in pair])
        else:
            src.run(moves)
        self.moves_ms = (time.perf_counter() - t0) * 1e3
        reqs: list[Request] = []
        for n in self.nics:
            reqs += [
                newaddr("f", n.index, n.host_cidr if home else n.pod_cidr),
                newlink("f", n.index, up=True),
                newroute("f", n.index, n.host_route if home else n.pod_route),
            ]
        dst.run(reqs)
        return (time.perf_counter() - t0) * 1e3

    def run(self, sequence: str = "batched") -> float:
        """Moves in + configuration in the pod; ms."""
        return self._move_and_configure(self.host, self.pod, self.pod_fd, home=False, sequence=sequence)

    def stop(self, sequence: str = "batched") -> float:
        """Moves back + host restore; ms."""
        return self._move_and_configure(self.pod, self.host, self.ns.host_fd, home=True, sequence=sequence)

    def check(self) -> None:
        """Untimed: the ifindexes are still right (the kernel keeps a free index across moves)."""
        for n in self.nics:
            link = self.host.link(n.ifname)
            assert link is not None, f"floor NIC {n.ifname} lost"
            n.index = link.index

    def close(self) -> None:
        self.pod.close()
        os.close(self.pod_fd)
        self.ns.close()


def _family(cidr: str) -> int:
    return socket.AF_INET6 if ":" in cidr else socket.AF_INET


def _move(index: int, ns_fd: int, ifname: str, mtu: int) -> ifinfmsg:
    msg = ifinfmsg()
    msg["index"] = index
    msg["attrs"] = [("IFLA_NET_NS_FD", ns_fd), ("IFLA_IFNAME", ifname), ("IFLA_MTU", mtu)]
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWLINK, ACK
    return msg


def _address(index: int, cidr: str) -> ifaddrmsg:
    ip, _, plen = cidr.partition("/")
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["index"] = _family(cidr), int(plen), index
    # An IPv6 one as the driver adds a host's: already detected (IFA_F_NODAD), so its prefix route
    # is there for the gateway of the route that follows it.
    msg["flags"] = 0x02 if msg["family"] == socket.AF_INET6 else 0
    msg["attrs"] = [("IFA_LOCAL", ip), ("IFA_ADDRESS", ip)]
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWADDR, CREATE
    return msg


def _up(index: int) -> ifinfmsg:
    msg = ifinfmsg()
    msg["index"], msg["flags"], msg["change"] = index, IFF_UP, IFF_UP
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWLINK, ACK
    return msg


def _route(index: int, route: Route) -> rtmsg:
    dst, _, plen = (route.dst or "0.0.0.0/0").partition("/")
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"] = route.family, int(plen), RT_TABLE_MAIN
    msg["proto"], msg["scope"], msg["type"] = RTPROT_BOOT, 0, RTN_UNICAST
    msg["attrs"] = [("RTA_TABLE", RT_TABLE_MAIN), ("RTA_OIF", index), ("RTA_DST", dst)]
    if route.gateway:
        msg["attrs"].append(("RTA_GATEWAY", route.gateway))
    msg["header"]["type"], msg["header"]["flags"] = RTM_NEWROUTE, CREATE
    return msg


class Pyroute2Floor:
    """The raw floor's kernel work through pyroute2 (``api``: its asyncio API; else its messages)."""

    def __init__(self, nics: list[Nic], netns_path: str, api: bool) -> None:
        self.nics, self.api = nics, api
        self.pod_fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        self.host_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.loop = asyncio.new_event_loop()
        if api:
            self.host_a = AsyncIPRoute(use_event_loop=self.loop)
            with inside_netns(self.pod_fd):
                self.pod_a = AsyncIPRoute(use_event_loop=self.loop)
                self.pod_a.fileno()  # the socket is made on first use: here, in the pod's netns
            for ipr in (self.host_a, self.pod_a):
                self.loop.run_until_complete(ipr.setup_endpoint())
        else:
            self.host = IPRoute()
            with inside_netns(self.pod_fd):
                self.pod = IPRoute()

    def _batches(self, home: bool) -> tuple[list[Any], list[Any]]:
        moves = [
            _move(
                n.index,
                self.host_fd if home else self.pod_fd,
                n.ifname if home else n.pod_name,
                HOST_MTU if home else POD_MTU,
            )
            for n in self.nics
        ]
        config: list[Any] = []
        for n in self.nics:
            config += [
                _address(n.index, n.host_cidr if home else n.pod_cidr),
                _up(n.index),
                _route(n.index, n.host_route if home else n.pod_route),
            ]
        return moves, config

    async def _by_api(self, src: AsyncIPRoute, dst: AsyncIPRoute, home: bool) -> None:
        for n in self.nics:
            await src.link(
                "set",
                index=n.index,
                net_ns_fd=self.host_fd if home else self.pod_fd,
                ifname=n.ifname if home else n.pod_name,
                mtu=HOST_MTU if home else POD_MTU,
            )
        for n in self.nics:
            cidr, route = (n.host_cidr, n.host_route) if home else (n.pod_cidr, n.pod_route)
            ip, _, plen = cidr.partition("/")
            await dst.addr("add", index=n.index, address=ip, prefixlen=int(plen))
            await dst.link("set", index=n.index, state="up")
            await dst.route("add", dst=route.dst, gateway=route.gateway, oif=n.index)

    def _cycle(self, home: bool) -> float:
        t0 = time.perf_counter()
        if self.api:
            src, dst = (self.pod_a, self.host_a) if home else (self.host_a, self.pod_a)
            self.loop.run_until_complete(self._by_api(src, dst, home))
        else:
            moves, config = self._batches(home)
            (self.pod if home else self.host).nlm_request_batch(moves)
            (self.host if home else self.pod).nlm_request_batch(config)
        return (time.perf_counter() - t0) * 1e3

    def run(self) -> float:
        """Moves in + configuration in the pod; ms."""
        return self._cycle(home=False)

    def stop(self) -> float:
        """Moves back + host restore; ms."""
        return self._cycle(home=True)

    def close(self) -> None:
        if self.api:
            self.host_a.close()
            self.pod_a.close()
        else:
            self.host.close()
            self.pod.close()
        self.loop.close()
        os.close(self.pod_fd)
        os.close(self.host_fd)


def open_cost_ms(netns_path: str, count: int) -> tuple[list[float], list[float]]:
    """Milliseconds to open a NETLINK_ROUTE socket in the namespace at ``netns_path`` and close it:
    (raw ``socket.socket``, pyroute2 ``IPRoute``), ``count`` each, the thread inside the namespace."""
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    raw, lib = [], []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            with inside_netns(fd):
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
            sock.bind((0, 0))
            sock.close()
            t1 = time.perf_counter()
            with inside_netns(fd):
                ipr = IPRoute()
            ipr.close()
            t2 = time.perf_counter()
            raw.append((t1 - t0) * 1e3)
            lib.append((t2 - t1) * 1e3)
    finally:
        os.close(fd)
    return raw, lib
