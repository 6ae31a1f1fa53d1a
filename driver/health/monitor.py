"""A NIC's health: links, RDMA ports, netdevs, checked wherever the NIC is.

Each check (in one worker thread: netlink sockets are per thread) asks the kernel for the link of
every published NIC where it is now: in the host namespace, or in the namespace of the pod that
holds it (from the pod network state the NRI hooks keep). A link that is administratively up
without carrier is down (for a veth: its peer is down). The RDMA port states come from sysfs.
The kit (:class:`driver.dra.health.HealthWatch`) runs :meth:`HealthMonitor.check` every
``--health-interval`` seconds and reports each change to the kubelet (``DRAResourceHealth``, the
pod's ``allocatedResourcesStatus``) and as device taints in the ResourceSlice, whose value is the
reason (:data:`LINK_DOWN`, :data:`PORT_NOT_ACTIVE`, :data:`NETDEV_MISSING`, :data:`PF_LINK_DOWN`,
:data:`DEVICE_REMOVED`).

An SR-IOV VF is only as up as its PF: where the PF's netdev (on the host, found by the VF's
``physfn``, published or not) is down, administratively or without carrier, every VF of it is
unhealthy (``PfLinkDown``), wherever the VF is: a VF's own carrier does not always follow its PF
at once (igbvf learns it over the mailbox), and the scheduler must not give one out meanwhile.

A device whose PCI function is gone from the node (a VF whose PF's count an admin lowered, a
function unplugged) is ``DeviceRemoved``. One no claim holds leaves the inventory with the next
scan; one a claim holds stays published (the claim's snapshot) with that reason until the claim is
unprepared, and its holders are told (:func:`removed_holders`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

from driver.checkpoint.state import DriverState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.status import DEVICE_REMOVED
from driver.dra.protocol import DeviceHealthState
from driver.health.links import LinkFacts, LinkProbe
from driver.model.device import Device
from driver.netlink.namespaces import Namespaces

log = logging.getLogger(__name__)
IN_POD_STEPS = ("in-pod",)  # a NIC whose move is complete: it lives in the pod namespace

__all__ = ["DEVICE_REMOVED", "LINK_DOWN", "NETDEV_MISSING", "PF_LINK_DOWN", "PORT_NOT_ACTIVE", "HealthMonitor"]

LINK_DOWN = "LinkDown"
PORT_NOT_ACTIVE = "PortNotActive"
NETDEV_MISSING = "NetdevMissing"
PF_LINK_DOWN = "PfLinkDown"
"""Why a device is unhealthy: the value of its ``dra.net/unhealthy`` taint in the ResourceSlice."""


def _port_states(root: Path, rdma_device: str) -> list[str]:
    states = []
    for port in sorted((root / "class" / "infiniband" / rdma_device / "ports").glob("*/state")):
        try:
            states.append(port.read_text().strip())  # e.g. "4: ACTIVE"
        except OSError:
            continue
    return states


def assess(
    device: Device,
    sysfs_root: str,
    in_use: bool,
    link: LinkFacts | None = None,
    netlink: bool = False,
    pf_link: LinkFacts | None = None,
) -> tuple[bool, str, str]:
    """(healthy, reason, message) of one device.

    Unhealthy: its PCI function is gone from the sysfs tree's PCI bus (``DeviceRemoved``; a tree
    without a PCI bus says nothing), its netdev is administratively up but has no carrier (``LinkDown``; ``link`` comes
    from netlink in the namespace the netdev is in), its RDMA device has ports and none is
    ACTIVE (``PortNotActive``), or its netdev is gone from the host while no pod holds it
    (``NetdevMissing``). An administratively down link tells nothing about its cable: healthy.
    ``netlink``: the host's netlink has shown this netdev before, so its answer now (no link) wins
    over a sysfs tree that may not follow the links (``--sysfs-root`` with a mounted or fixture
    tree); a netdev netlink never had (a fixture's) is judged by the tree alone. ``pf_link``: a
    VF's PF's netdev, down when not administratively up or without carrier (``PfLinkDown``).
    """
    root = Path(sysfs_root)
    host = device.host
    functions = root / "bus" / "pci" / "devices"
    if host.pci_address and functions.is_dir() and not (functions / host.pci_address).exists():
        why = f"its PF {host.sriov_pf}'s VF count was lowered" if host.sriov_pf else "removed from the PCI bus"
        return False, DEVICE_REMOVED, f"PCI function {host.pci_address} is gone from the node ({why})"
    if link is not None and link.admin_up and not link.carrier:
        return False, LINK_DOWN, f"link down: {link.ifname} ({link.where}) has no carrier, operstate {link.operstate}"
    if pf_link is not None and not (pf_link.admin_up and pf_link.carrier):
        state = "has no carrier" if pf_link.admin_up else "is down (administratively)"
        return False, PF_LINK_DOWN, f"its PF {host.sriov_pf} ({pf_link.ifname}) {state}, operstate {pf_link.operstate}"
    if host.rdma_device:
        states = _port_states(root, host.rdma_device)
        if states and not any(s.endswith("ACTIVE") for s in states):
            return False, PORT_NOT_ACTIVE, f"RDMA device {host.rdma_device}: no ACTIVE port ({', '.join(states)})"
        if not host.ifname:
            if states:
                return True, "", ""
            return False, PORT_NOT_ACTIVE, f"RDMA device {host.rdma_device}: no ACTIVE port (no ports)"
    if host.ifname:
        if link is not None or (not netlink and (root / "class" / "net" / host.ifname).exists()):
            return True, "", ""
        if in_use:
            return True, "", f"netdev {host.ifname} is in a pod network namespace"
        return False, NETDEV_MISSING, f"netdev {host.ifname} is missing"
    return True, "", ""  # nothing to probe (e.g. a function without netdev or RDMA)


def device_health_states(
    devices: dict[str, Device],
    pool: str,
    sysfs_root: str,
    in_use: Callable[[str], bool],
    links: dict[str, LinkFacts] | None = None,
    netlink_seen: Container[str] = (),
    pf_links: dict[str, LinkFacts] | None = None,
) -> list[DeviceHealthState]:
    """Evaluate every published device; ``links``: device name -> its netdev's link, where known
    (``netlink_seen``: devices whose netdev the host's netlink has shown, so one without a link
    now is gone); ``pf_links``: a PF's PCI address -> its netdev's link."""
    out = []
    links, pf_links = links or {}, pf_links or {}
    for name, device in devices.items():
        pf_link = pf_links.get(device.host.sriov_pf) if device.host.sriov_pf else None
        healthy, reason, message = assess(
            device, sysfs_root, in_use(name), links.get(name), name in netlink_seen, pf_link
        )
        out.append(DeviceHealthState(pool=pool, device=name, healthy=healthy, message=message, reason=reason))
    return out


@dataclass(frozen=True)
class Holder:
    """A claim holding a removed device, and the pods it is reserved for (none yet: a prepared claim)."""

    claim: PreparedClaim
    device: str

    @property
    def pod_uids(self) -> tuple[str, ...]:
        return tuple(self.claim.pod_uids)


class RemovedDevices:
    """Which devices became ``DeviceRemoved`` since the last round, each told once while it stays so."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def newly_removed(self, states: list[DeviceHealthState]) -> dict[str, str]:
        """Device -> message, for the devices ``DeviceRemoved`` now and not in the last call's."""
        removed = {s.device: s.message for s in states if s.reason == DEVICE_REMOVED}
        new = {d: m for d, m in removed.items() if d not in self._told}
        self._told = set(removed)
        return new


def removed_holders(state: DriverState, devices: Container[str]) -> list[Holder]:
    """The claims (and their pods) that hold any of ``devices``."""
    return [Holder(claim, d.device) for claim in state.claims.values() for d in claim.devices if d.device in devices]


def pf_netdev(sysfs_root: str, pf: str) -> str | None:
    """The netdev of the PF at PCI address ``pf`` on the host (its first, by name), if it has one."""
    try:
        names = sorted(p.name for p in (Path(sysfs_root) / "bus" / "pci" / "devices" / pf / "net").iterdir())
    except OSError:
        return None
    return names[0] if names else None


def _whereabouts(state: DriverState) -> tuple[set[str], dict[str, tuple[str, str, str]]]:
    """(allocated devices, device -> (pod netns path, name in the pod, "<ns>/<pod>")) from the checkpoint."""
    allocated = {d.device for c in state.claims.values() for d in c.devices}
    in_pod = {
        m.device: (p.netns_path, m.pod_ifname, f"{p.namespace}/{p.name}")
        for p in state.pods.values()
        for m in p.devices
        if m.step in IN_POD_STEPS and p.netns_path
    }
    return allocated, in_pod


class HealthMonitor:
    """Evaluates every published device where it is (host or pod), in its own worker thread."""

    def __init__(
        self,
        store: CheckpointStore,
        devices: Callable[[], dict[str, Device]],
        pool: str,
        sysfs_root: str,
        host_netns: str,
    ) -> None:
        self.store = store
        self.devices = devices
        self.pool = pool
        self.sysfs_root = sysfs_root
        self.host_netns = host_netns
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="health")
        self._probe: LinkProbe | None = None  # built in the worker thread (its sockets live there)
        # devices whose netdev the host's netlink has shown while this driver ran: only their
        # absence from netlink means gone (a fixture tree's netdevs were never links)
        self._netlink_seen: set[str] = set()

    async def check(self) -> list[DeviceHealthState]:
        """One round, in the worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, self.evaluate)

    def evaluate(self) -> list[DeviceHealthState]:
        """One round (blocking: run it in the worker thread)."""
        if self._probe is None:
            self._probe = LinkProbe(Namespaces(self.host_netns))
        devices = self.devices()
        allocated, in_pod = self.store.read(_whereabouts)
        by_ifname: dict[str, str] = {}
        pods: dict[str, dict[str, str]] = {}  # netns path -> {pod ifname: device}
        where: dict[str, str] = {}
        for name, device in devices.items():
            if name in in_pod:
                path, ifname, pod = in_pod[name]
                pods.setdefault(path, {})[ifname] = name
                where[path] = pod
            elif device.host.ifname:
                by_ifname[device.host.ifname] = name
        # The VFs' PFs, asked for in the same host lookup: published or not, by their PCI function.
        pfs = {pf: pf_netdev(self.sysfs_root, pf) for pf in {d.host.sriov_pf for d in devices.values()} if pf}
        pf_names = {ifname: pf for pf, ifname in pfs.items() if ifname}
        links: dict[str, LinkFacts] = {}
        pf_links: dict[str, LinkFacts] = {}
        seen: Container[str] = ()
        try:
            for ifname, facts in self._probe.host([*by_ifname, *(n for n in pf_names if n not in by_ifname)]).items():
                if ifname in by_ifname:
                    links[by_ifname[ifname]] = facts
                if ifname in pf_names:
                    pf_links[pf_names[ifname]] = facts
            self._netlink_seen.update(links)
            seen = self._netlink_seen
        except OSError as exc:
            log.warning("link check in the host namespace failed", extra={"kv": {"error": str(exc)}})
        for path, names in pods.items():
            for ifname, facts in self._probe.pod(path, names, where[path]).items():
                links[names[ifname]] = facts
        return device_health_states(devices, self.pool, self.sysfs_root, allocated.__contains__, links, seen, pf_links)
