"""``interface.dhcp: true`` on a pod's NICs: a lease taken in the pod once the NIC is up, released before it returns.

At prepare an InfiniBand (IPoIB) NIC is refused: DHCP here speaks Ethernet.

RunPodSandbox: after the NICs are moved, renamed and up in the pod's namespace, every NIC that
asks for DHCP runs its exchange there (all of them at once, one thread each, so a pod with
several DHCP NICs waits for the slowest, not the sum), within :data:`driver.config.DHCP_TIMEOUT`;
then the leased address and the lease's classless routes (option 121) are added to it. A NIC
that gets no lease fails the hook naming the NIC and the reason; the leases the pod's other NICs
got are released again, and the hook returns every NIC to the host as after any other failure.

StopPodSandbox (and every other return path): each recorded lease is released (DHCPRELEASE,
unicast from the leased address) and its address removed while the NIC is still in the pod,
before it moves back. Best effort: a lease that cannot be released expires at the server.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import MovedDevice
from driver.config import DHCP_TIMEOUT
from driver.dhcp import client
from driver.dhcp.client import DhcpError, Exchange
from driver.dhcp.wire import Lease
from driver.model.device import Device
from driver.netlink.channel import RT_TABLE_MAIN
from driver.netlink.namespaces import NetnsGone
from driver.netlink.rtnl import NetnsOpError, Request, Route, Rtnl, deladdr, newaddr, newroute
from driver.nic_settings.setting import Nic, NicSetting, PodNetns

log = logging.getLogger(__name__)
RT_SCOPE_LINK = 253


@dataclass(frozen=True)
class DhcpNic:
    """A NIC that asks for DHCP, as it is in the pod: its device, name and MAC there, its routes' table."""

    device: str
    ifname: str
    mac: str
    table: int | None = None  # the VRF's table when the NIC is enslaved to one


def lease_routes(lease: Lease, table: int | None = None) -> list[Route]:
    """The lease's classless static routes (option 121) through its NIC, in ``table`` (None: main; a VRF's
    table when the NIC is in one); on-link ones have link scope."""
    return [
        Route(
            dst=dst, gateway=gw, scope=0 if gw else RT_SCOPE_LINK, family=socket.AF_INET, table=table or RT_TABLE_MAIN
        )
        for dst, gw in lease.routes
    ]


def _exchange(pod_fd: int, nic: DhcpNic, timeout: float) -> Exchange | NetnsOpError:
    try:
        return client.acquire(pod_fd, nic.ifname, nic.mac, timeout)
    except DhcpError as exc:
        return NetnsOpError(nic.device, "dhcp", f"{nic.ifname}: {exc.reason}")
    except Exception as exc:  # a bug must still fail the pod cleanly (NICs returned), not the hook
        log.exception("DHCP exchange failed", extra={"kv": {"device": nic.device}})
        return NetnsOpError(nic.device, "dhcp", f"{nic.ifname}: internal error: {exc}")


def acquire_all(pod_rtnl: Rtnl, pod_fd: int, nics: list[DhcpNic], timeout: float) -> dict[str, Lease]:
    """A lease for every NIC (device -> lease), applied in the pod; :class:`NetnsOpError` (step ``dhcp``)
    naming the first NIC that got none. On failure no lease is kept: those taken are released."""
    if not nics:
        return {}
    start = time.monotonic()
    if len(nics) == 1:
        outcomes = [_exchange(pod_fd, nics[0], timeout)]
    else:
        with ThreadPoolExecutor(max_workers=len(nics), thread_name_prefix="dhcp") as pool:
            outcomes = list(pool.map(lambda n: _exchange(pod_fd, n, timeout), nics))
    leases = {n.device: o.lease for n, o in zip(nics, outcomes, strict=True) if isinstance(o, Exchange)}
    failed = next((o for o in outcomes if isinstance(o, NetnsOpError)), None)
    if failed is None:
        try:
            _apply(pod_rtnl, nics, leases)
        except NetnsOpError as exc:
            failed = exc
    if failed is not None:
        release_all(pod_rtnl, pod_fd, [(n.device, n.ifname, leases[n.device]) for n in nics if n.device in leases])
        raise failed
    log.info(
        "DHCP leases taken",
        extra={
            "kv": {
                "ms": round((time.monotonic() - start) * 1e3, 1),
                "leases": {
                    n.device: f"{n.ifname} {leases[n.device].address} from {leases[n.device].server_id}" for n in nics
                },
                "exchanges_ms": {
                    n.device: round(o.seconds * 1e3, 1)
                    for n, o in zip(nics, outcomes, strict=True)
                    if isinstance(o, Exchange)
                },
            }
        },
    )
    return leases


def _apply(pod_rtnl: Rtnl, nics: list[DhcpNic], leases: dict[str, Lease]) -> None:
    """Add each lease's address, then its routes, to its NIC (one pipelined batch)."""
    links = pod_rtnl.links_by_name([n.ifname for n in nics])
    reqs: list[Request] = []
    for nic, link in zip(nics, links, strict=True):
        if link is None:
            raise NetnsOpError(nic.device, "dhcp", f"{nic.ifname} not found in the pod namespace")
        lease = leases[nic.device]
        reqs.append(newaddr(nic.device, link.index, lease.address, step="dhcp"))
        routes = sorted(
            lease_routes(lease, nic.table), key=lambda r: r.gateway is not None
        )  # on-link first: gateways resolve
        reqs += [newroute(nic.device, link.index, r, step="dhcp") for r in routes]
    pod_rtnl.run(reqs)


def release_all(pod_rtnl: Rtnl, pod_fd: int, items: list[tuple[str, str, Lease]]) -> list[str]:
    """Release each ``(device, pod ifname, lease)`` and remove its address; the problems (also logged)."""
    problems = []
    for device, ifname, lease in items:
        try:
            client.release(pod_fd, ifname, lease)
        except DhcpError as exc:
            problems.append(f"device {device}: DHCPRELEASE of {lease.address} on {ifname}: {exc.reason}")
        link = pod_rtnl.link(ifname)
        if link is not None:
            errors = pod_rtnl.run_each([deladdr(device, link.index, lease.address, step="dhcp release")])
            problems += [str(e) for e in errors if e is not None]
    for problem in problems:
        log.warning("DHCP lease not released cleanly; it expires at the server", extra={"kv": {"problem": problem}})
    if items and not problems:
        log.info("DHCP leases released", extra={"kv": {"leases": {d: f"{i} {lease.address}" for d, i, lease in items}}})
    return problems


class Dhcp(NicSetting):
    """``interface.dhcp``: the NIC's address (and routes) from a DHCP server, in the pod."""

    name = "dhcp"
    sub_interfaces = True

    def prepare_problems(self, device: Device, config: NetworkConfig) -> list[str]:
        if config.interface is None or not config.interface.dhcp:
            return []
        if device.attributes.get("dra.net/encapsulation") == "infiniband":
            return [
                f"interface.dhcp: device {device.name} is an InfiniBand (IPoIB) interface; DHCP works on "
                "Ethernet interfaces only"
            ]
        return []

    def after_configure(self, nics: Sequence[Nic], pod: PodNetns) -> None:
        """Take a lease for every NIC that asks for one (configured and up) and record it; each
        leased address is added to the NIC's result. :class:`NetnsOpError` as :func:`acquire_all`."""
        wanting = [nic for nic in nics if nic.interface.dhcp and nic.result is not None]
        if not wanting:
            return
        dhcp_nics = [DhcpNic(n.name, n.result.ifname, n.result.mac, n.pod.table) for n in wanting if n.result]
        leases = acquire_all(pod.rtnl, pod.fd, dhcp_nics, DHCP_TIMEOUT)
        for nic in wanting:
            if nic.name in leases and nic.result is not None:
                nic.records[self.name] = leases[nic.name].to_dict()
                nic.result.addresses.append(leases[nic.name].address)

    def before_return(self, nics: Sequence[MovedDevice], pod: PodNetns) -> None:
        """Release the stored leases from the pod's namespace (a namespace already gone took the
        NICs' addresses with it: the leases expire at the server)."""
        items = [(m.device, m.pod_ifname, m.records[self.name]) for m in nics if m.records.get(self.name)]
        if not items:
            return
        try:
            leases = [(dev, ifname, Lease.from_dict(lease)) for dev, ifname, lease in items]
            release_all(pod.rtnl, pod.fd, leases)
        except (KeyError, TypeError, ValueError) as exc:  # a damaged pods.json: never keep the NICs from returning
            log.warning("DHCP leases not released: unreadable lease record", extra={"kv": {"error": str(exc)}})
        except (NetnsGone, OSError) as exc:
            log.warning(
                "DHCP leases not released: the pod namespace is gone; they expire at the server",
                extra={"kv": {"netns": pod.path, "devices": [d for d, _, _ in items], "error": str(exc)}},
            )
