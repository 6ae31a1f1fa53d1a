"""The node lease: one acting driver instance per node, handed over at stop or taken after a death."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from driver.node_lease import NodeLease

ROOT = Path(__file__).resolve().parent.parent


def test_one_holder_then_handover_with_the_last_event(tmp_path: Path) -> None:
    old, new = NodeLease(tmp_path, "old"), NodeLease(tmp_path, "new")
    assert old.try_acquire() and old.held
    assert not new.try_acquire()
    old.release("CreateContainer/c1")
    assert not old.try_acquire(), "a retired instance never takes the lease again"
    assert new.try_acquire()
    record = new.handover()
    assert record is not None and (record.by, record.last_event) == ("old", "CreateContainer/c1")
    new.close()
    old.close()


HOLDER = r"""
import sys, time
from driver.node_lease import NodeLease
lease = NodeLease(sys.argv[1], "victim")
assert lease.try_acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_killed_holder_releases_the_lease(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        standby = NodeLease(tmp_path, "standby")
        assert not standby.try_acquire()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert standby.try_acquire(), "the kernel drops a dead process's flock"
        assert standby.handover() is None  # no clean handover happened
        standby.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_probe_port_goes_to_the_newest_instance(tmp_path: Path) -> None:
    old = NodeLease(tmp_path, "old")
    time.sleep(0.01)
    new = NodeLease(tmp_path, "new")
    assert old.port_requested(9177) is None
    new.request_port(9177)
    assert old.port_requested(9177) == "new"
    assert new.port_requested(9177) is None  # its own request
    later = NodeLease(tmp_path, "later")  # started after the request: not asked
    assert later.port_requested(9177) is None
    new.port_taken(9177)
    assert old.port_requested(9177) is None


def _stepped(monkeypatch, seconds: float) -> None:
    """The wall clock this process sees, stepped by ``seconds`` (NTP correcting a drift, a VM restored)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_the_older_instance_yields_the_port_after_a_backward_clock_step(tmp_path: Path, monkeypatch) -> None:
    old = NodeLease(tmp_path, "old")
    _stepped(monkeypatch, -3600)  # the clock went back an hour before the new instance started
    new = NodeLease(tmp_path, "new")
    new.request_port(9177)
    assert old.port_requested(9177) == "new"


def test_a_stale_request_dated_in_the_future_is_not_obeyed(tmp_path: Path, monkeypatch) -> None:
    _stepped(monkeypatch, +3600)  # an instance whose clock ran an hour ahead asked, then died
    gone = NodeLease(tmp_path, "gone")
    gone.request_port(9177)
    gone.close()
    monkeypatch.undo()
    fresh = NodeLease(tmp_path, "fresh")
    assert fresh.port_requested(9177) is None, "a request from before it started is not for it"
    assert NodeLease(tmp_path, "newer").generation > fresh.generation > gone.generation
