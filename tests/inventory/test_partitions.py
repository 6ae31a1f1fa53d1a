"""An SR-IOV PF and its VFs as partitions of one device (driver/inventory/partitions.py), on the
fixture host with 2 PFs of 64 VFs (4 of each on vfio-pci, published too)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from driver.inventory import partitions
from driver.model.device import Device, ShareCapacity
from tests.inventory.test_discovery_fixtures import scan

D = "dra.net/"
PF0, PF1 = "0000:3b:00.0", "0000:86:00.0"


def _consumes(devices: list[Device]) -> dict[str, dict[str, dict[str, int]] | None]:
    return {d.host.pci_address or d.name: d.counters for d in devices}


def test_a_pf_takes_all_of_its_set_and_each_vf_one(sriov_sysfs: Path) -> None:
    devices = partitions.with_counters(scan(sriov_sysfs))
    by_pci = _consumes(devices)
    assert by_pci[PF0] == {"sriov-0000-3b-00-0": {"vfs": 64}}
    assert by_pci["0000:86:00.3"] == {"sriov-0000-86-00-0": {"vfs": 1}}  # VF 1 of PF1
    assert sum(1 for c in by_pci.values() if c == {"sriov-0000-3b-00-0": {"vfs": 1}}) == 64
    assert partitions.counter_sets(devices) == [
        {"name": "sriov-0000-3b-00-0", "counters": {"vfs": {"value": "64"}}},
        {"name": "sriov-0000-86-00-0", "counters": {"vfs": {"value": "64"}}},
    ]
    # What the PF takes is what its set holds: the PF and any VF of it never fit together.
    pf = next(d for d in devices if d.host.pci_address == PF0)
    whole = [{"counterSet": "sriov-0000-3b-00-0", "counters": {"vfs": {"value": "64"}}}]
    assert pf.to_api()["consumesCounters"] == whole


def test_the_inventory_itself_is_left_as_it_was(sriov_sysfs: Path) -> None:
    scanned = scan(sriov_sysfs)
    partitions.with_counters(scanned)
    assert all(d.counters is None for d in scanned)


def test_no_set_for_a_shared_pf_nor_for_the_vfs_of_an_unpublished_pf(sriov_sysfs: Path) -> None:
    scanned = scan(sriov_sysfs)
    shared = [dataclasses.replace(d, share=ShareCapacity(8, 0, 0)) if d.host.pci_address == PF0 else d for d in scanned]
    devices = partitions.with_counters([d for d in shared if d.host.pci_address != PF1])  # PF1 not published
    assert all(d.counters is None for d in devices if d.host.sriov_pf in (PF0, PF1) or d.host.pci_address == PF0)
    assert partitions.counter_sets(devices) == []


def test_a_host_without_sriov_gets_no_counters(nd_h100_sysfs: Path) -> None:
    devices = partitions.with_counters(scan(nd_h100_sysfs))
    assert all(d.counters is None for d in devices) and partitions.counter_sets(devices) == []
