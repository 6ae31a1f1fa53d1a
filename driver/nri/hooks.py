"""The NRI hooks: a pod's NICs in at RunPodSandbox, back at Stop/Remove, reconciled at Synchronize.

:class:`NRIHooks` is what the NRI plugin calls: it decides which pods have NICs of ours and what
each event asks of them, and hands the NIC work on. RunPodSandbox moves and configures a pod's NICs
over a plan per NIC, all or nothing (:mod:`driver.nri.pod_attach`, with the plan in
:mod:`driver.nri.pod_plan` and the shares of shared NICs in :mod:`driver.nri.shares`);
Stop/Remove, every rollback, Synchronize and the kubelet's unprepare give them back as recorded
(:mod:`driver.nri.nic_return`); CreateContainer adds what the pod's claims give each container
(:mod:`driver.nri.container_adjustment`) once the pod's IPv6 addresses may be used
(:mod:`driver.nri.dad_watch`). Synchronize also re-learns NICs whose record was lost
(:mod:`driver.nri.adoption`) and attaches the NICs of pods that started while no driver was
connected. Every outcome is reported on the pod's claims (:mod:`driver.nri.claim_reports`); each
hook's steps are timed, and can be made fatal for the fault suite (:mod:`driver.nri.step_clock`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import IN_POD, PodNetState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.container_settings import settings_for_container
from driver.config import HOST_NETNS, IPNetwork
from driver.netlink.hook_activity import HookActivity
from driver.netlink.kernel_features import KernelFeatures
from driver.netlink.namespaces import Namespaces
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.setting import HostNetns, NicSetting
from driver.nri.adoption import adopt
from driver.nri.claim_reports import ClaimReports, HookError, StatusSink
from driver.nri.container_adjustment import container_adjustment, without_stay_home_rdma
from driver.nri.dad_watch import DadWatch
from driver.nri.nic_return import NicReturn, NodeParts
from driver.nri.pod_attach import PodAttach
from driver.nri.pod_netns import NetnsPins, netns_alive, pod_netns_path
from driver.nri.pod_plan import Netdev, netdevs_of, pod_devices
from driver.nri.shares import PROBE_WAIT, SharePlanner, sub_interface_addresses
from driver.nri.step_clock import StepClock

log = logging.getLogger(__name__)

SYNC_ATTACH_BUDGET_S = 1.0
"""Seconds of a Synchronize that may go to pods that started while no driver was connected (about
0.1 s each): the call has the runtime's 2 s; pods past it are reported instead."""


class NRIHooks:
    """Implements :class:`driver.nri.plugin.NRIHandler` on top of the checkpoint, the NIC moves and
    the NIC settings.

    The NRI plugin calls the hooks from its connection thread; `claim_unprepared` comes from
    the kubelet plugin, so the hooks that move NICs take one lock. ``hook_activity`` announces each
    hook and the host links it changes, so their link events cost no scan and background work
    steps aside while the hook runs (the daemon shares it with them); ``rdma_exclusive``: RDMA
    devices move with their netdev (detected at daemon start); ``rxe_in_pod``: a Soft-RoCE device
    is made again in the pod (the kernel's rxe has network namespaces, probed at start);
    ``status`` gets each RunPodSandbox's outcome per claim (a sink that raises never fails the
    hook); ``on_host_change``: a hook changed the host's devices in a way link events do not tell
    (a soft RDMA device made again);
    ``kernel``: the kernel's features (without ``moveIfindex`` a NIC keeps its ifindex in the pod);
    ``before_containers(pod_uid)``: called before a container of a pod with our devices is adjusted
    (the status sink's queued device metadata is written by then); ``pools``: the shared NICs'
    address pools; ``probe_wait``: seconds an ARP probe of a lease waits (0: no probe);
    ``on_problem``: counts what a pod met that its claim's status reports, by reason.
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
        rxe_in_pod: bool = False,
    ) -> None:
        self.store = store
        self.before_containers = before_containers
        self.host = HostNetns(
            Namespaces(host_netns), sysfs_root, rdma_exclusive, on_host_change, kernel, rxe_in_pod=rxe_in_pod
        )
        self.own = hook_activity or HookActivity()
        self.steps = StepClock(fault_after)
        self.pins = NetnsPins()  # held while a pod has NICs: `claim_unprepared` returns them when no Stop comes
        self.settings = tuple(settings)
        self.reports = ClaimReports(store, status, on_problem)
        # The pods' new IPv6 addresses under duplicate address detection, off the hooks' path.
        self.dad = DadWatch(on_failed=self.reports.address_in_use)
        self.shares = SharePlanner(store, self.host, pools, probe_wait)
        node = NodeParts(store, self.host, self.own, self.steps, self.pins, self.settings, self.dad)
        self.returns = NicReturn(node)
        self.attach = PodAttach(node, self.shares, self.reports, self.returns)
        self._lock = threading.RLock()

    @property
    def status(self) -> StatusSink | None:
        """Where the hooks' outcomes go (None: logged only)."""
        return self.reports.sink

    @status.setter
    def status(self, sink: StatusSink | None) -> None:
        self.reports.sink = sink

    @property
    def on_problem(self) -> Callable[[str], None]:
        """Counts what a pod met that its claim's status reports (the problems' metric): a reason."""
        return self.reports.on_problem

    @on_problem.setter
    def on_problem(self, count: Callable[[str], None]) -> None:
        self.reports.on_problem = count

    @property
    def pools(self) -> dict[str, IPNetwork | None]:
        """Shared NIC name -> its address pool on this node (None: its subnet): the node's
        dra.net/sharing-pools annotation over --sharing-pools."""
        return self.shares.pools

    def set_pools(self, pools: Mapping[str, IPNetwork | None]) -> None:
        """The node's address pools changed (its annotation, watched by the daemon): the next lease
        takes them. Leases held stay their shares' (``address_pool.in_use`` counts each, in any range)."""
        self.shares.pools = dict(pools)  # one rebinding: a lease reads either the old pools or the new

    def close(self) -> None:
        """Close the host's sockets (the pinned namespaces stay: their NICs are still out)."""
        self.dad.close()
        self.host.ns.close()

    def _netdevs(self, pod_uid: str) -> list[Netdev]:
        """The pod's prepared devices that have a netdev (the ones that move)."""
        return self.store.read(lambda s: netdevs_of(s, pod_uid))

    def _pod_state(self, pod_uid: str) -> PodNetState | None:
        """The pod's NIC state in the checkpoint, None when it holds none of ours."""
        return self.store.read(lambda s: s.pods.get(pod_uid))

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """The kubelet unprepared ``claim``: its pods are gone, so give back NICs still out.

        Normally StopPodSandbox returned them already (nothing to do). Without it (see
        :class:`~driver.nri.pod_netns.NetnsPins`), they are still in the pod's pinned namespace.
        """
        with self._lock, self.own.hook():
            for uid in claim.pod_uids:
                if self._pod_state(uid) is None:
                    continue
                errors = self.returns.return_all(uid)
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
            (netdevs, vfio), existing = self.store.read(lambda s: (pod_devices(s, pod.uid), s.pods.get(pod.uid)))
            if vfio:  # on vfio-pci since prepare: nothing to attach, ready as the pod starts
                self.reports.vfio_ready(pod, vfio)
            if not netdevs:
                return
            if existing is not None and existing.devices and all(d.step == IN_POD for d in existing.devices):
                return  # a retried call: already done
            if existing is not None:
                self.returns.return_all(pod.uid)  # leftovers of an interrupted attempt: start clean
            netns = pod_netns_path(pod)
            if not netns:
                raise HookError(
                    f"pod {pod.namespace}/{pod.name}: device {netdevs[0][1].device}: netns "
                    "failed: pod has no network namespace (hostNetwork pods cannot get a NIC)"
                )
            self.attach.attach(pod, netns, netdevs)

    # -- Stop / Remove ----------------------------------------------------------------------
    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Return every NIC of the pod (original name, MTU, MAC, addresses, routes)."""
        with self._lock, self._hook("StopPodSandbox", pod):
            errors = self.returns.return_all(pod.uid, pod_netns_path(pod))
        if errors:
            raise HookError(f"pod {pod.namespace}/{pod.name}: {errors}")

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Same as stop (idempotent): the last chance to get NICs back."""
        self.stop_pod_sandbox(pod)

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
        devices = without_stay_home_rdma(devices, state.devices if state is not None else [])
        addresses = sub_interface_addresses(devices, state.devices if state is not None else [])
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
                errors = self.returns.return_all(uid, pod_netns_path(pod) if pod is not None else "", outcome)
                log.info("synchronize: returned NICs", extra={"kv": {"pod": uid, "why": why, "errors": errors}})
                if held is not None and not self.pins.fds.get(uid):
                    self.reports.unattended(held, outcome)
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
                self.reports.pod_problem(
                    pod, self._netdevs(pod.uid), "late attach", f"pod {pod.namespace}/{pod.name}: {why}"
                )
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
        return bool(netns and self._pod_state(pod.uid) is None and self._netdevs(pod.uid) and netns_alive(netns))

    def _attach_late(self, pod: api.PodSandbox, containers: Sequence[api.Container]) -> None:
        """The NICs of a pod whose RunPodSandbox never reached the driver, now; :class:`HookError`
        as RunPodSandbox's (reported by the attach: ``Ready`` False with the step and the reason)."""
        self.on_problem("started-without-driver")
        log.warning(
            "pod started while the driver was not connected to the runtime: attaching its NICs now",
            extra={"kv": {"pod": pod.uid, "containers": [c.name for c in containers]}},
        )
        self.attach.attach(pod, pod_netns_path(pod), self._netdevs(pod.uid))

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
        self.reports.pod_problem(pod, netdevs, "container setup", message)

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
