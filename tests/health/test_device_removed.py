"""A device whose PCI function left the node (a VF whose PF's count was lowered): ``DeviceRemoved``,
and each claim holding it, with its pods, told once while it stays gone (the SR-IOV guest tier
lowers a real PF's count under a VF in a pod: tests/inventory/test_sriov_vfs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from driver.checkpoint.state import DriverState, PreparedClaim, PreparedDevice
from driver.claims.status import DEVICE_REMOVED, ClaimEvent, ClaimStatusWriter
from driver.claims.status_entries import StatusUpdate, status_body
from driver.dra.protocol import DeviceHealthState
from driver.health.monitor import RemovedDevices, assess, removed_holders
from driver.model.device import Device, HostFacts

VF, PF = "0000:41:10.0", "0000:41:00.0"


def _tree(root: Path, *functions: str) -> str:
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    for bdf in functions:
        (root / "bus" / "pci" / "devices" / bdf).mkdir()
    return str(root)


def test_a_vf_whose_function_is_gone_is_removed_wherever_it_is(tmp_path: Path) -> None:
    vf = Device("vf", host=HostFacts(ifname="enp65s0f0v0", pci_address=VF, sriov_pf=PF))
    gone = _tree(tmp_path / "gone", PF)
    for in_use in (False, True):  # on the host, or in a pod (whose netdev the host no longer sees)
        healthy, reason, message = assess(vf, gone, in_use)
        assert (healthy, reason) == (False, DEVICE_REMOVED)
        assert VF in message and f"its PF {PF}'s VF count was lowered" in message
    present = _tree(tmp_path / "present", PF, VF)
    assert assess(vf, present, True)[:2] == (True, "")


def test_a_tree_without_a_pci_bus_says_nothing_of_removal(tmp_path: Path) -> None:
    (tmp_path / "class" / "net" / "eth9").mkdir(parents=True)
    nic = Device("nic", host=HostFacts(ifname="eth9", pci_address="0000:99:00.0"))
    assert assess(nic, str(tmp_path), False)[:2] == (True, "")


def _state(device: str, pods: list[str]) -> tuple[DriverState, PreparedClaim]:
    claim = PreparedClaim("uid-1", "ml", "gpu-nics", pods, [PreparedDevice("nic", "node", device, Device(device))])
    return DriverState(claims={"uid-1": claim}), claim


def _health(device: str, reason: str) -> DeviceHealthState:
    return DeviceHealthState(pool="node", device=device, healthy=not reason, reason=reason, message=f"{reason} msg")


def test_each_removal_is_told_once_while_it_lasts() -> None:
    removed = RemovedDevices()
    assert removed.newly_removed([_health("vf", ""), _health("nic", "")]) == {}
    assert removed.newly_removed([_health("vf", DEVICE_REMOVED), _health("nic", "LinkDown")]) == {
        "vf": f"{DEVICE_REMOVED} msg"
    }
    assert removed.newly_removed([_health("vf", DEVICE_REMOVED)]) == {}
    assert removed.newly_removed([_health("vf", "")]) == {}  # back (a new VF at that address)
    assert list(removed.newly_removed([_health("vf", DEVICE_REMOVED)])) == ["vf"]  # gone again: told again


def test_the_holders_are_the_claims_with_their_pods() -> None:
    state, claim = _state("vf", ["pod-1"])
    [held] = removed_holders(state, {"vf"})
    assert (held.claim, held.device, held.pod_uids) == (claim, "vf", ("pod-1",))
    assert removed_holders(state, {"other"}) == []


class _Writer(ClaimStatusWriter):
    """The writer's queue, without its API worker."""

    def __init__(self) -> None:
        self.queued: list[Any] = []

    def _enqueue(self, update: StatusUpdate | ClaimEvent) -> None:
        self.queued.append(update)


def test_a_pod_holding_it_gets_ready_false_and_a_claim_without_pods_an_event() -> None:
    writer = _Writer()
    _, claim = _state("vf", ["pod-1"])
    writer.device_removed(("pod-1",), claim, "vf", "PCI function gone")
    [update] = writer.queued
    assert (update.pod_uid, update.failed_device, update.failed_reason) == ("pod-1", "vf", DEVICE_REMOVED)
    body = status_body(update, {"status": {}}, "dra.net", None)
    [entry] = body["status"]["devices"]
    ready = next(c for c in entry["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", DEVICE_REMOVED)
    assert "PCI function gone" in ready["message"]
    writer.queued.clear()
    writer.device_removed((), claim, "vf", "PCI function gone")
    [event] = writer.queued
    assert isinstance(event, ClaimEvent) and (event.reason, event.name) == (DEVICE_REMOVED, "gpu-nics")
