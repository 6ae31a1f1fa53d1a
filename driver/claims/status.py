"""Claim status: our entries in ``status.devices`` of a ResourceClaim, and Warning events.

:class:`ClaimStatusWriter` implements the NRI hooks' ``StatusSink``. The hooks call
:meth:`~ClaimStatusWriter.pod_network_ready` / :meth:`~ClaimStatusWriter.pod_network_failed`
from inside a runtime callback, so those only enqueue; a worker thread does the API work with
bounded retries and drops (with a log) what it cannot deliver.

Each write is a server-side apply on ``resourceclaims/status`` with field manager ``dra.net``
containing *all* our entries for the claim (list-map keys driver, pool, device): with SSA,
an entry we owned and left out would be deleted, and an entry written by another manager (the
GPU driver's) is never in our apply, so it is never touched. Entries: ``networkData``
(interface name in the pod, CIDRs, MAC) and conditions ``Ready`` (True, or False with the failed
step and the reason) and ``NUMAAligned`` (see :mod:`driver.claims.numa_report`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from driver.checkpoint.state import PreparedClaim
from driver.claims import numa_report
from driver.claims.status_entries import MAX_MESSAGE, DeviceResult, StatusUpdate, now_utc, reason_for, status_body
from driver.config import DRIVER_NAME
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError, NotFound

log = logging.getLogger(__name__)

FIELD_MANAGER = DRIVER_NAME

SLICES_FRESH = 10.0
"""Seconds another driver's ResourceSlices of this node, once listed, answer the NUMA report of the
next claims (a pod's claims, a burst of pods) without another LIST, while they name every device
asked about. Their devices' PCI addresses and NUMA nodes do not change while they are published."""


PREPARE_FAILED = "ClaimPrepareFailed"
NIC_LOST = "NICLost"  # a pod ended with no driver connected; its virtual NIC died with the namespace
NIC_RETURNED_UNATTENDED = "NICReturnedUnattended"  # ... its physical NIC fell back, found and restored
DEVICE_REMOVED = "DeviceRemoved"  # a claimed device's PCI function left the node (the health check's reason)
"""Reason of the Warning event on a claim NodePrepareResources refused (the Go driver's)."""


@dataclass(frozen=True)
class ClaimEvent:
    """A Warning event to post on a ResourceClaim (no status write)."""

    namespace: str
    name: str
    uid: str
    reason: str
    message: str


class ClaimReplaced(Exception):
    """The claim was deleted and re-created under the same name: our devices are not in it."""


def _raw_parameters_refused(exc: KubeError) -> bool:
    """The apiserver's 422 for a status write that re-encoded the allocation's raw parameters:
    "field is immutable" up to 1.35; from 1.36 "field cannot be modified once set" (next to a
    refusal to change the allocation without ``resourceclaims/binding``, which we never ask)."""
    return (
        exc.status == 422
        and "status.allocation" in exc.message
        and ("immutable" in exc.message or "cannot be modified once set" in exc.message)
    )


class ClaimStatusWriter:
    """Writes our ``status.devices`` entries and failure events; the NRI hooks' StatusSink.

    ``sysfs_root`` is this node's sysfs (NUMA of the claim's other devices); ``quiet`` (optional)
    blocks until no NRI hook runs. Call :meth:`start` once; :meth:`stop` drains what is queued
    (up to ``timeout``) and stops.
    """

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        *,
        driver_name: str = DRIVER_NAME,
        sysfs_root: str = "/sys",
        max_attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        queue_size: int = 1024,
        sleep: Callable[[float], None] = time.sleep,
        quiet: Callable[[], object] | None = None,
    ) -> None:
        self.kube, self.node_name, self.driver_name, self.sysfs_root = kube, node_name, driver_name, sysfs_root
        # Retries: max_attempts writes per update, the delay doubling from backoff up to max_backoff.
        self.max_attempts, self.backoff, self.max_backoff = max_attempts, backoff, max_backoff
        self._sleep = sleep
        # Blocks while an NRI hook runs: the write (JSON, TLS, HTTP) waits for the hook to finish
        # instead of taking the interpreter lock from it.
        self._quiet = quiet
        self._queue: queue.Queue[StatusUpdate | ClaimEvent | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._numa_cache: dict[str, dict[str, str]] = {}  # claim uid -> condition (allocation is immutable)
        self._clock = time.monotonic
        # driver -> (listed at, this node's slices of that driver, their (pool, device) names)
        self._slices: dict[str, tuple[float, list[dict[str, Any]], set[tuple[str, str]]]] = {}
        self.delivered = 0
        self.dropped = 0

    # -- StatusSink ---------------------------------------------------------------------------

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: Sequence[DeviceResult]) -> None:
        """All of ``claim``'s NICs are configured in the pod: queue Ready=True with networkData."""
        self._enqueue(StatusUpdate(pod_uid, claim, ready={r.device: r for r in results}))

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        """Setting up ``device`` failed at ``step``: queue Ready=False and a Warning event on the pod."""
        self._enqueue(StatusUpdate(pod_uid, claim, failed_device=device, failed_step=step, failed_message=message))

    def device_removed(self, pod_uids: Sequence[str], claim: PreparedClaim, device: str, message: str) -> None:
        """``device`` of ``claim`` is gone from the node: Ready=False (``DeviceRemoved``) and a Warning
        event on each pod it is reserved for and on the claim; with no pod yet, the claim's event only."""
        for pod_uid in pod_uids:
            self._enqueue(
                StatusUpdate(
                    pod_uid, claim, failed_device=device, failed_step="device", failed_message=message,
                    failed_reason=DEVICE_REMOVED,
                )
            )  # fmt: skip
        if not pod_uids:
            self._enqueue(ClaimEvent(claim.namespace, claim.name, claim.uid, DEVICE_REMOVED, f"{device}: {message}"))

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """``claim`` was unprepared on this node: queue the removal of all our entries.

        Applying an empty list with our field manager drops exactly the entries we own, so a
        claim that stays allocated and is used by a later pod shows no stale ``Ready=True``.
        """
        self._enqueue(StatusUpdate("", claim, clear=True))

    def nic_returned_unattended(
        self, pod_uid: str, claim: PreparedClaim, device: str, message: str, lost: bool
    ) -> None:
        """The pod ended while no driver was connected: a Warning event on the claim says what became
        of the NIC (``NICLost`` or ``NICReturnedUnattended``)."""
        del pod_uid, device
        reason = NIC_LOST if lost else NIC_RETURNED_UNATTENDED
        self._enqueue(ClaimEvent(claim.namespace, claim.name, claim.uid, reason, message))

    def prepare_failed(self, namespace: str, name: str, uid: str, message: str) -> None:
        """NodePrepareResources refused the claim: queue a Warning event ``ClaimPrepareFailed`` on it."""
        self._enqueue(ClaimEvent(namespace, name, uid, PREPARE_FAILED, message))

    def _enqueue(self, update: StatusUpdate | ClaimEvent) -> None:
        try:
            self._queue.put_nowait(update)
        except queue.Full:
            # Never block the runtime's hook: status is informative, the pod's fate is not.
            self.dropped += 1
            where = update if isinstance(update, ClaimEvent) else update.claim
            log.error(
                "claim status queue full; dropping update", extra={"kv": {"claim": f"{where.namespace}/{where.name}"}}
            )

    # -- worker -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (best effort within ``timeout``), then stop the worker."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        while True:
            update = self._queue.get()
            if update is None:
                return
            if self._quiet is not None:
                self._quiet()
            if isinstance(update, ClaimEvent):
                self.post_claim_event(update)
            else:
                self.process(update)

    def process(self, update: StatusUpdate) -> bool:
        """Deliver one update with bounded retries; True when written."""
        delay = self.backoff
        claim = update.claim
        kv = {"claim": f"{claim.namespace}/{claim.name}", "pod": update.pod_uid}
        while True:
            update.attempts += 1
            try:
                self._deliver(update)
                self.delivered += 1
                return True
            except (NotFound, ClaimReplaced):
                log.info("claim gone; status not written", extra={"kv": kv})
                return False
            except Exception as exc:  # noqa: BLE001 - an API error or a bug: retry, never kill the worker
                error: Exception = exc
            if update.attempts >= self.max_attempts:
                self.dropped += 1
                log.error(
                    "giving up writing claim status",
                    extra={"kv": {**kv, "error": str(error), "attempts": update.attempts}},
                )
                return False
            log.warning("claim status write failed; retrying", extra={"kv": {**kv, "error": str(error)}})
            self._sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    def _deliver(self, update: StatusUpdate) -> None:
        claim = update.claim
        current = self.kube.read_namespaced_resource_claim(claim.namespace, claim.name)
        if (current.get("metadata") or {}).get("uid") != claim.uid:
            raise ClaimReplaced(f"claim {claim.namespace}/{claim.name} has another UID now")
        if update.clear and not self._entries(current):
            return  # nothing of ours to remove (no pod reached the hooks): no write
        if update.failed_device is not None and not update.event_posted:
            self._post_event(update, current)
            update.event_posted = True
        body = status_body(update, current, self.driver_name, self._numa_condition(update.claim, current))
        ours = body["status"]["devices"]
        try:
            written = self.kube.patch_namespaced_resource_claim_status(claim.namespace, claim.name, body, FIELD_MANAGER)
        except KubeError as exc:
            if not _raw_parameters_refused(exc):
                raise
            self._replace_status(current, ours)
            return
        if self._entries(written) != self._entries({"status": {"devices": ours}}):
            # Entries an earlier PUT wrote are not owned by our apply, so an apply cannot
            # remove them: finish with a PUT (read again: the apply changed resourceVersion).
            self._replace_status(self.kube.read_namespaced_resource_claim(claim.namespace, claim.name), ours)

    def _entries(self, obj: dict[str, Any]) -> list[tuple[Any, Any]]:
        """Our (pool, device) keys in ``status.devices``, sorted."""
        return sorted(
            (d.get("pool"), d.get("device"))
            for d in (obj.get("status") or {}).get("devices") or []
            if d.get("driver") == self.driver_name
        )

    def _replace_status(self, current: dict[str, Any], ours: list[dict[str, Any]]) -> None:
        """Write our entries with a PUT of the object as read, when server-side apply is refused.

        Why: the apiserver (1.34) compares ``status.allocation`` byte for byte, including the
        opaque ``parameters`` (a RawExtension) the scheduler copied from the claim. Apply and
        PATCH re-encode the object, so unless the user sent those parameters in canonical JSON
        (compact, sorted keys: what kubectl sends) the write is refused as "field is immutable".
        A PUT of the object exactly as served (compact, original key order) preserves compact
        originals; a second try with Python's default spacing matches bodies that Python
        clients created. Other drivers' entries are kept; resourceVersion guards against races.
        """
        meta = current.get("metadata") or {}
        status = current.setdefault("status", {})
        status["devices"] = [d for d in status.get("devices") or [] if d.get("driver") != self.driver_name] + ours
        separators: tuple[tuple[str, str], ...] = ((",", ":"), (", ", ": "))  # compact, then Python's
        for i, sep in enumerate(separators):
            try:
                self.kube.replace_namespaced_resource_claim_status(
                    meta.get("namespace", ""),
                    meta.get("name", ""),
                    json.dumps(current, separators=sep).encode(),
                    FIELD_MANAGER,
                )
                return
            except KubeError as exc:
                if not _raw_parameters_refused(exc) or i == len(separators) - 1:
                    raise

    def _numa_condition(self, claim: PreparedClaim, current: dict[str, Any]) -> dict[str, str] | None:
        cached = self._numa_cache.get(claim.uid)
        if cached is not None:
            return cached
        try:
            results = (((current.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or []
            wanted: dict[str, set[tuple[str, str]]] = {}
            for r in results:
                if r.get("driver") not in (None, self.driver_name):
                    wanted.setdefault(str(r["driver"]), set()).add(
                        (str(r.get("pool") or ""), str(r.get("device") or ""))
                    )
            slices: list[dict[str, Any]] = []
            for driver in sorted(wanted):
                slices.extend(self._slices_naming(driver, wanted[driver]))
            single = numa_report.numa_node_count(self.sysfs_root) == 1
            condition = numa_report.numa_condition(
                numa_report.own_devices(claim, single),
                numa_report.other_devices(results, slices, self.sysfs_root, single, self.driver_name),
            )
        except KubeError as exc:
            # Report what we could not find instead of failing the Ready write.
            log.warning("NUMA report: cannot list slices", extra={"kv": {"error": str(exc)}})
            return {
                "type": numa_report.CONDITION_TYPE,
                "status": "Unknown",
                "reason": "NUMAUnknown",
                "message": f"cannot read the other devices' ResourceSlices: {exc}"[:MAX_MESSAGE],
            }
        self._numa_cache[claim.uid] = condition
        if len(self._numa_cache) > 4096:  # bounded: claims come and go
            self._numa_cache.pop(next(iter(self._numa_cache)))
        return condition

    def _slices_naming(self, driver: str, devices: set[tuple[str, str]]) -> list[dict[str, Any]]:
        """``driver``'s slices holding ``devices`` ((pool, device) names): this node's, from the last
        LIST while fresh and complete enough, else listed again; the driver's slices of every node
        only when a device is in none of this node's (a pool published for several nodes)."""
        cached = self._slices.get(driver)
        if cached is not None and self._clock() - cached[0] < SLICES_FRESH and devices <= cached[2]:
            return cached[1]
        listed_at = self._clock()
        local = self.list_slices(driver)
        names = _device_names(local)
        self._slices[driver] = (listed_at, local, names)
        if devices <= names:
            return local
        return self.list_slices(driver, this_node=False)

    def list_slices(self, driver: str, this_node: bool = True) -> list[dict[str, Any]]:
        """The ResourceSlices of ``driver`` published for this node (field selectors ``spec.driver``
        and ``spec.nodeName``: a LIST of a few KiB whatever the cluster's size), or of every node."""
        selector = f"spec.driver={driver}" + (f",spec.nodeName={self.node_name}" if this_node else "")
        items = self.kube.list_resource_slice(selector).get("items") or []
        return list(items)

    # -- events -------------------------------------------------------------------------------

    def _post_event(self, update: StatusUpdate, current: dict[str, Any]) -> None:
        claim = update.claim
        pod_name = next(
            (
                r.get("name")
                for r in (current.get("status") or {}).get("reservedFor") or []
                if r.get("uid") == update.pod_uid
            ),
            None,
        )
        if pod_name is None:
            log.warning("pod not in claim's reservedFor; no event", extra={"kv": {"pod": update.pod_uid}})
            return
        pod = {"apiVersion": "v1", "kind": "Pod", "namespace": claim.namespace, "name": pod_name, "uid": update.pod_uid}
        event = self._warning_event(
            pod,
            update.failed_reason or reason_for(update.failed_step),
            f"device {update.failed_device} of claim {claim.name}: {update.failed_step}: {update.failed_message}",
        )
        try:
            self.kube.create_namespaced_event(claim.namespace, event)
        except KubeError as exc:
            # The status write still carries the failure; an event is a courtesy.
            log.warning("cannot post event", extra={"kv": {"error": str(exc)}})
        # The same failure on the claim (the object a dranet user's tooling watches).
        self.post_claim_event(
            ClaimEvent(
                claim.namespace, claim.name, claim.uid, str(event["reason"]), f"pod {pod_name}: {event['message']}"
            )
        )

    def _warning_event(self, involved: dict[str, str], reason: str, message: str) -> dict[str, Any]:
        """A Warning Event about ``involved`` (its apiVersion, kind, namespace, name and uid), from this driver.

        The message is cut to 1024 characters, the events API's limit on an event's note.
        """
        now = now_utc()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": involved["namespace"]},
            "involvedObject": involved,
            "type": "Warning",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.driver_name, "host": self.node_name},
            "reportingComponent": self.driver_name,
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def post_node_event(self, reason: str, message: str) -> bool:
        """Post a Warning event about this node (in ``default``, where a cluster-scoped object's
        events go); True when created."""
        involved = {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": self.node_name, "uid": ""}
        try:
            involved["uid"] = str(self.kube.read_node(self.node_name)["metadata"]["uid"])
        except (KubeError, KeyError, TypeError) as exc:
            log.warning("cannot read this node for its event", extra={"kv": {"error": str(exc)}})
        event = self._warning_event(involved, reason, message)
        event["metadata"]["namespace"] = "default"
        try:
            self.kube.create_namespaced_event("default", event)
        except KubeError as exc:
            log.warning("cannot post event", extra={"kv": {"error": str(exc), "reason": reason}})
            return False
        return True

    def post_claim_event(self, ev: ClaimEvent) -> bool:
        """Post a Warning event whose ``involvedObject`` is the ResourceClaim; True when created."""
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": ev.namespace,
            "name": ev.name,
            "uid": ev.uid,
        }
        body = self._warning_event(claim, ev.reason, ev.message)
        try:
            self.kube.create_namespaced_event(ev.namespace, body)
            return True
        except Exception as exc:  # noqa: BLE001 - an event is a courtesy: never retry-loop or crash on it
            log.warning(
                "cannot post claim event", extra={"kv": {"claim": f"{ev.namespace}/{ev.name}", "error": str(exc)}}
            )
            return False


def _device_names(slices: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (pool, device) names the slices publish."""
    names: set[tuple[str, str]] = set()
    for rs in slices:
        spec = rs.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name") or "")
        names.update((pool, str(d.get("name") or "")) for d in spec.get("devices") or [] if isinstance(d, dict))
    return names
