"""HandoverHooks: two driver instances connected to one runtime; only the lease holder acts.

The inner hooks are a recorder here (the real NRIHooks move NICs: tests/nri/test_harness.py and
the real node's rolling update test, tests/e2e/node/test_upgrade.py); what is under test is who
acts, and that the event handled last before a handover is not handled twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.node_lease import NodeLease
from driver.nri.handover import HandoverHooks


class Recorder:
    """Stands in for NRIHooks: records calls, adjusts every container."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def synchronize(self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]) -> None:
        self.calls.append(("synchronize", ",".join(sorted(p.uid for p in pods))))

    def run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("run", pod.uid))

    def stop_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("stop", pod.uid))

    def remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        self.calls.append(("remove", pod.uid))

    def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.ContainerAdjustment:
        self.calls.append(("create", container.id))
        return api.ContainerAdjustment()

    def shutdown(self) -> None:
        pass

    def claim_unprepared(self, claim: Any) -> None:
        self.calls.append(("unprepared", claim))


def _pair(tmp_path: Path) -> tuple[HandoverHooks, Recorder, HandoverHooks, Recorder]:
    a, b = Recorder(), Recorder()
    old = HandoverHooks(a, NodeLease(tmp_path, "old"), tmp_path)  # type: ignore[arg-type]
    new = HandoverHooks(b, NodeLease(tmp_path, "new"), tmp_path)  # type: ignore[arg-type]
    return old, a, new, b


def _pod(uid: str) -> api.PodSandbox:
    return api.PodSandbox(id=f"sb-{uid}", uid=uid, name=uid, namespace="ns")


def test_only_the_lease_holder_acts(tmp_path: Path) -> None:
    old, a, new, b = _pair(tmp_path)
    old.synchronize([_pod("p0")], [])
    new.synchronize([_pod("p0")], [])
    for hooks in (old, new):  # the runtime calls every plugin for every event
        hooks.run_pod_sandbox(_pod("p1"))
    assert new.create_container(_pod("p1"), api.Container(id="c1")) is None
    assert old.create_container(_pod("p1"), api.Container(id="c1")) is not None
    assert a.calls == [("synchronize", "p0"), ("run", "p1"), ("create", "c1")]
    assert b.calls == []


def test_the_event_handled_last_is_not_handled_again_after_the_handover(tmp_path: Path) -> None:
    old, a, new, b = _pair(tmp_path)
    old.synchronize([], [])
    new.synchronize([], [])
    # The runtime calls old then new for each event; old stops right after its CreateContainer.
    old.run_pod_sandbox(_pod("p1"))
    new.run_pod_sandbox(_pod("p1"))
    old.create_container(_pod("p1"), api.Container(id="c1"))
    old.retire()
    assert new.create_container(_pod("p1"), api.Container(id="c1")) is None, "would conflict in the runtime"
    new.create_container(_pod("p1"), api.Container(id="c2"))
    old.stop_pod_sandbox(_pod("p1"))  # retired: nothing
    new.stop_pod_sandbox(_pod("p1"))
    assert a.calls == [("synchronize", ""), ("run", "p1"), ("create", "c1")]
    # The taker reconciled with the pods it saw (p1) before acting.
    assert b.calls == [("synchronize", "p1"), ("create", "c2"), ("stop", "p1")]


def test_handover_before_the_event_reaches_either(tmp_path: Path) -> None:
    old, a, new, b = _pair(tmp_path)
    old.synchronize([], [])
    new.synchronize([], [])
    old.run_pod_sandbox(_pod("p1"))
    new.run_pod_sandbox(_pod("p1"))
    old.retire()
    old.create_container(_pod("p1"), api.Container(id="c1"))
    assert new.create_container(_pod("p1"), api.Container(id="c1")) is not None
    assert a.calls[-1] == ("run", "p1") and b.calls[-1] == ("create", "c1")


def test_unprepare_is_served_by_whichever_instance_the_kubelet_calls(tmp_path: Path) -> None:
    old, a, new, b = _pair(tmp_path)
    old.synchronize([], [])
    new.claim_unprepared("claim-1")  # standby, but the kubelet called it
    assert b.calls == [("unprepared", "claim-1")] and a.calls == [("synchronize", "")]
