"""The daemon tells a removed device's holders once: each health change with a claimed device
``DeviceRemoved`` reaches the status writer with the claim and its pods (the writer's Ready=False and
events: tests/health/test_device_removed.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.checkpoint.state import PreparedClaim
from driver.claims.status import DEVICE_REMOVED
from driver.dra.protocol import DeviceHealthState
from harness.nri import prepare_claim
from tests.daemon.test_node_settings import NodeApi, _daemon


class _Told:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def device_removed(self, pod_uids: tuple[str, ...], claim: PreparedClaim, device: str, message: str) -> None:
        self.calls.append((pod_uids, claim.uid, device, message))


def test_a_claimed_device_that_left_the_node_is_told_to_its_claim_and_pods_once(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path, NodeApi())
    claim_uid = prepare_claim(daemon.store, "pod-1", [{"ifname": "ens1f0v1", "device": "vf-1"}])
    told = _Told()
    daemon.status_writer = told  # type: ignore[assignment]
    gone = DeviceHealthState(pool="node", device="vf-1", healthy=False, reason=DEVICE_REMOVED, message="gone")
    other = DeviceHealthState(pool="node", device="vf-2", healthy=False, reason=DEVICE_REMOVED, message="gone too")
    daemon._health_changed([gone, other])  # vf-2: no claim holds it, nobody to tell
    daemon._health_changed([gone, other])
    assert told.calls == [(("pod-1",), claim_uid, "vf-1", "gone")]
