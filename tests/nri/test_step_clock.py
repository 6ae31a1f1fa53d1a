"""A hook's step times: logged as a warning when the hook was slow, at debug level otherwise."""

from __future__ import annotations

import logging

import pytest

from driver.nri import step_clock
from driver.nri.step_clock import RUNTIME_CALL_TIMEOUT_S, StepClock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("step_s", "level"), [(0.2, logging.DEBUG), (RUNTIME_CALL_TIMEOUT_S, logging.WARNING)])
def test_a_slow_hook_says_which_step_was_slow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, step_s: float, level: int
) -> None:
    clock = Clock()
    monkeypatch.setattr(step_clock.time, "perf_counter", clock)
    steps = StepClock(fault_after="")
    caplog.set_level(logging.DEBUG, logger=step_clock.__name__)
    with steps.timing("RunPodSandbox", "pod-1"):
        clock.now += 0.01
        steps.step("run:planned")
        clock.now += step_s
        steps.step("run:moved-0")
    [record] = [r for r in caplog.records if r.getMessage() == "hook steps"]
    assert record.levelno == level
    kv = record.kv  # type: ignore[attr-defined]
    assert kv["hook"] == "RunPodSandbox" and kv["pod"] == "pod-1"
    assert kv["ms"] == {"run:planned": 10.0, "run:moved-0": round(step_s * 1e3, 3), "end": 0.0}
