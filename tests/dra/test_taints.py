"""Unhealthy-device taints: stable while the reason lasts, gone when healthy, written with the slices."""

from __future__ import annotations

from driver.config import UNHEALTHY_TAINT_KEY
from driver.dra.slices import plan_slices
from driver.dra.taints import UnhealthyTaints
from driver.model.device import Device

KEY = UNHEALTHY_TAINT_KEY


def test_time_added_is_kept_while_the_reason_lasts() -> None:
    taints = UnhealthyTaints("NoSchedule", KEY)
    first = taints.update({"nic-a": "LinkDown"}, now=1_000_000)
    assert first == {
        "nic-a": [
            {
                "key": "dra.net/unhealthy",
                "value": "LinkDown",
                "effect": "NoSchedule",
                "timeAdded": "1970-01-12T13:46:40Z",
            }
        ]
    }
    assert taints.update({"nic-a": "LinkDown"}, now=1_000_100) == first  # no change: no slice write
    other = taints.update({"nic-a": "PortNotActive"}, now=1_000_200)
    assert (
        other["nic-a"][0]["value"] == "PortNotActive"
        and other["nic-a"][0]["timeAdded"] != first["nic-a"][0]["timeAdded"]
    )
    assert taints.update({}) == {}
    assert UnhealthyTaints("None", KEY).update({"nic-a": "LinkDown"}) == {}
    assert UnhealthyTaints("NoExecute", KEY).update({"x": "LinkDown"})["x"][0]["effect"] == "NoExecute"


def _existing(plan_body: dict, name: str, rv: str) -> dict:
    return {**plan_body, "metadata": {**plan_body["metadata"], "name": name, "uid": "u-" + name, "resourceVersion": rv}}


def test_a_taint_is_one_slice_update_and_its_removal_another() -> None:
    devices = [Device("nic-a", {"dra.net/rdma": True}), Device("nic-b", {"dra.net/rdma": True})]
    first = plan_slices(devices, [], "dra.net", "node", "uid")
    existing = [_existing(first.create[0], "s1", "1")]
    assert plan_slices(devices, existing, "dra.net", "node", "uid").empty
    taint = UnhealthyTaints("NoSchedule", KEY).update({"nic-b": "LinkDown"}, now=0)
    tainted = plan_slices(devices, existing, "dra.net", "node", "uid", taints=taint)
    assert len(tainted.update) == 1 and not tainted.create and not tainted.delete
    by_name = {d["name"]: d for d in tainted.update[0]["spec"]["devices"]}
    assert "taints" not in by_name["nic-a"] and by_name["nic-b"]["taints"][0]["value"] == "LinkDown"
    now = [_existing(tainted.update[0], "s1", "2")]
    assert plan_slices(devices, now, "dra.net", "node", "uid", taints=taint).empty
    healed = plan_slices(devices, now, "dra.net", "node", "uid", taints={})
    assert len(healed.update) == 1 and all("taints" not in d for d in healed.update[0]["spec"]["devices"])
