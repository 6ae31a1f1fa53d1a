"""The running hook's steps: each one timed, and the fault injection that exits right after one.

A hook marks its steps as it goes; when it ends, the time between them is logged (``hook steps``):
at debug level, or as a warning when the hook took over half the runtime's default time for a
call, so a slow hook on a node says which step was slow. Fault injection (tests only):
``DRANET_FAULT_AFTER=<step>`` makes the process ``os._exit(137)`` right after that step;
:data:`RUN_STEPS` and :data:`STOP_STEPS` list them (``{i}`` is the NIC's position in the pod), and
``tests/faults`` kills the driver after each.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

FAULT_ENV = "DRANET_FAULT_AFTER"
RUN_STEPS = ["run:planned", "run:moved-{i}", "run:set", "run:in-pod", "run:configured", "run:committed"]
STOP_STEPS = ["stop:planned", "stop:returned-{i}", "stop:committed"]
RUNTIME_CALL_TIMEOUT_S = 2.0
"""The time containerd and CRI-O give one NRI call unless configured otherwise."""


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
            end = time.perf_counter()
            slow = end - self._marks[0][1] > RUNTIME_CALL_TIMEOUT_S / 2
            level = logging.WARNING if slow else logging.DEBUG
            if log.isEnabledFor(level) and len(self._marks) > 1:
                marks = [*self._marks, ("end", end)]
                ms = {b[0]: round((b[1] - a[1]) * 1e3, 3) for a, b in itertools.pairwise(marks)}
                log.log(level, "hook steps", extra={"kv": {"hook": hook, "pod": pod_uid, "ms": ms}})
