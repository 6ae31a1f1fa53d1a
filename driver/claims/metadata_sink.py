"""The NRI hooks' status sink with the device metadata: the pod's files rewritten off RunPodSandbox's path.

RunPodSandbox queues the rewrite of a claim's metadata files once its NICs are configured in the pod
(like the claim status write, it never waits for it); before a container of the pod is created,
:meth:`MetadataStatusSink.settle` waits for the pod's rewrites and checks its claims' files: the
containers mount them, and the runtime creates them only after RunPodSandbox answered.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from driver.checkpoint.state import PreparedClaim
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.status_entries import DeviceResult

log = logging.getLogger(__name__)

SETTLE_TIMEOUT = 5.0
"""Seconds a container of a pod waits for its metadata rewrite (a few ms): then it starts with the
file as it was, as after a failed rewrite."""


class MetadataStatusSink:
    """The NRI hooks' status sink with the metadata update: RunPodSandbox queues the rewrite of the
    files (off its path, like the claim status write) and :meth:`settle`, called before a container
    of the pod is created, waits for it and checks the pod's files: the containers mount the files,
    and the runtime creates them only after RunPodSandbox answered."""

    def __init__(self, metadata: DeviceMetadataWriter, status: Any) -> None:
        self.metadata, self.status = metadata, status
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="device-metadata")
        self._pending: dict[str, set[Future[None]]] = {}  # pod UID -> its rewrites not done yet
        self._lock = threading.Lock()

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        future = self._writer.submit(self._rewrite, pod_uid, claim, list(results))
        with self._lock:
            self._pending.setdefault(pod_uid, set()).add(future)
        future.add_done_callback(lambda f: self._done(pod_uid, f))
        self.status.pod_network_ready(pod_uid, claim, results)

    def _rewrite(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        try:
            self.metadata.network_ready(claim, results, pod_uid)
        except Exception as exc:  # noqa: BLE001 - the pod runs; its file keeps the prepare-time facts
            log.warning(
                "device metadata not updated", extra={"kv": {"pod": pod_uid, "claim": claim.uid, "error": str(exc)}}
            )

    def _done(self, pod_uid: str, future: Future[None]) -> None:
        with self._lock:
            left = self._pending.get(pod_uid)
            if left is not None:
                left.discard(future)
                if not left:
                    del self._pending[pod_uid]

    def settle(self, pod_uid: str, timeout: float = SETTLE_TIMEOUT) -> None:
        """The pod's queued rewrites are on the node (a failed one is logged: the file keeps the
        prepare-time facts), and its claims' files are as they should be (a lost or damaged one
        written again: a restarted container mounts them with no prepare and no sandbox start)."""
        with self._lock:
            futures = list(self._pending.get(pod_uid, ()))
        if futures and wait(futures, timeout).not_done:
            log.warning("device metadata rewrite still running: container created", extra={"kv": {"pod": pod_uid}})
        try:
            self.metadata.keep_pod(pod_uid)
        except Exception as exc:  # noqa: BLE001 - the container is created in any case
            log.warning("device metadata files not checked", extra={"kv": {"pod": pod_uid, "error": str(exc)}})

    def close(self) -> None:
        """Finish the queued rewrites (at shutdown)."""
        self._writer.shutdown(wait=True)

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        self.status.pod_network_failed(pod_uid, claim, device, step, message)

    def nic_returned_unattended(
        self, pod_uid: str, claim: PreparedClaim, device: str, message: str, lost: bool
    ) -> None:
        self.status.nic_returned_unattended(pod_uid, claim, device, message, lost)
