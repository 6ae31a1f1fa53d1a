"""HookActivity: which link events are the hooks' own, and when background work may run."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from driver.netlink.hook_activity import HookActivity


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_expectations_last_the_hook_plus_grace() -> None:
    clock = Clock()
    own = HookActivity(grace=2.0, clock=clock, settle=0.0)
    assert not own.is_own(7, "eth1")
    with own.hook():
        own.expect(names=["eth1"], indexes=[7, None])
        clock.now += 60  # a long hook: expectations do not expire while it runs
        assert own.is_own(7, "other") and own.is_own(0, "eth1") and not own.is_own(8, "eth2")
    clock.now += 1.9
    assert own.is_own(7, "") and own.is_own(0, "eth1")
    clock.now += 0.2
    assert not own.is_own(7, "") and not own.is_own(0, "eth1")
    assert own.own_events == 4


def test_expect_outside_a_hook_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        HookActivity().expect(names=["x"])


def test_busy_while_a_hook_runs_and_waiters_resume_after_it() -> None:
    own = HookActivity(settle=0.05)
    entered, release = threading.Event(), threading.Event()

    def hook() -> None:
        with own.hook():
            entered.set()
            release.wait(5)

    t = threading.Thread(target=hook)
    t.start()
    entered.wait(5)
    assert own.busy
    assert not own.wait_idle(timeout=0.05)

    async def background() -> float:
        waiter = asyncio.create_task(own.idle())
        await asyncio.sleep(0.05)
        assert not waiter.done()  # still waiting for the hook
        released = time.monotonic()
        release.set()
        await waiter
        return time.monotonic() - released

    waited = asyncio.run(background())
    t.join(5)
    assert not own.busy and waited >= 0.05  # the hook's answer had its settle time
    assert own.wait_idle(timeout=1)


def test_nested_and_concurrent_hooks_keep_it_busy() -> None:
    own = HookActivity(settle=0.0)
    with own.hook():
        with own.hook():
            assert own.busy
        assert own.busy
    assert not own.busy and own.wait_idle(timeout=0)
