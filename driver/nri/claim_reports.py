"""What the hooks tell about a pod's NICs: the claims' status (through a sink) and the runtime's error.

Each RunPodSandbox's outcome goes to the :class:`StatusSink` once per claim (every NIC configured,
or the device and step that failed, everything rolled back); so do what a pod met later: an IPv6
address found in use on its link, its containers created before its NICs came, its NICs back from
a pod that ended while no driver was connected. A sink that raises never fails the hook. The
runtime gets :class:`HookError`, whose message names the pod, the device and the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PodNetState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.status_entries import DeviceResult
from driver.netlink.nic_moves import PodLinkResult
from driver.netlink.rtnl import NetnsOpError
from driver.nic_settings import rdma
from driver.nic_settings.setting import Nic
from driver.nri.pod_plan import Netdev
from driver.nri.shares import SUB_INTERFACE

log = logging.getLogger(__name__)


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


class ClaimReports:
    """The hooks' reports to ``sink`` (None: logged only); ``on_problem`` counts what a pod met that
    its claim's status reports (the problems' metric), by reason."""

    def __init__(
        self,
        store: CheckpointStore,
        sink: StatusSink | None = None,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.sink = sink
        self.on_problem = on_problem or (lambda _reason: None)

    def ready(self, pod: api.PodSandbox, nics: Sequence[Nic]) -> None:
        """Every NIC of the pod is configured: one report per claim."""
        if self.sink is None:
            return
        for claim in {nic.claim.uid: nic.claim for nic in nics}.values():
            out = [
                device_result(nic, nic.result) for nic in nics if nic.claim.uid == claim.uid and nic.result is not None
            ]
            try:
                self.sink.pod_network_ready(pod.uid, claim, out)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def vfio_ready(self, pod: api.PodSandbox, devices: Sequence[Netdev]) -> None:
        """The pod's VFs on vfio-pci (bound at prepare, nothing to attach): one report per claim, with
        the MAC its PF gives each (``sriov.mac``)."""
        if self.sink is None:
            return
        for claim in {c.uid: c for c, _ in devices}.values():
            out = []
            for c, d in devices:
                if c.uid != claim.uid:
                    continue
                group = d.snapshot.attributes.get("dra.net/iommuGroup")
                where = f"{d.snapshot.host.pci_address} (/dev/vfio/{group})"
                out.append(DeviceResult(d.device, "", hardware_address=d.config.pod_mac, vfio=where))
            try:
                self.sink.pod_network_ready(pod.uid, claim, out)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def failed(self, pod: api.PodSandbox, netdevs: Sequence[Netdev], device: str, step: str, message: str) -> None:
        """Attaching ``device`` (or, when "", the pod's NICs) failed at ``step``; all was rolled back."""
        log.error(
            "RunPodSandbox failed", extra={"kv": {"pod": pod.uid, "device": device, "step": step, "error": message}}
        )
        if self.sink is None:
            return
        for claim, d in netdevs:
            if d.device == device or not device:
                try:
                    self.sink.pod_network_failed(pod.uid, claim, device, step, message)
                except Exception:
                    log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})
                break

    def pod_problem(self, pod: api.PodSandbox, netdevs: Sequence[Netdev], step: str, message: str) -> None:
        """A problem of the whole pod after its NICs' fate was decided: ``Ready`` False on the first
        NIC of each of its claims (naming ``step``), a Warning event on the pod."""
        log.error("pod network problem", extra={"kv": {"pod": pod.uid, "step": step, "error": message}})
        if self.sink is None:
            return
        for claim in {c.uid: c for c, _ in netdevs}.values():
            first = next(d.device for c, d in netdevs if c.uid == claim.uid)
            try:
                self.sink.pod_network_failed(pod.uid, claim, first, step, message)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod.uid}})

    def unattended(self, held: PodNetState, outcome: Mapping[str, str | NetnsOpError]) -> None:
        """A pod that ended while no driver was connected (no StopPodSandbox reached us, its
        namespace not pinned): say on each claim what became of its NICs. A physical NIC fell back
        into the host when the namespace died and was found by its identity and restored; a
        virtual one (a veth) died with the namespace: a clean, reported loss."""
        if self.sink is None:
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
                self.sink.nic_returned_unattended(held.pod_uid, claim, m.device, message, lost=lost)
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": held.pod_uid}})

    def address_in_use(self, pod_uid: str, device: str, cidr: str, message: str) -> None:
        """(the detection's thread) An IPv6 address of the pod is in use on its link: its claim's
        ``Ready`` False naming it, a Warning event on the pod, counted."""
        del cidr
        self.on_problem("ipv6-address-in-use")
        claims = self.store.read(
            lambda s: [c for c in s.claims_for_pod(pod_uid) if any(d.device == device for d in c.devices)]
        )
        if self.sink is None:
            return
        for claim in claims:
            try:
                self.sink.pod_network_failed(pod_uid, claim, device, "address", f"device {device}: {message}")
            except Exception:
                log.exception("status sink failed", extra={"kv": {"pod": pod_uid}})


def device_result(nic: Nic, result: PodLinkResult) -> DeviceResult:
    """What the claim's status says of a NIC in the pod: its name, addresses, MAC, for a
    sub-interface its kind and the NIC it hangs from, why its RDMA device stayed out (or the soft one
    made for it in the pod), and its MTU
    as the pod has it (the link read back after the move set it: a claim that sets none keeps
    the NIC's, which need not be the one published at the last scan)."""
    sub = nic.records.get(SUB_INTERFACE) or {}
    no_rdma = rdma.stays_home(nic.records.get(rdma.RdmaDevice.name))
    in_pod = rdma.made_in_pod(nic.records.get(rdma.RdmaDevice.name))
    mtu = nic.link.mtu if nic.link is not None else None
    return DeviceResult(
        nic.name, result.ifname, result.addresses, result.mac, sub.get("parent"), sub.get("kind"), no_rdma, mtu, in_pod
    )
