"""The NRI hooks: move a pod's NICs in at RunPodSandbox, back at Stop/Remove, reconcile at Synchronize.

Write-ahead: before the first netlink call of a hook, the pod's
:class:`~driver.checkpoint.PodNetState` is persisted with every NIC in step
``moving`` (or ``returning``) together with everything needed to restore it on
the host. A driver killed at any point therefore finds, on restart, each NIC that
may have left the host and puts it back (Synchronize). One checkpoint write before
and one after the netlink work keep the fsync cost off the per-NIC path.

Fault injection (tests only): ``DRANET_FAULT_AFTER=<step>`` makes the process
``os._exit(137)`` right after that step; :data:`RUN_STEPS` and :data:`STOP_STEPS`
list them (``{i}`` is the NIC's position in the pod).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint import (
    CheckpointStore,
    DriverState,
    MovedDevice,
    PodNetState,
    PreparedClaim,
    PreparedDevice,
)
from driver.claims.container_settings import settings_for_container
from driver.config import HOST_NETNS
from driver.netlink import nic_moves, rdma_netns
from driver.netlink.namespaces import Namespaces, NetnsGone, is_netns_fd
from driver.netlink.nic_moves import LinkState
from driver.netlink.own_changes import OwnChanges
from driver.netlink.pod_rules import Neighbor, Rule
from driver.netlink.rdma_netns import RdmaMoveError
from driver.netlink.rtnl import NetnsOpError, Route
from driver.netlink_channel import NetlinkChannel
from driver.nri.adoption import adopt
from driver.nri.container_adjustment import container_adjustment
from driver.nri.hook_reports import HookReports, StatusSink
from driver.nri.pod_config import pod_link_config
from driver.nri.pod_ethtool import EthtoolPlanError, PodEthtool
from driver.nri.pod_extras import ExtrasPlanError, PodExtras

log = logging.getLogger(__name__)

FAULT_ENV = "DRANET_FAULT_AFTER"
RUN_STEPS = ["run:planned", "run:moved-{i}", "run:ethtool", "run:configured", "run:committed"]
STOP_STEPS = ["stop:planned", "stop:returned-{i}", "stop:committed"]
IN_POD = "in-pod"
MOVING = "moving"
RETURNING = "returning"
RETURNED = "returned"


class HookError(Exception):
    """A hook failed; the message names the pod, the device and the step."""


def pod_netns_path(pod: api.PodSandbox) -> str:
    """The pod's network namespace path, or "" for a hostNetwork pod."""
    for ns in pod.linux.namespaces:
        if ns.type == "network":
            return ns.path
    return ""


def _link_state(moved: MovedDevice) -> LinkState:
    return LinkState(
        ifname=moved.host_ifname,
        mtu=moved.host_mtu or 0,
        mac=moved.host_mac or "",
        addresses=list(moved.host_addresses),
        routes=[Route.from_dict(r) for r in moved.host_routes],
        rules=[Rule.from_dict(r) for r in moved.host_rules],
        neighbors=[Neighbor.from_dict(n) for n in moved.host_neighbors],
        permanent_mac=moved.permanent_mac,
        pci_address=moved.pci_address,
    )


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
        self.store = store
        # Exclusive RDMA netns mode: RDMA devices move with their netdev (detected at daemon start).
        self.rdma_exclusive = rdma_exclusive
        # Announces each hook and the host links it changes, so their link events cost no
        # scan and background work steps aside while the hook runs (daemon: shared with them).
        self.own = own_changes or OwnChanges()
        self.sysfs_root = sysfs_root
        self.fault_after = fault_after if fault_after is not None else os.environ.get(FAULT_ENV)
        self.ns = Namespaces(host_netns)
        self._marks: list[tuple[str, float]] = []  # (step, time) of the running hook
        self.ethtool = PodEthtool(self.ns)
        self.extras = PodExtras(self.ns)
        self.reports = HookReports(status)
        # pod UID -> an open fd of the pod's network namespace while it holds our NICs. The fd
        # keeps the namespace (and the NICs in it) alive after the runtime unmounts it, so NICs
        # can still be given back when no StopPodSandbox reaches us: containerd (up to 2.3 at
        # least) forgets its pods' NRI state on restart and then never relays Stop/Remove for
        # pods created before it (containerd#8426); a destroyed namespace destroys a veth and
        # drops a physical NIC on the host unconfigured. `claim_unprepared` returns them.
        self._pins: dict[str, int] = {}
        self._lock = threading.RLock()

    # -- fault injection and phase times --------------------------------------------------
    def _step(self, name: str) -> None:
        self._marks.append((name, time.perf_counter()))
        if self.fault_after and self.fault_after == name:
            log.warning("fault injection: exiting", extra={"kv": {"after": name}})
            os._exit(137)

    def _netdevs(self, pod_uid: str) -> list[tuple[PreparedClaim, PreparedDevice]]:
        claims = self.store.read(lambda s: s.claims_for_pod(pod_uid))
        return [(c, d) for c in claims for d in c.devices if d.snapshot.host.ifname]

    # -- netns pins -------------------------------------------------------------------------
    def _pin(self, pod_uid: str, netns: str) -> None:
        """Hold the pod's network namespace open (idempotent; a gone namespace is not pinned)."""
        if pod_uid in self._pins or not netns:
            return
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        if is_netns_fd(fd):
            self._pins[pod_uid] = fd
        else:
            os.close(fd)

    def _pod_state(self, pod_uid: str) -> PodNetState | None:
        return self.store.read(lambda s: s.pods.get(pod_uid))

    def _unpin(self, pod_uid: str) -> None:
        fd = self._pins.pop(pod_uid, None)
        if fd is not None:
            os.close(fd)

    def _pinned_path(self, pod_uid: str, netns: str) -> str:
        """The pinned namespace (as a /proc/self/fd path) when we hold one, else ``netns``."""
        fd = self._pins.get(pod_uid)
        return f"/proc/self/fd/{fd}" if fd is not None else netns

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """The kubelet unprepared ``claim``: its pods are gone, so give back NICs still out.

        Normally StopPodSandbox returned them already (nothing to do). Without it (see
        ``_pins``), they are still in the pod's pinned namespace.
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

    # -- RunPodSandbox ----------------------------------------------------------------------
    @contextlib.contextmanager
    def _hook(self, name: str, pod: api.PodSandbox) -> Iterator[None]:
        """One hook: announced to :class:`OwnChanges`; its steps' times logged at debug level."""
        self._marks = [("start", time.perf_counter())]
        with self.own.hook():
            try:
                yield
            finally:
                if log.isEnabledFor(logging.DEBUG) and len(self._marks) > 1:
                    marks = [*self._marks, ("end", time.perf_counter())]
                    ms = {b[0]: round((b[1] - a[1]) * 1e3, 3) for a, b in itertools.pairwise(marks)}
                    log.debug("hook steps", extra={"kv": {"hook": name, "pod": pod.uid, "ms": ms}})

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Move and configure every prepared netdev of the pod; all or nothing."""
        with self._lock, self._hook("RunPodSandbox", pod):
            self._run_pod_sandbox(pod)

    def _run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        netdevs = self._netdevs(pod.uid)
        if not netdevs:
            return
        existing = self.store.read(lambda s: s.pods.get(pod.uid))
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

    def _attach(self, pod: api.PodSandbox, netns: str, netdevs: list[tuple[PreparedClaim, PreparedDevice]]) -> None:
        host = self.ns.host_rtnl()
        ifnames = [d.snapshot.host.ifname or "" for _, d in netdevs]  # _netdevs: all have one
        self.own.expect(names=ifnames)
        try:
            states = nic_moves.record_host(self.ns, ifnames, self.sysfs_root)
        except KeyError as exc:
            self.reports.failed(pod, netdevs, netdevs[0][1].device, "record", str(exc))
            raise HookError(f"pod {pod.namespace}/{pod.name}: record failed: {exc}") from exc
        self.own.expect(indexes=[st.index for st in states.values()])
        self._marks.append(("run:recorded", time.perf_counter()))
        configs = {d.device: pod_link_config(d, states[name]) for (_, d), name in zip(netdevs, ifnames, strict=True)}
        try:
            plans = self.ethtool.plans(
                (d.device, name, d.config.ethtool) for (_, d), name in zip(netdevs, ifnames, strict=True)
            )
            nics = [(d, states[name]) for (_, d), name in zip(netdevs, ifnames, strict=True)]
            extras = self.extras.plan(nics)
        except (EthtoolPlanError, ExtrasPlanError) as exc:
            step = exc.step if isinstance(exc, ExtrasPlanError) else "ethtool"
            msg = f"pod {pod.namespace}/{pod.name}: device {exc.device}: {step} failed: {exc.reason}"
            self.reports.failed(pod, netdevs, exc.device, step, msg)
            raise HookError(msg) from exc
        moved = []
        for (_, d), name in zip(netdevs, ifnames, strict=True):
            st, cfg = states[name], configs[d.device]
            moved.append(
                MovedDevice(
                    device=d.device,
                    host_ifname=st.ifname,
                    pod_ifname=cfg.ifname,
                    permanent_mac=d.snapshot.host.permanent_mac or st.permanent_mac,
                    pci_address=d.snapshot.host.pci_address or st.pci_address,
                    host_mtu=st.mtu,
                    host_mac=st.mac,
                    host_addresses=st.addresses,
                    host_routes=[r.to_dict() for r in st.routes],
                    host_rules=[r.to_dict() for r in st.rules],
                    host_neighbors=[n.to_dict() for n in st.neighbors],
                    rdma_device=d.snapshot.host.rdma_device,
                    pod_mac=cfg.mac or st.mac,
                    step=MOVING,
                    host_features=dict(plans[d.device].original_features) if d.device in plans else {},
                    host_private_flags=dict(plans[d.device].original_private_flags) if d.device in plans else {},
                    host_offload_sizes=extras[d.device].offload_sizes if d.device in extras else {},
                    host_sysctls=extras[d.device].sysctls if d.device in extras else {},
                    vrf=d.config.interface.vrf.name if d.config.interface and d.config.interface.vrf else None,
                    ebpf_detached=list(extras[d.device].removed_by_move) if d.device in extras else [],
                )
            )
        state = PodNetState(
            pod_uid=pod.uid, sandbox_id=pod.id, namespace=pod.namespace, name=pod.name, netns_path=netns, devices=moved
        )

        def plan(s: DriverState) -> None:
            s.pods[pod.uid] = state

        self.store.update(plan)  # write-ahead: from here every NIC may be in the pod
        self._step("run:planned")
        device, step = "", "move"
        try:
            with self.ns.pod(netns) as (pod_rtnl, pod_fd):
                # All moves in one pipelined send (the kernel still does them one by one); the
                # write-ahead state above already covers every NIC.
                nic_moves.move_links(
                    host,
                    [
                        nic_moves.Move(
                            m.device,
                            states[m.host_ifname].index or 0,
                            configs[m.device].ifname,
                            configs[m.device].mtu,
                            configs[m.device].mac,
                            self.extras.move_attrs(d),
                        )
                        for m, (_, d) in zip(moved, netdevs, strict=True)
                    ],
                    pod_fd,
                )
                for i in range(len(moved)):
                    self._step(f"run:moved-{i}")
                step = "rdma move"
                for m in moved if self.rdma_exclusive else ():
                    if m.rdma_device:
                        device = m.device
                        self._move_rdma(m, self.ns.host_fd, pod_fd)
                step = "ethtool"
                self.ethtool.apply_in_pod(pod_fd, {dev: (configs[dev].ifname, p) for dev, p in plans.items()})
                self._step("run:ethtool")
                step = "configure"
                detached = self.extras.in_pod(pod_rtnl, pod_fd, nics, configs) if extras else {}
                results = nic_moves.configure_pod_links(pod_rtnl, configs)
                if extras:
                    self.extras.after_configure(pod_fd, [(d, configs[d.device].ifname) for d, _ in nics])
                self._step("run:configured")
        except (NetnsOpError, NetnsGone, OSError) as exc:
            if isinstance(exc, NetnsOpError):
                device, step, reason = exc.device, exc.step, exc.reason
            else:
                reason = f"pod network namespace {netns} is unusable: {exc}"
            rollback = self._return_all(pod.uid, netns)
            msg = f"pod {pod.namespace}/{pod.name}: device {device}: {step} failed: {reason}"
            if rollback:
                msg += f"; rollback: {rollback}"
            self.reports.failed(pod, netdevs, device, step, msg)
            raise HookError(msg) from exc

        def commit(s: DriverState) -> None:
            for m in s.pods[pod.uid].devices:
                m.step = IN_POD
                m.ebpf_detached = m.ebpf_detached + detached.get(m.device, [])

        self.store.update(commit)
        self._pin(pod.uid, netns)
        self._step("run:committed")
        self.reports.ready(pod, netdevs, results)

    # -- Stop / Remove ----------------------------------------------------------------------
    def _return_all(self, pod_uid: str, netns: str = "") -> str:
        """Return every NIC of the pod to the host; idempotent. Returns "" or the errors."""
        state = self.store.read(lambda s: s.pods.get(pod_uid))
        if state is None:
            return ""
        self.own.expect(names=[m.host_ifname for m in state.devices if m.step != RETURNED])

        def plan(s: DriverState) -> None:
            for m in s.pods[pod_uid].devices:
                if m.step != RETURNED:
                    m.step = RETURNING

        self.store.update(plan)
        self._step("stop:planned")
        netns = self._pinned_path(pod_uid, netns or state.netns_path)
        pending = [m for m in state.devices if m.step != RETURNED]
        for m in pending:
            if self.rdma_exclusive and m.rdma_device:  # RDMA devices first, as the Go driver (#180)
                self._return_rdma(m, netns)
        self.extras.before_return(netns, pending)  # out of their VRFs (only NICs that have one)
        items = [
            # The MAC it has in the pod: how to recognise it there (or renamed on the host).
            nic_moves.ReturnItem(
                m.device, m.pod_ifname, _link_state(m), (m.pod_mac,) if m.pod_mac and m.pod_mac != m.host_mac else ()
            )
            for m in pending
        ]
        # Coming home, a NIC shows up in the host under its pod name before the rename.
        self.own.expect(names=[m.pod_ifname for m in pending])
        results = nic_moves.return_links(
            self.ns, netns, items, self.sysfs_root, announce=lambda indexes: self.own.expect(indexes=indexes)
        )
        self._marks.append(("stop:moved-and-restored", time.perf_counter()))
        errors, done = [], []
        returned: dict[str, str] = {}
        for i, m in enumerate(state.devices):
            if m.step == RETURNED:
                continue
            result = results[m.device]
            try:
                if isinstance(result, NetnsOpError):
                    raise result
                done.append(m.device)
                if m.host_features or m.host_private_flags:
                    # After the return, on the host: also right when the pod netns is gone.
                    self.ethtool.restore_on_host(m.device, m.host_ifname, m.host_features, m.host_private_flags)
                self.extras.restore_on_host(m)
                returned[m.device] = f"{m.host_ifname} (found in {result})"
            except (NetnsOpError, OSError) as exc:
                errors.append(str(exc))
                if isinstance(exc, NetnsOpError) and exc.step == "find":
                    # Nowhere to be found: a virtual NIC (veth, ...) destroyed with its netns.
                    # Retrying forever cannot bring it back; forget it (loudly).
                    done.append(m.device)
                log.error("NIC return failed", extra={"kv": {"pod": pod_uid, "device": m.device, "error": str(exc)}})
            self._step(f"stop:returned-{i}")
        if returned:
            log.info("NICs returned", extra={"kv": {"pod": pod_uid, "devices": returned}})

        def commit(s: DriverState) -> None:
            pod = s.pods.get(pod_uid)
            if pod is None:
                return
            for m in pod.devices:
                if m.device in done:
                    m.step = RETURNED
            if all(m.step == RETURNED for m in pod.devices):
                del s.pods[pod_uid]

        self.store.update(commit)
        if self.store.read(lambda s: s.pods.get(pod_uid)) is None:
            self._unpin(pod_uid)
        self._step("stop:committed")
        return "; ".join(errors)

    def _move_rdma(self, m: MovedDevice, from_fd: int, to_fd: int) -> None:
        """Move ``m``'s RDMA device between namespaces; :class:`NetnsOpError` naming the device if it cannot."""
        try:
            channel = NetlinkChannel(self.ns.socket_in(from_fd, rdma_netns.NETLINK_RDMA))
        except OSError as exc:  # no RDMA netlink: the device cannot follow its netdev, refuse the pod
            raise NetnsOpError(m.device, "rdma move", f"RDMA device {m.rdma_device}: no RDMA netlink: {exc}") from exc
        try:
            rdma_netns.move(channel, m.rdma_device or "", to_fd)
        except (RdmaMoveError, OSError) as exc:
            raise NetnsOpError(m.device, "rdma move", f"{exc} (exclusive RDMA netns mode)") from exc
        finally:
            channel.close()

    def _return_rdma(self, m: MovedDevice, netns: str) -> None:
        """Bring ``m``'s RDMA device back to the host, best effort; a gone pod netns returned it already (kernel)."""
        try:
            fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC) if netns else -1
        except OSError:
            return
        if fd < 0:
            return
        try:
            self._move_rdma(m, fd, self.ns.host_fd)
        except NetnsOpError as exc:
            # Never keep the netdev hostage: an RDMA device left behind returns to the host when
            # the pod's namespace is destroyed (kernel); "not in the source namespace" = never moved.
            log.warning("RDMA device not returned", extra={"kv": {"device": m.device, "error": exc.reason}})
        finally:
            os.close(fd)

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Return every NIC of the pod (original name, MTU, MAC, addresses, routes)."""
        with self._lock, self._hook("StopPodSandbox", pod):
            errors = self._return_all(pod.uid, pod_netns_path(pod))
        if errors:
            raise HookError(f"pod {pod.namespace}/{pod.name}: {errors}")

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Same as stop (idempotent): the last chance to get NICs back."""
        self.stop_pod_sandbox(pod)

    # -- CreateContainer --------------------------------------------------------------------
    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        """RDMA char devices, NCCL HCA env and the NUMA cpuset of the pod's claims."""
        with self.own.hook():
            return self._create_container(pod, container)

    def _create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        claims = self.store.read(lambda s: s.claims_for_pod(pod.uid))
        devices = [d for c in claims for d in c.devices]
        if not devices:
            return None
        # Narrow, never widen, the cpuset the kubelet chose (CPU manager exclusive CPUs).
        requested = container.linux.resources.cpu.cpus if container.HasField("linux") else ""
        settings = settings_for_container(devices, self.sysfs_root, requested or None)
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
        with self._lock, self.own.hook():
            self._synchronize(pods)

    def _synchronize(self, pods: Sequence[api.PodSandbox]) -> None:
        self.ns.host_rtnl()  # warm up the socket here, not in the first RunPodSandbox
        alive = {p.uid: p for p in pods}
        known = self.store.read(lambda s: {uid: [m.step for m in p.devices] for uid, p in s.pods.items()})
        for uid, steps in known.items():
            pod = alive.get(uid)
            if pod is not None and steps and all(s == IN_POD for s in steps):
                # Held NICs of a live pod: pin its namespace again (a restarted driver).
                state = self._pod_state(uid)
                self._pin(uid, state.netns_path if state is not None else "")
                continue
            why = "gone" if pod is None else "interrupted"
            errors = self._return_all(uid, pod_netns_path(pod) if pod is not None else "")
            log.info("synchronize: returned NICs", extra={"kv": {"pod": uid, "why": why, "errors": errors}})
        for pod in pods:
            if pod.uid not in known:
                self._adopt(pod)

    def _adopt(self, pod: api.PodSandbox) -> None:
        """Record the NICs of a pod without state found in its netns (``pods.json`` was lost)."""
        netns, netdevs = pod_netns_path(pod), self._netdevs(pod.uid)
        if not netns or not netdevs:
            return
        state = adopt(self.ns, pod.uid, netns, netdevs, sandbox_id=pod.id, namespace=pod.namespace, name=pod.name)
        if state is not None:
            self.store.update(lambda s: s.pods.setdefault(state.pod_uid, state))
            self._pin(pod.uid, netns)  # held like any pod with NICs

    def shutdown(self) -> None:
        """The runtime is going away; NIC state stays in the checkpoint."""
        log.info("NRI shutdown received")
