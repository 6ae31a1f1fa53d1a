"""The NRI hooks: move a pod's NICs in at RunPodSandbox, back at Stop/Remove, reconcile at Synchronize.

Write-ahead: before the first netlink call of a hook, the pod's
:class:`~driver.checkpoint.state.PodNetState` is persisted with every NIC in step
``moving`` (or ``returning``) together with everything needed to restore it on
the host. A driver killed at any point therefore finds, on restart, each NIC that
may have left the host and puts it back (Synchronize). One checkpoint write before
and one after the netlink work keep the fsync cost off the per-NIC path.

This module decides which hook does what, under one lock; the NICs move in
:mod:`driver.nri.nic_attach` and come back in :mod:`driver.nri.nic_return`, and
:mod:`driver.nri.hook_steps` names the steps faults can be injected after.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.container_settings import settings_for_container
from driver.config import HOST_NETNS
from driver.netlink.namespaces import Namespaces
from driver.netlink.own_changes import OwnChanges
from driver.nri.adoption import adopt
from driver.nri.container_adjustment import container_adjustment
from driver.nri.hook_context import HookContext, HookError, pod_netns_path
from driver.nri.hook_reports import HookReports, StatusSink
from driver.nri.hook_steps import IN_POD, StepClock
from driver.nri.netns_pins import NetnsPins
from driver.nri.nic_attach import attach
from driver.nri.nic_return import return_all
from driver.nri.pod_ethtool import PodEthtool
from driver.nri.pod_extras import PodExtras

log = logging.getLogger(__name__)


class NRIHooks:
    """Implements :class:`driver.nri.plugin.NRIHandler` on top of the checkpoint and nic_moves.

    The NRI plugin calls the hooks from its single worker thread; `claim_unprepared` comes from
    the kubelet plugin, so the hooks that move NICs take one lock.
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
        own_changes: OwnChanges | None = None,
    ) -> None:
        ns = Namespaces(host_netns)
        self.ctx = HookContext(
            store=store,
            ns=ns,
            own=own_changes or OwnChanges(),
            sysfs_root=sysfs_root,
            rdma_exclusive=rdma_exclusive,
            ethtool=PodEthtool(ns),
            extras=PodExtras(ns),
            reports=HookReports(status),
            steps=StepClock(fault_after),
            # Held while a pod has NICs: `claim_unprepared` returns them when no Stop comes.
            pins=NetnsPins(),
        )
        self._lock = threading.RLock()

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """The kubelet unprepared ``claim``: its pods are gone, so give back NICs still out.

        Normally StopPodSandbox returned them already (nothing to do). Without it (see
        :mod:`driver.nri.netns_pins`), they are still in the pod's pinned namespace.
        """
        with self._lock, self.ctx.own.hook():
            for uid in claim.pod_uids:
                if self.ctx.pod_state(uid) is None:
                    continue
                errors = return_all(self.ctx, uid)
                log.warning(
                    "NICs returned at unprepare: the runtime sent no StopPodSandbox",
                    extra={"kv": {"pod": uid, "claim": claim.uid, "errors": errors}},
                )

    @contextlib.contextmanager
    def _hook(self, name: str, pod: api.PodSandbox) -> Iterator[None]:
        """One hook: announced to :class:`OwnChanges`; its steps' times logged at debug level."""
        with self.ctx.steps.timing(name, pod.uid), self.ctx.own.hook():
            yield

    # -- RunPodSandbox ----------------------------------------------------------------------
    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Move and configure every prepared netdev of the pod; all or nothing."""
        with self._lock, self._hook("RunPodSandbox", pod):
            self._run_pod_sandbox(pod)

    def _run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        netdevs = self.ctx.netdevs(pod.uid)
        if not netdevs:
            return
        existing = self.ctx.pod_state(pod.uid)
        if existing is not None and existing.devices and all(d.step == IN_POD for d in existing.devices):
            return  # a retried call: already done
        if existing is not None:
            return_all(self.ctx, pod.uid)  # leftovers of an interrupted attempt: start clean
        netns = pod_netns_path(pod)
        if not netns:
            raise HookError(
                f"pod {pod.namespace}/{pod.name}: device {netdevs[0][1].device}: netns "
                "failed: pod has no network namespace (hostNetwork pods cannot get a NIC)"
            )
        attach(self.ctx, pod, netns, netdevs)

    # -- Stop / Remove ----------------------------------------------------------------------
    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Return every NIC of the pod (original name, MTU, MAC, addresses, routes)."""
        with self._lock, self._hook("StopPodSandbox", pod):
            errors = return_all(self.ctx, pod.uid, pod_netns_path(pod))
        if errors:
            raise HookError(f"pod {pod.namespace}/{pod.name}: {errors}")

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Same as stop (idempotent): the last chance to get NICs back."""
        self.stop_pod_sandbox(pod)

    # -- CreateContainer --------------------------------------------------------------------
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        """RDMA char devices, NCCL HCA env and the NUMA cpuset of the pod's claims."""
        with self.ctx.own.hook():
            return self._create_container(pod, container)

    def _create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        claims = self.ctx.store.read(lambda s: s.claims_for_pod(pod.uid))
        devices = [d for c in claims for d in c.devices]
        if not devices:
            return None
        # Narrow, never widen, the cpuset the kubelet chose (CPU manager exclusive CPUs).
        requested = container.linux.resources.cpu.cpus if container.HasField("linux") else ""
        settings = settings_for_container(devices, self.ctx.sysfs_root, requested or None)
        if settings.skipped_pin:
            log.warning(
                "numa.pin not applied",
                extra={"kv": {"pod": pod.uid, "container": container.name, "reason": settings.skipped_pin}},
            )
        return container_adjustment(devices, settings)

    # -- Synchronize / Shutdown -------------------------------------------------------------
    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        """Reconcile the checkpoint with the runtime's pods after a (re)connect.

        Gone pods: return their NICs. Pods with NICs mid-move: roll back (the hook
        never reported success). Mid-return: finish returning. Pods with claims but
        no state are never attached "late" (the runtime lists stopped-but-not-removed
        sandboxes too, so that could put NICs into a dead pod); but NICs of theirs already
        in their netns (the pod state file was lost) are recorded again (:mod:`driver.nri.adoption`).
        """
        with self._lock, self.ctx.own.hook():
            self._synchronize(pods)

    def _synchronize(self, pods: Sequence[api.PodSandbox]) -> None:
        self.ctx.ns.host_rtnl()  # warm up the socket here, not in the first RunPodSandbox
        alive = {p.uid: p for p in pods}
        known = self.ctx.store.read(lambda s: {uid: [m.step for m in p.devices] for uid, p in s.pods.items()})
        for uid, steps in known.items():
            pod = alive.get(uid)
            if pod is not None and steps and all(s == IN_POD for s in steps):
                # Held NICs of a live pod: pin its namespace again (a restarted driver).
                state = self.ctx.pod_state(uid)
                self.ctx.pins.pin(uid, state.netns_path if state is not None else "")
                continue
            why = "gone" if pod is None else "interrupted"
            errors = return_all(self.ctx, uid, pod_netns_path(pod) if pod is not None else "")
            log.info("synchronize: returned NICs", extra={"kv": {"pod": uid, "why": why, "errors": errors}})
        for pod in pods:
            if pod.uid not in known:
                self._adopt(pod)

    def _adopt(self, pod: api.PodSandbox) -> None:
        """Record the NICs of a pod without state found in its netns (``pods.json`` was lost)."""
        netns, netdevs = pod_netns_path(pod), self.ctx.netdevs(pod.uid)
        if not netns or not netdevs:
            return
        state = adopt(self.ctx.ns, pod.uid, netns, netdevs, sandbox_id=pod.id, namespace=pod.namespace, name=pod.name)
        if state is not None:
            self.ctx.store.update(lambda s: s.pods.setdefault(state.pod_uid, state))
            self.ctx.pins.pin(pod.uid, netns)  # held like any pod with NICs

    def shutdown(self) -> None:
        """The runtime is going away; NIC state stays in the checkpoint."""
        log.info("NRI shutdown received")
