"""ResourceSlice builder and diff (driver/dra/slices.py): pure functions, no API server."""

from __future__ import annotations

import copy
import random

import pytest

from driver.dra.slices import build_slices, kept, plan_slices
from driver.model.device import Device, HostFacts

DRIVER, NODE, UID = "dra.net", "node-a", "uid-1"


def dev(i: int, numa: int = 0) -> Device:
    return Device(
        name=f"pci-0000-{i:04x}-00-0",
        attributes={"dra.net/rdma": True, "dra.net/numaNode": numa},
        host=HostFacts(pci_address=f"0000:{i:04x}:00.0"),
    )


def store(bodies: list[dict]) -> list[dict]:
    """What the API server would hold after creating ``bodies`` (names, uids, resourceVersions)."""
    out = []
    for i, b in enumerate(bodies):
        o = copy.deepcopy(b)
        o["metadata"].pop("generateName")
        o["metadata"].update(name=f"{NODE}-{DRIVER}-{i:05d}", uid=f"s{i}", resourceVersion=str(100 + i))
        out.append(o)
    return out


def apply(existing: list[dict], plan) -> list[dict]:
    """Apply a plan to a fake store the way the publisher applies it to the API."""
    gone = {s["metadata"]["name"] for s in plan.delete}
    by_name = {s["metadata"]["name"]: s for s in existing if s["metadata"]["name"] not in gone}
    for u in plan.update:
        by_name[u["metadata"]["name"]] = copy.deepcopy(u)
    new = store(plan.create)
    for i, n in enumerate(new):
        n["metadata"]["name"] += f"-new{i}"
        by_name[n["metadata"]["name"]] = n
    return list(by_name.values())


def test_empty_pool_gets_one_empty_slice():
    [s] = build_slices([], DRIVER, NODE, UID)
    assert s["spec"]["devices"] == []
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}


def test_slice_shape():
    [s] = build_slices([dev(1)], DRIVER, NODE, UID, generation=7)
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    assert s["metadata"]["generateName"] == f"{NODE}-{DRIVER}-"
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
    ]
    assert s["spec"]["driver"] == DRIVER and s["spec"]["nodeName"] == NODE
    assert s["spec"]["pool"]["generation"] == 7
    assert s["spec"]["devices"] == [dev(1).to_api()]


def test_split_beyond_128_is_deterministic_in_name_order():
    devices = [dev(i) for i in range(300)]
    shuffled = devices[:]
    random.Random(4).shuffle(shuffled)
    slices = build_slices(shuffled, DRIVER, NODE, UID, generation=3)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert all(s["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 3} for s in slices)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == sorted(d.name for d in devices)
    assert slices == build_slices(devices, DRIVER, NODE, UID, generation=3)


def test_exactly_128_fits_one_slice():
    assert len(build_slices([dev(i) for i in range(128)], DRIVER, NODE, UID)) == 1
    assert len(build_slices([dev(i) for i in range(129)], DRIVER, NODE, UID)) == 2


def test_duplicate_device_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        build_slices([dev(1), dev(1)], DRIVER, NODE, UID)


def test_plan_from_nothing_creates_generation_1():
    plan = plan_slices([dev(1), dev(2)], [], DRIVER, NODE, UID)
    assert plan.generation == 1 and not plan.update and not plan.delete
    assert len(plan.create) == 1 and plan.create[0]["spec"]["pool"]["generation"] == 1


def test_unchanged_pool_needs_no_write():
    devices = [dev(i) for i in range(200)]
    existing = store(build_slices(devices, DRIVER, NODE, UID, generation=5))
    plan = plan_slices(list(reversed(devices)), existing, DRIVER, NODE, UID)
    assert plan.empty and plan.generation == 5


def test_changed_device_bumps_generation_and_updates_in_place():
    existing = store(build_slices([dev(1), dev(2)], DRIVER, NODE, UID, generation=2))
    plan = plan_slices([dev(1), dev(2, numa=1)], existing, DRIVER, NODE, UID)
    assert plan.generation == 3 and not plan.create and not plan.delete
    [u] = plan.update
    assert u["metadata"]["name"] == existing[0]["metadata"]["name"]
    assert u["metadata"]["resourceVersion"] == existing[0]["metadata"]["resourceVersion"]
    assert u["spec"]["pool"]["generation"] == 3
    assert plan_slices([dev(1), dev(2, numa=1)], apply(existing, plan), DRIVER, NODE, UID).empty


def test_shrinking_deletes_obsolete_slices_and_fixes_count():
    existing = store(build_slices([dev(i) for i in range(300)], DRIVER, NODE, UID, generation=1))
    plan = plan_slices([dev(i) for i in range(10)], existing, DRIVER, NODE, UID)
    assert plan.generation == 2 and len(plan.update) == 1 and len(plan.delete) == 2 and not plan.create
    assert plan.update[0]["spec"]["pool"]["resourceSliceCount"] == 1
    after = apply(existing, plan)
    assert len(after) == 1 and plan_slices([dev(i) for i in range(10)], after, DRIVER, NODE, UID).empty


def test_growing_creates_new_slices_with_the_new_generation_everywhere():
    existing = store(build_slices([dev(i) for i in range(100)], DRIVER, NODE, UID, generation=4))
    devices = [dev(i) for i in range(260)]
    plan = plan_slices(devices, existing, DRIVER, NODE, UID)
    assert plan.generation == 5 and len(plan.update) == 1 and len(plan.create) == 2
    after = apply(existing, plan)
    assert {s["spec"]["pool"]["generation"] for s in after} == {5}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in after} == {3}
    assert sorted(d["name"] for s in after for d in s["spec"]["devices"]) == sorted(d.name for d in devices)


def test_unchanged_chunk_is_reused_for_the_same_devices():
    devices = [dev(i) for i in range(256)]
    existing = store(build_slices(devices, DRIVER, NODE, UID))
    # Swap storage order: matching is by content, not by list position.
    plan = plan_slices(devices + [dev(999)], list(reversed(existing)), DRIVER, NODE, UID)
    first_two = {u["metadata"]["name"]: u["spec"]["devices"] for u in plan.update}
    for s in existing:
        assert first_two[s["metadata"]["name"]] == s["spec"]["devices"]
    assert len(plan.create) == 1 and plan.create[0]["spec"]["devices"] == [dev(999).to_api()]


def test_mixed_generations_after_a_partial_write_are_repaired():
    existing = store(build_slices([dev(i) for i in range(200)], DRIVER, NODE, UID, generation=2))
    existing[1]["spec"]["pool"]["generation"] = 3
    plan = plan_slices([dev(i) for i in range(200)], existing, DRIVER, NODE, UID)
    assert plan.generation == 4 and len(plan.update) == 2


def test_wrong_owner_uid_is_rewritten():
    existing = store(build_slices([dev(1)], DRIVER, NODE, "old-node-uid"))
    plan = plan_slices([dev(1)], existing, DRIVER, NODE, UID)
    assert plan.update[0]["metadata"]["ownerReferences"][0]["uid"] == UID


def test_slices_of_another_pool_name_are_deleted():
    other = store(build_slices([dev(1)], DRIVER, "renamed", UID))
    plan = plan_slices([dev(1)], other, DRIVER, NODE, UID)
    assert plan.delete == other and len(plan.create) == 1


def test_a_kept_slice_is_planned_against_like_the_full_one():
    """The publisher keeps slices without their devices (their digest stands in): the same plans."""
    devices = [dev(i) for i in range(200)]
    full = store(build_slices(devices, DRIVER, NODE, UID, generation=2))
    full[0]["metadata"]["managedFields"] = [{"manager": "dranet"}]
    slim = [kept(s) for s in full]
    assert all("devices" not in s["spec"] and "managedFields" not in s["metadata"] for s in slim)
    assert plan_slices(devices, slim, DRIVER, NODE, UID).empty
    changed = devices[:199] + [dev(199, numa=1)]
    plan, plan_full = plan_slices(changed, slim, DRIVER, NODE, UID), plan_slices(changed, full, DRIVER, NODE, UID)
    assert plan.update == plan_full.update and not plan.create and not plan.delete
    # The unchanged first chunk goes back to the slice that holds it.
    assert plan.update[0]["metadata"]["name"] == full[0]["metadata"]["name"]
    assert plan.update[0]["spec"]["devices"] == full[0]["spec"]["devices"]


def test_equal_attribute_values_are_one_object_in_a_pool():
    [s] = build_slices([dev(1), dev(2)], DRIVER, NODE, UID)
    first, second = (d["attributes"] for d in s["spec"]["devices"])
    assert first["dra.net/rdma"] is second["dra.net/rdma"] and first == second


def counted(i: int, pf: str = "sriov-a", take: int = 1) -> Device:
    d = dev(i)
    d.counters = {pf: {"vfs": take}}
    return d


SETS = [{"name": "sriov-a", "counters": {"vfs": {"value": "4"}}}]


def test_counter_sets_get_a_slice_of_their_own():
    bodies = build_slices([counted(0, take=4), counted(1)], DRIVER, NODE, UID, counter_sets=SETS)
    assert len(bodies) == 2 and all(b["spec"]["pool"]["resourceSliceCount"] == 2 for b in bodies)
    devices, counters = bodies[0]["spec"], bodies[1]["spec"]
    assert "sharedCounters" not in devices and "devices" not in counters  # never both in one slice
    assert counters["sharedCounters"] == SETS and counters["nodeName"] == NODE
    assert [d["consumesCounters"] for d in devices["devices"]] == [
        [{"counterSet": "sriov-a", "counters": {"vfs": {"value": "4"}}}],
        [{"counterSet": "sriov-a", "counters": {"vfs": {"value": "1"}}}],
    ]


def test_a_device_consumes_only_from_sets_the_pool_publishes():
    # No sets (the apiserver cannot store them): published as whole devices, nothing dangling.
    [s] = build_slices([counted(0), counted(1, pf="sriov-b")], DRIVER, NODE, UID)
    assert all("consumesCounters" not in d for d in s["spec"]["devices"])
    bodies = build_slices([counted(0), counted(1, pf="sriov-b")], DRIVER, NODE, UID, counter_sets=SETS)
    assert "consumesCounters" in bodies[0]["spec"]["devices"][0]
    assert "consumesCounters" not in bodies[0]["spec"]["devices"][1]


def test_more_than_8_counter_sets_take_more_slices():
    sets = [{"name": f"sriov-{i:02d}", "counters": {"vfs": {"value": "1"}}} for i in range(9)]
    bodies = build_slices([dev(0)], DRIVER, NODE, UID, counter_sets=sets)
    assert [len(b["spec"].get("sharedCounters", [])) for b in bodies] == [0, 8, 1]


@pytest.mark.parametrize("kind", ["taints", "counters"])
def test_a_slice_with_taints_or_counters_lists_at_most_64_devices(kind: str):
    # The apiserver's ResourceSliceMaxDevicesWithTaintsOrConsumesCounters: 128 would be refused.
    if kind == "taints":
        devices = [dev(i) for i in range(100)]
        taint = [{"key": "dra.net/unhealthy", "value": "down", "effect": "NoSchedule"}]
        bodies = build_slices(devices, DRIVER, NODE, UID, taints={devices[3].name: taint})
    else:
        bodies = build_slices([counted(i) for i in range(100)], DRIVER, NODE, UID, counter_sets=SETS)
    sizes = [len(b["spec"]["devices"]) for b in bodies if "devices" in b["spec"]]
    assert sizes == [64, 36], sizes
    untainted = build_slices([dev(i) for i in range(100)], DRIVER, NODE, UID)
    assert [len(b["spec"]["devices"]) for b in untainted] == [100]


def test_a_pool_with_counters_is_unchanged_once_written_and_a_new_count_rewrites_it():
    devices = [counted(0, take=4), counted(1)]
    existing = apply([], plan_slices(devices, [], DRIVER, NODE, UID, counter_sets=SETS))
    assert plan_slices(devices, [kept(s) for s in existing], DRIVER, NODE, UID, counter_sets=SETS).empty
    more = [{"name": "sriov-a", "counters": {"vfs": {"value": "6"}}}]
    plan = plan_slices(devices, [kept(s) for s in existing], DRIVER, NODE, UID, counter_sets=more)
    assert not plan.empty and plan.generation == 2
    after = apply(existing, plan)
    assert [s["spec"]["sharedCounters"] for s in after if "sharedCounters" in s["spec"]] == [more]
