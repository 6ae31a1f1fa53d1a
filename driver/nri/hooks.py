"""The NRI hooks: move a pod's NICs in at RunPodSandbox, back at Stop/Remove, reconcile at Synchronize.

Write-ahead: before the first netlink call of a hook, the pod's
:class:`~driver.checkpoint.state.PodNetState` is persisted with every NIC in step
``moving`` (or ``returning``) together with everything needed to restore it on
the host. A driver killed at any point therefore finds, on restart, each NIC that
may have left the host and puts it back (Synchronize). One checkpoint write before
and one after the netlink work keep the fsync cost off the per-NIC path.

RunPodSandbox works on a plan per NIC (:class:`~driver.nic_settings.setting.Nic`): the host's
record of it, what it gets in the pod, what each setting recorded to undo itself. All or nothing:
what can be known before a move is checked first, against the pod's namespace (names the pod has
or its NICs share, MTUs, and every setting's own checks): a refused pod has every NIC on the host,
untouched. Once the write-ahead record is on disk (with the ifindex each NIC gets in the pod and
what identifies it), the NICs move in steps that each leave them somewhere known
(:mod:`driver.netlink.nic_moves`), each checked; then the settings work in the pod
(:mod:`driver.nic_settings`), every NIC's configuration going to the kernel in one pipelined batch.
Any failure returns every NIC and the hook fails naming the device and the step.

A share of a shared NIC (an allocation with a ``shareID``) or a claim asking for ``interface.type``
gets a sub-interface instead (:mod:`driver.netlink.sub_interfaces`): made straight into the pod at
its planned ifindex, recorded ahead like a move (``records["subInterface"]``, with its lease from
the NIC's address pool, :mod:`driver.nri.address_pool`), configured by the settings that handle
sub-interfaces (``NicSetting.sub_interfaces``), deleted at the return; the NIC stays on the host.

The return (StopPodSandbox, RemovePodSandbox, every rollback, a restarted driver's Synchronize, the
kubelet's unprepare) is write-ahead like the move in: the NICs are marked ``returning`` before the
first netlink call, and only those found home (or found nowhere: a virtual NIC destroyed with its
namespace) are marked ``returned``; the pod's state is dropped once all are. Idempotent.

Fault injection (tests only): ``DRANET_FAULT_AFTER=<step>`` makes the process ``os._exit(137)``
right after that step; :data:`RUN_STEPS` and :data:`STOP_STEPS` list them (``{i}`` is the NIC's
position in the pod).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import NoReturn, Protocol

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import (
    IN_POD,
    MOVING,
    RETURNED,
    RETURNING,
    DriverState,
    MovedDevice,
    PodNetState,
    PreparedClaim,
    PreparedDevice,
)
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import sub_interface_kind
from driver.claims.container_settings import settings_for_container
from driver.claims.status_entries import DeviceResult
from driver.config import HOST_NETNS, IPNetwork
from driver.netlink import arp_probe, mtu_limits, nic_home, sub_interfaces
from driver.netlink.hook_activity import HookActivity
from driver.netlink.kernel_features import MOVE_IFINDEX, KernelFeatures
from driver.netlink.link_identity import LinkIdentity, free_indexes
from driver.netlink.link_info import LinkInfo
from driver.netlink.namespaces import Namespaces, NetnsGone, is_netns_fd
from driver.netlink.nic_moves import (
    LinkState,
    Move,
    PodLinkConfig,
    PodLinkResult,
    check_moved,
    configure_pod_links,
    move_links,
    record_links,
    set_links,
)
from driver.netlink.rtnl import NetnsOpError, Request
from driver.netlink.sub_interfaces import delete_subs, newsub
from driver.nic_settings import rdma
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused
from driver.nri import address_pool
from driver.nri.address_pool import PoolError
from driver.nri.adoption import adopt
from driver.nri.container_adjustment import container_adjustment
from driver.nri.dad_watch import DadWatch

log = logging.getLogger(__name__)

Netdev = tuple[PreparedClaim, PreparedDevice]
"""A pod's prepared device with a netdev, and its claim."""
SUB_INTERFACE = sub_interfaces.RECORD
"""The pod state's record of a sub-interface of a NIC: the NIC stays on the host, the pod's
sub-interface is deleted at the return."""
FAULT_ENV = "DRANET_FAULT_AFTER"
PROBE_WAIT = 0.1
"""Seconds an ARP probe of a pool address waits for a host holding it to answer (RFC 5227 waits
longer; a pod start waits on this, and a host that holds an address answers in microseconds)."""
RUN_STEPS = ["run:planned", "run:moved-{i}", "run:set", "run:in-pod", "run:configured", "run:committed"]
STOP_STEPS = ["stop:planned", "stop:returned-{i}", "stop:committed"]
SYNC_ATTACH_BUDGET_S = 1.0
"""Seconds of a Synchronize that may go to pods that started while no driver was connected (about
0.1 s each): the call has the runtime's 2 s; pods past it are reported instead."""


class HookError(Exception):
    """A hook failed; the message names the pod, the device and the step."""


class StatusSink(Protocol):
    """Receives hook outcomes to publish (claim status, events). Must not block."""

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        """Every NIC of ``claim`` is configured in the pod."""

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        """Attaching ``device`` failed at ``step`` (everything was rolled back)."""

    def nic_returned_unattended(
        self, pod_uid: str, claim: PreparedClaim, device: str, message: str, lost: bool
    ) -> None:
        """The pod ended while no driver was connected: its NIC came back (found and restored) or
        was ``lost`` (a virtual NIC died with the namespace)."""


def pod_netns_path(pod: api.PodSandbox) -> str:
    """The pod's network namespace path, or "" for a hostNetwork pod."""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            return ns.path
    return ""


class StepClock:
    """The steps of the running hook: exits after the injected fault's step, logs each phase's time."""

    def __init__(self, fault_after: str | None = None) -> None:
        self.fault_after = fault_after if fault_after is not None else os.environ.get(FAULT_ENV)
        self._marks: list[tuple[str, float]] = []  # (step, time) of the running hook

    def step(self, name: str) -> None:
        """A step is done: timed, and the process exits here if the fault is injected after it."""
        self.mark(name)
        if self.fault_after and self.fault_after == name:
            log.warning("fault injection: exiting", extra={"kv": {"after": name}})
            os._exit(137)

    def mark(self, name: str) -> None:
        """A phase is done: timed only (no fault can be injected after it)."""
        self._marks.append((name, time.perf_counter()))

    @contextlib.contextmanager
    def timing(self, hook: str, pod_uid: str) -> Iterator[None]:
        """One hook: its steps' times logged at debug level when it ends."""
        self._marks = [("start", time.perf_counter())]
        try:
            yield
        finally:
            if log.isEnabledFor(logging.DEBUG) and len(self._marks) > 1:
                marks = [*self._marks, ("end", time.perf_counter())]
                ms = {b[0]: round((b[1] - a[1]) * 1e3, 3) for a, b in itertools.pairwise(marks)}
                log.debug("hook steps", extra={"kv": {"hook": hook, "pod": pod_uid, "ms": ms}})


class NetnsPins:
    """Pod UID -> an open fd of the pod's network namespace, while the pod holds our NICs.

    An open fd keeps the namespace (and the NICs in it) alive after the runtime unmounts it, so
    NICs can still be given back when no StopPodSandbox reaches us: containerd (up to 2.3 at least)
    forgets its pods' NRI state on restart and then never relays Stop/Remove for pods created
    before it (containerd#8426); a destroyed namespace destroys a veth and drops a physical NIC on
    the host unconfigured. The kubelet's NodeUnprepareResources then returns them
    (:meth:`NRIHooks.claim_unprepared`).
    """

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def pin(self, pod_uid: str, netns: str) -> None:
        """Hold the pod's network namespace open (idempotent; a gone namespace is not pinned)."""
        if pod_uid in self.fds or not netns:
            return
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if is_netns_fd(fd):
            self.fds[pod_uid] = fd
        else:
            os.close(fd)

    def unpin(self, pod_uid: str) -> None:
        """Let the pod's namespace go (its NICs are home)."""
        fd = self.fds.pop(pod_uid, None)
        if fd is not None:
            os.close(fd)

    def path(self, pod_uid: str, netns: str) -> str:
        """The pinned namespace (as a /proc/self/fd path) when we hold one, else ``netns``."""
        fd = self.fds.get(pod_uid)
        return f"/proc/self/fd/{fd}" if fd is not None else netns


def _raise_first(errors: list[NetnsOpError | None]) -> None:
    for err in errors:
        if err is not None:
            raise err


class NRIHooks:
    """Implements :class:`driver.nri.plugin.NRIHandler` on top of the checkpoint, the NIC moves and
    the NIC settings.

    The NRI plugin calls the hooks from its connection thread; `claim_unprepared` comes from
    the kubelet plugin, so the hooks that move NICs take one lock. ``hook_activity`` announces each
    hook and the host links it changes, so their link events cost no scan and background work
    steps aside while the hook runs (the daemon shares it with them); ``rdma_exclusive``: RDMA
    devices move with their netdev (detected at daemon start); ``status`` gets each RunPodSandbox's
    outcome per claim (a sink that raises never fails the hook); ``on_host_change``: a hook changed
    the host's devices in a way link events do not tell (a soft RDMA device made again);
    ``kernel``: the kernel's features (without ``moveIfindex`` a NIC keeps its ifindex in the pod);
    ``before_containers(pod_uid)``: called before a container of a pod with our devices is adjusted
    (the status sink's queued device metadata is written by then).
    """

    def __init__(
        self,
        store: CheckpointStore,
        status: StatusSink | None = None,
        host_netns: str = HOST_NETNS,
        *,
        fault_after: str | None = None,
        sysfs_root: str = "/sys",
        rdma_exclusive: bool = False,
        hook_activity: HookActivity | None = None,
        settings: Sequence[NicSetting] = SETTINGS,
        pools: Mapping[str, IPNetwork | None] | None = None,
        probe_wait: float = PROBE_WAIT,
        on_host_change: Callable[[], None] | None = None,
        kernel: KernelFeatures | None = None,
        before_containers: Callable[[str], None] | None = None,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.status = status
        self.before_containers = before_containers
        self.host = HostNetns(Namespaces(host_netns), sysfs_root, rdma_exclusive, on_host_change, kernel)
        self.own = hook_activity or HookActivity()
        self.steps = StepClock(fault_after)
        self.pins = NetnsPins()  # held while a pod has NICs: `claim_unprepared` returns them when no Stop comes
        self.settings = tuple(settings)
        # Shared NIC name -> its address pool on this node (None: its subnet): the node's
        # dra.net/sharing-pools annotation over --sharing-pools.
        self.pools = dict(pools or {})
        self.probe_wait = probe_wait  # seconds an ARP probe of a lease waits for an answer (0: no probe)
        # Counts what a pod met that its claim's status reports (the problems' metric): a reason.
        self.on_problem = on_problem or (lambda _reason: None)
        # The pods' new IPv6 addresses under duplicate address detection, off the hooks' path.
        self.dad = DadWatch(on_failed=self._address_in_use)
        self._lock = threading.RLock()

    def set_pools(self, pools: Mapping[str, IPNetwork | None]) -> None:
        """The node's address pools changed (its annotation, watched by the daemon): the next lease
        takes them. Leases held stay their shares' (``address_pool.in_use`` counts each, in any range)."""
        self.pools = dict(pools)  # one rebinding: a lease reads either the old pools or the new

    def close(self) -> None:
        """Close the host's sockets (the pinned namespaces stay: their NICs are still out)."""
        self.dad.close()
        self.host.ns.close()

    def _netdevs(self, pod_uid: str) -> list[Netdev]:
        """The pod's prepared devices that have a netdev (the ones that move)."""
        return self.store.read(lambda s: _netdevs_of(s, pod_uid))

    def _pod_state(self, pod_uid: str) -> PodNetState | None:
        """The pod's NIC state in the checkpoint, None when it holds none of ours."""
        return self.store.read(lambda s: s.pods.get(pod_uid))

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """The kubelet unprepared ``claim``: its pods are gone, so give back NICs still out.

        Normally StopPodSandbox returned them already (nothing to do). Without it (see
        :class:`NetnsPins`), they are still in the pod's pinned namespace.
        """
        with self._lock, self.own.hook():
            for uid in claim.pod_uids:
                if self._pod_state(uid) is None:
                    continue
                errors = self._return_all(uid)
                log.warning(
                    "NICs returned at unprepare: the runtime sent no StopPodSandbox",
                    extra={"kv": {"pod": uid, "claim": claim.uid, "errors": errors}},
                )

    @contextlib.contextmanager
    def _hook(self, name: str, pod: api.PodSandbox) -> Iterator[None]:
        """One hook: announced to :class:`HookActivity`; its steps' times logged at debug level."""
        with self.steps.timing(name, pod.uid), self.own.hook():
            yield

    # -- RunPodSandbox ----------------------------------------------------------------------
    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Move and configure every prepared netdev of the pod; all or nothing."""
        with self._lock, self._hook("RunPodSandbox", pod):
            netdevs, existing = self.store.read(lambda s: (_netdevs_of(s, pod.uid), s.pods.get(pod.uid)))
            if not netdevs:
                return
            if existing is not None and existing.devices and all(d.step == IN_POD for d in existing.devices):
                return  # a retried call: already done
            if existing is not None:
                self._return_all(pod.uid)  # leftovers of an interrupted attempt: start clean
            netns = pod_netns_path(pod)
            if not netns:
                raise HookError(
                    f"pod {pod.namespace}/{pod.name}: device {netdevs[0][1].device}: netns "
                    "failed: pod has no network namespace (hostNetwork pods cannot get a NIC)"
                )
            self._attach(pod, netns, netdevs)

    def _attach(self, pod: api.PodSandbox, netns: str, netdevs: list[Netdev]) -> None:
        """Plan every NIC against the host and the pod, then move them in; :class:`HookError` if any
        cannot go (nothing touched) or fails on the way (all returned)."""
        ifnames = [d.snapshot.host.ifname or "" for _, d in netdevs]  # _netdevs: all have one
        self.own.expect(names=ifnames)
        try:
            hosts = record_links(self.host.ns, ifnames, self.host.sysfs_root)
        except KeyError as exc:
            self._failed(pod, netdevs, netdevs[0][1].device, "record", str(exc))
            raise HookError(f"pod {pod.namespace}/{pod.name}: record failed: {exc}") from exc
        self.own.expect(indexes=[h.index for h in hosts.values()])
        self.steps.mark("run:recorded")
        try:
            leased = self._leases(netdevs, hosts)
        except PoolError as exc:
            self._failed(pod, netdevs, netdevs[0][1].device, "address pool", str(exc))
            raise HookError(f"pod {pod.namespace}/{pod.name}: address pool failed: {exc}") from exc
        nics = [_nic(c, d, hosts[name], leased.get(d.device)) for (c, d), name in zip(netdevs, ifnames, strict=True)]
        target = PodNetns(self.host, netns, on_created=self._recorder(pod.uid))
        try:
            self._plan(pod, target, nics, hosts)
            self._move_in(pod, target, nics)
        finally:
            target.close()

    def _leases(self, netdevs: list[Netdev], hosts: Mapping[str, LinkState]) -> dict[str, str]:
        """For the pod's sub-interfaces: refuse an address its claim sets that is in use on this
        node (naming who holds it), and lease one of its NIC's pool to each whose claim sets none
        (device -> CIDR): not in use on this node, and not answering an ARP probe on the link."""
        shares = [d for _, d in netdevs if d.sub_interface]
        if not shares:
            return {}
        host = address_pool.host_addresses(self.host.rtnl())
        taken = self.store.read(lambda s: address_pool.in_use(s, host, skip=[c.uid for c, _ in netdevs]))
        for d in shares:
            for cidr in (d.config.interface.addresses if d.config.interface else None) or ():
                holder = taken.get(cidr.split("/", 1)[0])
                if holder is not None:
                    raise PoolError(f"device {d.device}: interface.addresses: {cidr} is in use by {holder}")
        out: dict[str, str] = {}
        for d in shares:
            if _addressed(d):
                continue
            nic = hosts[d.snapshot.host.ifname or ""]
            own = [cidr for link, cidr in host.values() if link == nic.ifname]

            def answered(address: str, nic: LinkState = nic) -> bool:
                return self._arp_answered(nic, address)

            out[d.device] = address_pool.lease(nic.ifname, own, taken, self.pools, answered)
            taken[out[d.device].split("/", 1)[0]] = f"device {d.device} of this pod"
        return out

    def _arp_answered(self, nic: LinkState, address: str) -> bool:
        """Whether a host on ``nic``'s link answers an ARP probe for IPv4 ``address`` (bounded wait);
        an IPv6 one is left to the kernel's own duplicate address detection. A NIC that cannot
        send (down) cannot tell: the address is taken as free, and that is logged."""
        if ":" in address or not nic.mac or self.probe_wait <= 0:
            return False
        try:
            return arp_probe.in_use(self.host.fd, nic.ifname, nic.mac, address, self.probe_wait)
        except OSError as exc:
            log.warning("ARP probe not sent", extra={"kv": {"nic": nic.ifname, "address": address, "error": str(exc)}})
            return False

    def _plan(self, pod: api.PodSandbox, target: PodNetns, nics: list[Nic], hosts: Mapping[str, LinkState]) -> None:
        """What can be known before a move, against the pod's namespace: every refusal is here, and
        each NIC's ifindex in the pod (its host one when free there); ``hosts``: the NICs as the
        host has them (a share's limits are its NIC's)."""
        try:
            links = target.rtnl.link_names()
        except (NetnsGone, OSError) as exc:
            reason = f"pod network namespace {target.path} is unusable: {exc}"
            self._refuse(pod, nics, nics[0].name, "netns", reason)
        target.names = set(links.values())
        try:
            self._check_names_and_mtus(nics, target.names)
            self._check_shares(pod.uid, nics, hosts)
            for setting in self.settings:
                setting.plan(_for(setting, nics), self.host, target)
            indexes = _pod_indexes(self.host, target, nics, links)
        except SettingRefused as exc:
            self._refuse(pod, nics, exc.device, exc.step, exc.reason)
        except OSError as exc:
            self._refuse(pod, nics, nics[0].name, "record", str(exc))
        for nic, index in zip(nics, indexes, strict=True):
            nic.pod_index = index

    def _check_names_and_mtus(self, nics: Sequence[Nic], pod_names: set[str]) -> None:
        """Refuse a name the pod already has or that two of its NICs (of any of its claims) would
        get, and an MTU the NIC (or a VF's PF) cannot take: the kernel refuses them only once the
        NIC is in the pod."""
        names: dict[str, str] = {}
        for nic in nics:
            name = nic.pod.ifname
            if name in pod_names:
                reason = f"the pod already has an interface {name!r}; set interface.name to another name"
                raise SettingRefused(nic.name, "name", reason)
            if name in names:
                reason = f"{name!r} is also the name of device {names[name]} of this pod (another claim)"
                raise SettingRefused(nic.name, "name", reason)
            names[name] = nic.name
        for nic in nics:
            if nic.pod.mtu is not None:
                pf = mtu_limits.pf_mtu(nic.host.ifname, self.host.sysfs_root)
                problem = mtu_limits.problem(nic.pod.mtu, nic.host.min_mtu, nic.host.max_mtu, pf)
                if problem:
                    raise SettingRefused(nic.name, "mtu", problem)

    def _check_shares(self, pod_uid: str, nics: Sequence[Nic], hosts: Mapping[str, LinkState]) -> None:
        """Refuse what a sub-interface cannot be, in the driver's words before the kernel's: two
        shares of one NIC in one pod (one record per device), a share of a NIC whose RDMA device
        would have to move (exclusive RDMA mode), and what its NIC does not allow (:func:`_share_limits`)."""
        seen: set[str] = set()
        shares = [nic for nic in nics if nic.sub_interface]
        others = self.store.read(lambda s: _share_macs(s, pod_uid)) if shares else {}
        for nic in shares:
            if nic.name in seen:
                raise SettingRefused(nic.name, "share", "this pod holds two shares of this NIC; one share per pod")
            seen.add(nic.name)
            if self.host.rdma_exclusive and nic.device.snapshot.host.rdma_device:
                reason = (
                    "the runtime's RDMA namespace mode is exclusive: an RDMA device is in one namespace at "
                    "a time, so a shared RDMA NIC cannot serve several pods (rdma system set netns shared)"
                )
                raise SettingRefused(nic.name, "rdma", reason)
            _share_limits(nic, hosts[nic.host.ifname], others.get(nic.host.ifname, {}))

    def _move_in(self, pod: api.PodSandbox, target: PodNetns, nics: list[Nic]) -> None:
        """From the write-ahead record on: move, set, check, the settings in the pod, configure;
        any failure returns every NIC."""
        state = PodNetState(
            pod_uid=pod.uid,
            sandbox_id=pod.id,
            namespace=pod.namespace,
            name=pod.name,
            netns_path=target.path,
            devices=[_moved_device(nic) for nic in nics],
        )

        def plan(s: DriverState) -> None:
            s.pods[pod.uid] = state

        self.store.update(plan)  # write-ahead: from here every NIC may be in the pod
        self.steps.step("run:planned")
        moves = [self._move(nic) for nic in nics]
        whole = [m for m, nic in zip(moves, nics, strict=True) if not nic.sub_interface]
        device, step = "", "move"
        try:
            # All moves in one pipelined send (the kernel still does them one by one); the
            # write-ahead state above already covers every NIC. Shares are made in the pod.
            _raise_first(move_links(self.host.rtnl(), whole, target.fd, self.host.kernel.has(MOVE_IFINDEX)))
            step = "create"
            _raise_first(self.host.rtnl().run_each([_create(nic, target.fd) for nic in nics if nic.sub_interface]))
            for i in range(len(nics)):
                self.steps.step(f"run:moved-{i}")
            step = "set link"
            # The settings by ifindex, and every NIC read back for the check, in one round trip.
            errors, found = set_links(target.rtnl, whole, [m.pod_index for m in moves])
            _raise_first(errors)
            self.steps.step("run:set")
            step = "verify"
            links = _check_in_pod(moves, nics, found)
            step = "in pod"
            for setting in self.settings:
                setting.in_pod(_for(setting, nics), target)
            self.steps.step("run:in-pod")
            step = "configure"
            reqs: list[Request] = [r for nic in nics for s in self.settings if _for(s, [nic]) for r in s.requests(nic)]
            results = configure_pod_links(target.rtnl, reqs, {nic.name: (nic.pod, links[nic.name]) for nic in nics})
            for nic in nics:
                nic.result = results[nic.name]
            for setting in self.settings:
                setting.after_configure(_for(setting, nics), target)
            self.steps.step("run:configured")
        except (NetnsOpError, NetnsGone, OSError) as exc:
            if isinstance(exc, NetnsOpError):
                device, step, reason = exc.device, exc.step, exc.reason
            else:
                reason = f"pod network namespace {target.path} is unusable: {exc}"
            target.close()
            rollback = self._return_all(pod.uid, target.path)
            msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
            if rollback:
                msg += f"; rollback: {rollback}"
            self._failed(pod, [(nic.claim, nic.device) for nic in nics], device, step, msg)
            raise HookError(msg) from exc
        self.store.update(lambda s: s.pods.__setitem__(pod.uid, _in_pod_state(s.pods[pod.uid], nics, links)))
        self.pins.pin(pod.uid, target.path)
        self.steps.step("run:committed")
        if target.tentative:  # followed in the background: the pod's containers may use them at once
            pending = {key: device for key, (device, _) in target.tentative.items()}
            usable = all(optimistic for _, optimistic in target.tentative.values())
            self.dad.watch(pod.uid, self.pins.path(pod.uid, target.path), pending, usable)
        self._ready(pod, nics)

    def _move(self, nic: Nic) -> Move:
        """The NIC's two requests: into the pod at its planned ifindex and name, then its MTU, MAC and
        the settings' link attributes there."""
        attrs = b"".join(setting.link_attrs(nic) for setting in self.settings if _for(setting, [nic]))
        return Move(nic.name, nic.host.index or 0, nic.pod.ifname, nic.pod_index, nic.pod.mtu, nic.pod.mac, attrs)

    def _recorder(self, pod_uid: str) -> Callable[[dict[str, object]], None]:
        """Records a link the hook just created in the pod (kind, ifindex, name), before anything else."""

        def record(created: dict[str, object]) -> None:
            def add(s: DriverState) -> None:
                pod = s.pods[pod_uid]
                s.pods[pod_uid] = replace(pod, created=[*pod.created, created])

            self.store.update(add)

        return record

    def _refuse(self, pod: api.PodSandbox, nics: list[Nic], device: str, step: str, reason: str) -> NoReturn:
        """Fail the hook before anything moved: reported, nothing to roll back."""
        msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
        self._failed(pod, [(nic.claim, nic.device) for nic in nics], device, step, msg)
        raise HookError(msg)

    def _ready(self, pod: api.PodSandbox, nics: list[Nic]) -> None:
        """Every NIC of the pod is configured: one report per claim."""
        if self.status is None:
            return
        for claim in {nic.claim.uid: nic.claim for nic in nics}.values():
            out = [
                _device_result(nic, nic.result) for nic in nics if nic.claim.uid == claim.uid and nic.result is not None
            ]
            try:
                self.status.pod_network_ready(pod.uid, claim, out)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def _failed(
        self,
        pod: api.PodSandbox,
        netdevs: list[Netdev],
        device: str,
        step: str,
        message: str,
    ) -> None:
        """Attaching ``device`` (or, when "", the pod's NICs) failed at ``step``; all was rolled back."""
        log.error(
            "RunPodSandbox failed", extra={"kv": {"pod": pod.uid, "device": device, "step": step, "error": message}}
        )
        if self.status is None:
            return
        for claim, d in netdevs:
            if d.device == device or not device:
                try:
                    self.status.pod_network_failed(pod.uid, claim, device, step, message)
                except Exception:
                    log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})
                break

    # -- Stop / Remove ----------------------------------------------------------------------
    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Return every NIC of the pod (original name, MTU, MAC, addresses, routes)."""
        with self._lock, self._hook("StopPodSandbox", pod):
            errors = self._return_all(pod.uid, pod_netns_path(pod))
        if errors:
            raise HookError(f"pod {pod.namespace}/{pod.name}: {errors}")

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Same as stop (idempotent): the last chance to get NICs back."""
        self.stop_pod_sandbox(pod)

    def _return_all(self, pod_uid: str, netns: str = "", outcome: dict[str, str | NetnsOpError] | None = None) -> str:
        """Return every NIC of the pod to the host as recorded; idempotent. Returns "" or the errors;
        ``outcome`` (when given) gets, per device, how it was found (``pod``, ``host``,
        ``netns-gone``) or why not."""
        state = self._pod_state(pod_uid)
        if state is None:
            return ""
        self.dad.forget(pod_uid)
        self.own.expect(
            names=[m.host_ifname for m in state.devices if m.step != RETURNED],
            indexes=[m.host_index for m in state.devices if m.step != RETURNED and m.host_index],
        )

        def plan(s: DriverState) -> None:
            pod = s.pods[pod_uid]
            devices = [m if m.step == RETURNED else replace(m, step=RETURNING) for m in pod.devices]
            s.pods[pod_uid] = replace(pod, devices=devices)

        self.store.update(plan)
        self.steps.step("stop:planned")
        netns = self.pins.path(pod_uid, netns or state.netns_path)
        pending = [m for m in state.devices if m.step != RETURNED]
        moved = [m for m in pending if SUB_INTERFACE not in m.records]
        source = PodNetns(self.host, netns, created=state.created)
        try:
            for setting in reversed(self.settings):  # DHCP leases released, out of the VRFs, RDMA devices home
                setting.before_return([m for m in pending if setting.sub_interfaces or m in moved], source)
            deleted = _delete_subs(source, [m for m in pending if m not in moved])
        finally:
            source.close()
        # Coming home, a NIC shows up in the host under its pod name before the rename.
        self.own.expect(names=[m.pod_ifname for m in moved])
        results: dict[str, str | NetnsOpError] = dict(deleted)
        results.update(
            nic_home.return_links(
                self.host.ns,
                netns,
                [self._return_item(m) for m in moved],
                announce=lambda indexes: self.own.expect(indexes=indexes),
                choose_index=self.host.kernel.has(MOVE_IFINDEX),
            )
        )
        self.steps.mark("stop:moved-and-restored")
        if outcome is not None:
            outcome.update(results)
        errors, done = self._after_return(pod_uid, state, results)

        def commit(s: DriverState) -> bool:
            """Mark the NICs home; True when the pod holds none any more (its state dropped)."""
            pod = s.pods.get(pod_uid)
            if pod is None:
                return True
            devices = [replace(m, step=RETURNED) if m.device in done else m for m in pod.devices]
            if all(m.step == RETURNED for m in devices):
                del s.pods[pod_uid]
                return True
            s.pods[pod_uid] = replace(pod, devices=devices)
            return False

        if self.store.update(commit):
            self.pins.unpin(pod_uid)
        self.steps.step("stop:committed")
        return "; ".join(errors)

    def _return_item(self, m: MovedDevice) -> nic_home.ReturnItem:
        """How to find ``m`` and what to give it back. Its pod MAC only helps records without an identity."""
        host = LinkState(
            ifname=m.host_ifname,
            mtu=m.host_mtu or 0,
            mac=m.host_mac or "",
            permanent_mac=m.permanent_mac,
            pci_address=m.pci_address,
            index=m.host_index,
        )
        return nic_home.ReturnItem(
            m.device,
            m.pod_ifname,
            host,
            pod_index=m.pod_index,
            identity=LinkIdentity.from_dict(m.identity) if m.identity is not None else None,
            extra_macs=(m.pod_mac,) if m.pod_mac and m.pod_mac != m.host_mac else (),
            # In the settings' order, as the pod's configuration was built.
            restores=lambda index: [r for s in self.settings for r in s.restore_requests(m, index)],
        )

    def _after_return(
        self, pod_uid: str, state: PodNetState, results: dict[str, str | NetnsOpError]
    ) -> tuple[list[str], list[str]]:
        """Each NIC's settings undone on the host once it is home; (errors, devices done)."""
        errors: list[str] = []
        done: list[str] = []
        returned: dict[str, str] = {}
        for i, m in enumerate(state.devices):
            if m.step == RETURNED:
                continue
            result = results[m.device]
            try:
                if isinstance(result, NetnsOpError):
                    raise result
                done.append(m.device)
                if SUB_INTERFACE in m.records:  # the NIC never left the host: nothing to restore there
                    returned[m.device] = f"sub-interface {m.pod_ifname} of {m.host_ifname}: {result}"
                    self.steps.step(f"stop:returned-{i}")
                    continue
                for setting in reversed(self.settings):  # also right when the pod netns is gone
                    setting.after_return(m, self.host)
                returned[m.device] = f"{m.host_ifname} (found in {result})"
            except (NetnsOpError, OSError) as exc:
                errors.append(str(exc))
                if isinstance(exc, NetnsOpError) and exc.step == "find":
                    # Nowhere to be found: a virtual NIC (veth, ...) destroyed with its netns.
                    # Retrying forever cannot bring it back; forget it (loudly).
                    done.append(m.device)
                log.error("NIC return failed", extra={"kv": {"pod": pod_uid, "device": m.device, "error": str(exc)}})
            self.steps.step(f"stop:returned-{i}")
        if returned:
            log.info("NICs returned", extra={"kv": {"pod": pod_uid, "devices": returned}})
        return errors, done

    # -- CreateContainer --------------------------------------------------------------------
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        """RDMA char devices, NCCL HCA env and the NUMA cpuset of the pod's claims."""
        with self.own.hook():
            claims = self.store.read(lambda s: s.claims_for_pod(pod.uid))
            devices = [d for c in claims for d in c.devices]
            if not devices:
                return None
            if self._missed(pod):  # its RunPodSandbox never reached the driver: its NICs now, first
                with self._lock:
                    if self._missed(pod):
                        self._attach_late(pod, [container])
            self._check_addresses(pod)
            if self.before_containers is not None:  # what the pod's start queued for its containers
                self.before_containers(pod.uid)
            return self._adjustment(pod, container)

    def _adjustment(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        """What the pod's claims give ``container`` (None: nothing)."""
        devices = [d for c in self.store.read(lambda s: s.claims_for_pod(pod.uid)) for d in c.devices]
        # Narrow, never widen, the cpuset the kubelet chose (CPU manager exclusive CPUs).
        requested = container.linux.resources.cpu.cpus if container.HasField("linux") else ""
        state = self._pod_state(pod.uid)
        devices = _without_stay_home_rdma(devices, state.devices if state is not None else [])
        addresses = _sub_interface_addresses(devices, state.devices if state is not None else [])
        settings = settings_for_container(devices, self.host.sysfs_root, requested or None, addresses)
        if settings.skipped_pin:
            log.warning(
                "numa.pin not applied",
                extra={"kv": {"pod": pod.uid, "container": container.name, "reason": settings.skipped_pin}},
            )
        return container_adjustment(devices, settings)

    def _check_addresses(self, pod: api.PodSandbox) -> None:
        """Refuse the pod's containers while one of its IPv6 addresses is in use on its link; where
        the kernel could not add them optimistically, wait (briefly) until they can be bound."""
        if not self.dad.wait(pod.uid):
            log.warning("IPv6 addresses still tentative: container created", extra={"kv": {"pod": pod.uid}})
        failed = self.dad.failure(pod.uid)
        if failed is not None:
            raise HookError(
                f"pod {pod.namespace}/{pod.name}: device {failed.device}: address failed: {failed}; the pod's "
                "containers do not start (the kernel does not use the address): free it on the link and delete "
                "the pod, or give the claim another address"
            )

    def _address_in_use(self, pod_uid: str, device: str, cidr: str, message: str) -> None:
        """(the detection's thread) An IPv6 address of the pod is in use on its link: its claim's
        ``Ready`` False naming it, a Warning event on the pod, counted."""
        del cidr
        self.on_problem("ipv6-address-in-use")
        claims = self.store.read(
            lambda s: [c for c in s.claims_for_pod(pod_uid) if any(d.device == device for d in c.devices)]
        )
        if self.status is None:
            return
        for claim in claims:
            try:
                self.status.pod_network_failed(pod_uid, claim, device, "address", f"device {device}: {message}")
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod_uid}})

    # -- Synchronize / Shutdown -------------------------------------------------------------
    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        """Reconcile the checkpoint with the runtime's pods after a (re)connect.

        Gone pods: return their NICs. Pods with NICs mid-move: roll back (the hook
        never reported success). Mid-return: finish returning. Pods with claims but no state:
        NICs of theirs already in their netns (the pod state file was lost) are recorded again
        (:mod:`driver.nri.adoption`); a live one that has none started while no driver was
        connected and gets them now if it has containers, else at its first CreateContainer
        (:meth:`_attach_unattended`; a sandbox whose namespace is gone or whose containers all
        stopped is left alone: it is ending; so is one whose RunPodSandbox reached the driver and
        failed: the runtime fails that sandbox).
        """
        started = time.monotonic()
        with self._lock, self.own.hook():
            self.host.rtnl()  # warm up the socket here, not in the first RunPodSandbox
            alive = {p.uid: p for p in pods}
            known = self.store.read(lambda s: {uid: [m.step for m in p.devices] for uid, p in s.pods.items()})
            for uid, steps in known.items():
                pod = alive.get(uid)
                if pod is not None and steps and all(s == IN_POD for s in steps):
                    # Held NICs of a live pod: pin its namespace again (a restarted driver).
                    state = self._pod_state(uid)
                    self.pins.pin(uid, state.netns_path if state is not None else "")
                    continue
                why = "gone" if pod is None else "interrupted"
                held = self._pod_state(uid) if pod is None else None
                outcome: dict[str, str | NetnsOpError] = {}
                errors = self._return_all(uid, pod_netns_path(pod) if pod is not None else "", outcome)
                log.info("synchronize: returned NICs", extra={"kv": {"pod": uid, "why": why, "errors": errors}})
                if held is not None and not self.pins.fds.get(uid):
                    self._report_unattended(held, outcome)
            for pod in pods:
                if pod.uid not in known:
                    self._adopt(pod)
            # Only pods the driver never heard of: one it has a record of saw its hook fail (the
            # runtime fails such a sandbox), and was rolled back above.
            self._attach_unattended([p for p in pods if p.uid not in known], containers, started)

    def _attach_unattended(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], started: float
    ) -> None:
        """The pods that started while no driver was connected to the runtime (its NRI connection
        lost, a handover's gap) and have containers already: live, with prepared NICs and no state.
        Each gets its NICs now, in its running namespace, within the runtime's budget for this call,
        and its claims say that its containers were created without what the driver gives them
        (``Ready`` False with the reason, a Warning event); counted. A pod without containers yet
        gets its NICs at its first CreateContainer (:meth:`create_container`), with nothing
        missing; a sandbox with every container stopped is ending, and is left alone."""
        live = (api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED)
        by_pod: dict[str, list[api.Container]] = {}
        for c in containers:
            if c.state in live:
                by_pod.setdefault(c.pod_sandbox_id, []).append(c)
        for pod in pods:
            own = by_pod.get(pod.id, [])
            if not own or not self._missed(pod):
                continue
            if time.monotonic() - started > SYNC_ATTACH_BUDGET_S:
                self.on_problem("started-without-driver")
                why = (
                    "it started while the driver was not connected to the container runtime, and more such pods "
                    "than fit the runtime's time limit were found at the reconnect: delete the pod to start it "
                    "with its NICs"
                )
                self._report_pod(pod, self._netdevs(pod.uid), "late attach", f"pod {pod.namespace}/{pod.name}: {why}")
                continue
            try:
                self._attach_late(pod, own)
            except HookError:
                continue
            self._report_late_containers(pod, own, self._netdevs(pod.uid))

    def _missed(self, pod: api.PodSandbox) -> bool:
        """Whether the pod has prepared NICs, none of them attached, and a live namespace: its
        RunPodSandbox never reached the driver."""
        netns = pod_netns_path(pod)
        return bool(netns and self._pod_state(pod.uid) is None and self._netdevs(pod.uid) and _netns_alive(netns))

    def _attach_late(self, pod: api.PodSandbox, containers: Sequence[api.Container]) -> None:
        """The NICs of a pod whose RunPodSandbox never reached the driver, now; :class:`HookError`
        as RunPodSandbox's (reported by the attach: ``Ready`` False with the step and the reason)."""
        self.on_problem("started-without-driver")
        log.warning(
            "pod started while the driver was not connected to the runtime: attaching its NICs now",
            extra={"kv": {"pod": pod.uid, "containers": [c.name for c in containers]}},
        )
        self._attach(pod, pod_netns_path(pod), self._netdevs(pod.uid))

    def _report_late_containers(
        self, pod: api.PodSandbox, containers: Sequence[api.Container], netdevs: list[Netdev]
    ) -> None:
        """Containers created before the NICs came lack what the driver gives each container (RDMA
        character devices, ``NCCL_IB_HCA``, the NUMA cpuset) where their claims give any: say so."""
        needed = containers and self._adjustment(pod, containers[0]) is not None
        if not needed:
            return
        names = ", ".join(sorted({c.name for c in containers}))
        message = (
            f"pod {pod.namespace}/{pod.name}: its NICs are in the pod now, but its containers ({names}) were "
            "created while the driver was not connected to the container runtime, without their RDMA devices "
            "and environment: delete the pod to start them with those"
        )
        self._report_pod(pod, netdevs, "container setup", message)

    def _report_pod(self, pod: api.PodSandbox, netdevs: list[Netdev], step: str, message: str) -> None:
        """A problem of the whole pod after its NICs' fate was decided: ``Ready`` False on the first
        NIC of each of its claims (naming ``step``), a Warning event on the pod."""
        log.error("pod network problem", extra={"kv": {"pod": pod.uid, "step": step, "error": message}})
        if self.status is None:
            return
        for claim in {c.uid: c for c, _ in netdevs}.values():
            first = next(d.device for c, d in netdevs if c.uid == claim.uid)
            try:
                self.status.pod_network_failed(pod.uid, claim, first, step, message)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def _report_unattended(self, held: PodNetState, outcome: Mapping[str, str | NetnsOpError]) -> None:
        """A pod that ended while no driver was connected (no StopPodSandbox reached us, its
        namespace not pinned): say on each claim what became of its NICs. A physical NIC fell back
        into the host when the namespace died and was found by its identity and restored; a
        virtual one (a veth) died with the namespace: a clean, reported loss."""
        if self.status is None:
            return
        claims = self.store.read(lambda s: {d.device: c for c in s.claims_for_pod(held.pod_uid) for d in c.devices})
        pod = f"{held.namespace}/{held.name}"
        for m in held.devices:
            claim, result = claims.get(m.device), outcome.get(m.device)
            if claim is None or result is None or SUB_INTERFACE in m.records:
                continue
            lost = isinstance(result, NetnsOpError)
            if lost:
                why = result.reason if isinstance(result, NetnsOpError) else ""
                message = (
                    f"device {m.device}: pod {pod} ended while no driver was connected; its NIC ({m.host_ifname}) "
                    f"was not found again (a virtual NIC dies with the pod's namespace): {why}"
                )
            else:
                message = (
                    f"device {m.device}: pod {pod} ended while no driver was connected; its NIC came back to the "
                    f"host by itself, was found by its identity and restored as {m.host_ifname}"
                )
            try:
                self.status.nic_returned_unattended(held.pod_uid, claim, m.device, message, lost=lost)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": held.pod_uid}})

    def _adopt(self, pod: api.PodSandbox) -> None:
        """Record the NICs of a pod without state found in its netns (``pods.json`` was lost)."""
        netns, netdevs = pod_netns_path(pod), self._netdevs(pod.uid)
        if not netns or not netdevs:
            return
        state = adopt(self.host, pod.uid, netns, netdevs, sandbox_id=pod.id, namespace=pod.namespace, name=pod.name)
        if state is not None:
            self.store.update(lambda s: s.pods.setdefault(state.pod_uid, state))
            self.pins.pin(pod.uid, netns)  # held like any pod with NICs

    def shutdown(self) -> None:
        """The runtime is going away; NIC state stays in the checkpoint."""
        log.info("NRI shutdown received")


def _netns_alive(path: str) -> bool:
    """Whether ``path`` is a network namespace (a stopped sandbox's is unmounted, then removed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return is_netns_fd(fd)
    finally:
        os.close(fd)


def _netdevs_of(state: DriverState, pod_uid: str) -> list[Netdev]:
    """The pod's prepared devices that have a netdev (the ones that move), with their claims."""
    return [(c, d) for c in state.claims_for_pod(pod_uid) for d in c.devices if d.snapshot.host.ifname]


def _pod_link(device: PreparedDevice, host: LinkState) -> PodLinkConfig:
    """The NIC's name, MTU and MAC in the pod (the settings plan the rest)."""
    iface = device.config.interface
    if iface is None:
        return PodLinkConfig(ifname=host.ifname)
    return PodLinkConfig(ifname=iface.name or host.ifname, mtu=iface.mtu, mac=iface.hardware_addr)


def _moved_device(nic: Nic) -> MovedDevice:
    """The write-ahead record of one NIC about to move: how to find it and what undoes the pod's settings."""
    snapshot = nic.device.snapshot.host
    return MovedDevice(
        device=nic.name,
        host_ifname=nic.host.ifname,
        pod_ifname=nic.pod.ifname,
        permanent_mac=snapshot.permanent_mac or nic.host.permanent_mac,
        pci_address=snapshot.pci_address or nic.host.pci_address,
        host_mtu=nic.host.mtu,
        host_mac=nic.host.mac,
        pod_mac=nic.pod.mac or nic.host.mac,
        step=MOVING,
        host_index=nic.host.index,
        pod_index=nic.pod_index,
        identity=(nic.host.identity or LinkIdentity()).to_dict(),
        records=dict(nic.records),
    )


def _nic(claim: PreparedClaim, device: PreparedDevice, host: LinkState, lease: str | None = None) -> Nic:
    """The plan of one NIC; a sub-interface is planned against none of the NIC's host state (its
    addresses, routes and rules stay with the NIC on the host): what it keeps when its claim sets
    no address is its ``lease`` from the NIC's pool, as a moved NIC keeps its host addresses."""
    if not device.sub_interface:
        return Nic(claim, device, host, _pod_link(device, host))
    parent = LinkState(ifname=host.ifname, mtu=host.mtu, mac="", addresses=[lease] if lease else [])
    nic = Nic(claim, device, parent, _pod_link(device, parent))
    kind = sub_interface_kind(device.config)
    nic.records[SUB_INTERFACE] = {"kind": kind, "parent": host.ifname, "parentIndex": host.index}
    if lease:
        nic.records[SUB_INTERFACE][sub_interfaces.LEASE] = lease
    return nic


MIN_MTU = 68  # include/linux/if_ether.h ETH_MIN_MTU: what a macvlan or ipvlan takes at least


def _share_macs(state: DriverState, pod_uid: str) -> dict[str, dict[str, str]]:
    """NIC name -> MAC -> the pod holding a share of it with that MAC (other pods than ``pod_uid``)."""
    out: dict[str, dict[str, str]] = {}
    for uid, pod in state.pods.items():
        for m in pod.devices:
            sub = m.records.get(SUB_INTERFACE)
            if uid != pod_uid and sub and m.pod_mac:
                out.setdefault(str(sub.get("parent")), {})[m.pod_mac.lower()] = f"{pod.namespace}/{pod.name}"
    return out


def _share_limits(nic: Nic, parent: LinkState, taken: Mapping[str, str]) -> None:
    """Refuse a share its NIC cannot carry, naming the field: an MTU above the NIC's (or below the
    least any link takes), a MAC for an ipvlan (it has its NIC's), or a macvlan MAC that is its NIC's
    or another share's (the kernel would refuse it only at link-up, EADDRINUSE)."""
    kind = nic.records[SUB_INTERFACE]["kind"]
    mtu, mac = nic.pod.mtu, nic.pod.mac
    if mtu is not None and parent.mtu and mtu > parent.mtu:
        why = f"interface.mtu: {mtu} is above the MTU {parent.mtu} of {parent.ifname}, the NIC this {kind} shares"
        raise SettingRefused(nic.name, "mtu", why)
    if mtu is not None and mtu < MIN_MTU:
        raise SettingRefused(nic.name, "mtu", f"interface.mtu: {mtu} is below the least MTU a link takes ({MIN_MTU})")
    if mac is None:
        return
    if kind != sub_interfaces.MACVLAN:
        why = f"interface.hardwareAddr: an {kind} has the MAC of its NIC; a macvlan share can have its own"
        raise SettingRefused(nic.name, "mac", why)
    if parent.mac and mac.lower() == parent.mac.lower():
        why = f"interface.hardwareAddr: {mac} is the MAC of {parent.ifname}, the NIC this {kind} shares"
        raise SettingRefused(nic.name, "mac", why)
    if mac.lower() in taken:
        why = f"interface.hardwareAddr: {mac} is the MAC of another share of {parent.ifname} (pod {taken[mac.lower()]})"
        raise SettingRefused(nic.name, "mac", why)


def _addressed(device: PreparedDevice) -> bool:
    """Whether the claim gives the NIC its addresses (``interface.addresses`` or ``dhcp``)."""
    iface = device.config.interface
    return bool(iface and (iface.addresses or iface.dhcp))


def _for(setting: NicSetting, nics: Sequence[Nic]) -> list[Nic]:
    """The NICs ``setting`` works on: sub-interfaces only when it handles them."""
    return [nic for nic in nics if setting.sub_interfaces or not nic.sub_interface]


def _pod_indexes(host: HostNetns, pod: PodNetns, nics: Sequence[Nic], links: Mapping[int, str]) -> list[int]:
    """Each NIC's ifindex in the pod (``links``: the pod's, index -> name), distinct: a moved NIC
    keeps its host one when free there (a kernel before 5.17 cannot give it another: then a taken
    one refuses the pod); a sub-interface gets one free in the pod *and* on the host, because
    kernels before the 2025 rtnetlink change (6.1 among them) look the index of a link created into
    another namespace up in the namespace the request comes from, where its parent is (EEXIST)."""
    taken = set(links)
    if not host.kernel.has(MOVE_IFINDEX):
        for nic in nics:
            if not nic.sub_interface and nic.host.index in taken:
                reason = (
                    f"kernel {host.kernel.release} cannot give a NIC another ifindex in a pod (IFLA_NEW_IFINDEX, "
                    f"Linux 5.17): it keeps {nic.host.index}, which the pod's {links[nic.host.index]} has"
                )
                raise SettingRefused(nic.name, "move", reason)
    indexes = free_indexes(pod.rtnl, [0 if nic.sub_interface else nic.host.index or 0 for nic in nics], taken)
    subs = [i for i, nic in enumerate(nics) if nic.sub_interface]
    if subs:
        others = taken | {index for i, index in enumerate(indexes) if i not in subs}
        picked = free_indexes(pod.rtnl, [indexes[i] for i in subs], others, also=host.rtnl())
        for i, index in zip(subs, picked, strict=True):
            indexes[i] = index
    return indexes


def _create(nic: Nic, ns_fd: int) -> Request:
    """The request that makes a share's sub-interface in the pod, at its planned ifindex."""
    sub = nic.records[SUB_INTERFACE]
    return newsub(
        nic.name, sub["parentIndex"], nic.pod.ifname, nic.pod_index, ns_fd, sub["kind"], nic.pod.mtu, nic.pod.mac
    )


def _delete_subs(pod: PodNetns, subs: list[MovedDevice]) -> dict[str, str | NetnsOpError]:
    """Delete the pod's sub-interfaces still there; a namespace that is gone took them with it."""
    if not subs:
        return {}
    try:
        rtnl = pod.rtnl
    except NetnsGone:
        return dict.fromkeys((m.device for m in subs), "gone with the pod's namespace")
    items = [
        (m.device, m.pod_index or 0, m.pod_ifname, m.records[SUB_INTERFACE]["kind"], m.pod_mac or None) for m in subs
    ]
    return delete_subs(rtnl, items)


def _check_in_pod(moves: list[Move], nics: Sequence[Nic], found: list[LinkInfo | None]) -> dict[str, LinkInfo]:
    """Each NIC as the pod sees it (``found``, at the moves' pod ifindexes; :func:`check_moved`: a moved
    NIC by its identity), a sub-interface of the kind it was made as; sets ``nic.link``."""
    identities = {nic.name: nic.host.identity or LinkIdentity() for nic in nics if not nic.sub_interface}
    links = check_moved(moves, identities, found)
    for nic in nics:
        nic.link = links[nic.name]
        if nic.sub_interface and nic.link.kind != nic.records[SUB_INTERFACE]["kind"]:
            raise NetnsOpError(nic.name, "verify", f"{nic.link.ifname} in the pod is not the sub-interface")
    return links


def _in_pod_state(state: PodNetState, nics: Sequence[Nic], links: dict[str, LinkInfo]) -> PodNetState:
    """The pod's state once its NICs are configured: each ``in-pod`` with the records the pod side added."""
    by_name = {nic.name: nic for nic in nics}
    devices = []
    for m in state.devices:
        records = dict(by_name[m.device].records)
        link = links[m.device]
        devices.append(
            replace(
                m,
                step=IN_POD,
                records=records,
                # The pod's view of a veth's peer, now that it is in the pod: a link the pod makes
                # itself cannot have its peer outside the pod.
                identity=LinkIdentity.of(link, in_pod=True).to_dict(),
                # A sub-interface's MAC (the kernel's when the claim set none) finds it again.
                pod_mac=link.mac if SUB_INTERFACE in records else m.pod_mac,
            )
        )
    return replace(state, devices=devices)


def _device_result(nic: Nic, result: PodLinkResult) -> DeviceResult:
    """What the claim's status says of a NIC in the pod: its name, addresses, MAC, for a
    sub-interface its kind and the NIC it hangs from, why its RDMA device stayed out, and its MTU
    as the pod has it (the link read back after the move set it: a claim that sets none keeps
    the NIC's, which need not be the one published at the last scan)."""
    sub = nic.records.get(SUB_INTERFACE) or {}
    no_rdma = rdma.stays_home(nic.records.get(rdma.RdmaDevice.name))
    mtu = nic.link.mtu if nic.link is not None else None
    return DeviceResult(
        nic.name, result.ifname, result.addresses, result.mac, sub.get("parent"), sub.get("kind"), no_rdma, mtu
    )


def _without_stay_home_rdma(devices: Sequence[PreparedDevice], moved: Sequence[MovedDevice]) -> list[PreparedDevice]:
    """``devices`` as a container sees them: a NIC whose RDMA device could not come into the pod
    (a soft one the move destroyed) has no RDMA device there, so no char devices and no HCA."""
    out = list(devices)
    stayed = {m.device for m in moved if rdma.stays_home(m.records.get(rdma.RdmaDevice.name))}
    for i, d in enumerate(out):
        if d.device in stayed and d.snapshot.host.rdma_device:
            host = replace(d.snapshot.host, rdma_device=None, char_devices=[])
            out[i] = replace(d, snapshot=replace(d.snapshot, host=host))
    return out


def _sub_interface_addresses(devices: Sequence[PreparedDevice], moved: Sequence[MovedDevice]) -> dict[str, list[str]]:
    """Each sub-interface's addresses in the pod: its claim's, else its lease from the NIC's pool."""
    leases = {m.device: (m.records.get(SUB_INTERFACE) or {}).get(sub_interfaces.LEASE) for m in moved}
    out: dict[str, list[str]] = {}
    for d in devices:
        if not d.sub_interface:
            continue
        iface = d.config.interface
        lease = leases.get(d.device)
        out[d.device] = list(iface.addresses) if iface and iface.addresses else ([lease] if lease else [])
    return out
