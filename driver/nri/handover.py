"""The NRI handler of one driver instance among possibly two on a node (rolling update).

:class:`HandoverHooks` sits between :class:`~driver.nri.plugin.NRIPlugin` and
:class:`~driver.nri.hooks.NRIHooks`. It passes an event on only while this instance holds the
node lease (:mod:`driver.node_lease`); otherwise the instance is a standby and answers every
event with "nothing to do", as a plugin that does not care about the pod would. While standby it
keeps track of the runtime's pods (Synchronize, then Run/Remove events), so that when it takes
over it reconciles the NIC state the other instance left (:meth:`NRIHooks.synchronize`: pins the
pods holding NICs, rolls back a move the other instance was killed in the middle of).

NIC work is also serialized across instances by an ``flock`` on ``<runtime dir>/hooks.lock``:
NodeUnprepareResources may reach either instance (:meth:`claim_unprepared`) while the other runs
a hook.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.node_lease import NodeLease
from driver.nri.hooks import NRIHooks

log = logging.getLogger(__name__)
T = TypeVar("T")
HOOKS_LOCK_FILE = "hooks.lock"


def event_key(method: str, subject: str) -> str:
    """The identity of one runtime event, the same in every plugin it is delivered to."""
    return f"{method}/{subject}"


class HandoverHooks:
    """Implements :class:`driver.nri.plugin.NRIHandler`; acts only while holding the node lease."""

    def __init__(self, hooks: NRIHooks, lease: NodeLease, runtime_dir: str | os.PathLike[str]) -> None:
        self.hooks = hooks
        self.lease = lease
        self._lock_path = Path(runtime_dir) / HOOKS_LOCK_FILE
        self._mutex = threading.RLock()  # one event at a time; retire() waits for the current one
        self._live: dict[str, api.PodSandbox] = {}  # the runtime's pods, by UID
        self._last = ""  # key of the last event this instance handled
        self._skip = ""  # after a takeover: the giver's last event, delivered to us too
        self._active = False

    # -- lease -------------------------------------------------------------------------------

    def acting(self, reconcile: bool = True) -> bool:
        """True while this instance holds the lease; takes it (and reconciles) if it is free."""
        with self._mutex:
            if self._active and self.lease.held:
                return True
            if not self.lease.try_acquire():
                self._active = False
                return False
            self._active = True
            record = self.lease.handover()
            self._skip = record.last_event if record is not None and record.by != self.lease.instance_id else ""
            if reconcile and self._live:
                # Standby saw the runtime's pods: finish what the other instance may have left
                # half-done and pin the namespaces of pods holding NICs.
                with self._cross_process():
                    self.hooks.synchronize(list(self._live.values()), [])
            log.info("NRI hooks active", extra={"kv": {"instance": self.lease.instance_id, "skip": self._skip}})
            return True

    def retire(self) -> None:
        """Stop acting (at shutdown) and hand the lease over with the last event handled."""
        with self._mutex:
            self.lease.release(self._last)
            self._active = False

    @contextlib.contextmanager
    def _cross_process(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _dispatch(self, key: str, fn: Callable[..., T], *args: Any) -> T | None:
        with self._mutex:
            if not self.acting():
                log.debug("standby: event left to the acting instance", extra={"kv": {"event": key}})
                return None
            if self._skip:
                skip, self._skip = self._skip, ""
                if skip == key:
                    log.info("event already handled by the previous instance", extra={"kv": {"event": key}})
                    self._last = key
                    return None
            with self._cross_process():
                result = fn(*args)
            self._last = key
            return result

    # -- NRIHandler --------------------------------------------------------------------------

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        with self._mutex:
            self._live = {p.uid: p for p in pods}
            if self.acting(reconcile=False):  # this is the reconcile
                with self._cross_process():
                    self.hooks.synchronize(pods, containers)

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        with self._mutex:
            self._live[pod.uid] = pod
            self._dispatch(event_key("RunPodSandbox", pod.uid), self.hooks.run_pod_sandbox, pod)

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self._dispatch(event_key("StopPodSandbox", pod.uid), self.hooks.stop_pod_sandbox, pod)

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        with self._mutex:
            self._live.pop(pod.uid, None)
            self._dispatch(event_key("RemovePodSandbox", pod.uid), self.hooks.remove_pod_sandbox, pod)

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment | None:
        return self._dispatch(event_key("CreateContainer", container.id), self.hooks.create_container, pod, container)

    def shutdown(self) -> None:
        self.hooks.shutdown()

    # -- from the kubelet side ---------------------------------------------------------------

    def claim_unprepared(self, claim: PreparedClaim) -> None:
        """NICs the runtime never asked back go home, whichever instance the kubelet called."""
        with self._cross_process():
            self.hooks.claim_unprepared(claim)
