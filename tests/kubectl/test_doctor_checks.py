"""``kubectl dranet doctor``'s checks that read one kind of object, on stubs of the API client: every
driver node's kernel against the floor, and the nodes whose driver found its state damaged."""

from __future__ import annotations

from typing import Any

from driver.kube.errors import Forbidden
from driver.kubectl.doctor import FAIL, INFO, OK, UNKNOWN, WARN, check_kernels, check_state
from driver.netlink.kernel_features import FLOOR


class Nodes:
    """The one call the doctor's kernel check makes."""

    def __init__(self, kernels: dict[str, str]) -> None:
        self.kernels = kernels

    def list_node(self) -> dict[str, Any]:
        return {
            "items": [
                {"metadata": {"name": n}, "status": {"nodeInfo": {"kernelVersion": k}}} for n, k in self.kernels.items()
            ]
        }


def test_doctor_reads_each_driver_nodes_kernel() -> None:
    fine = check_kernels(Nodes({"a": "6.8.0-45-generic", "b": "6.12.1"}), None)  # type: ignore[arg-type]
    assert fine.status == OK and f"{FLOOR[0]}.{FLOOR[1]}" in fine.detail
    debian = check_kernels(Nodes({"a": "6.1.0-56-amd64", "gone": "4.9.0"}), {"a": True})  # type: ignore[arg-type]
    assert debian.status == INFO and debian.detail.startswith("a 6.1.0-56-amd64: without ipv4BigTcp (needs Linux 6.3")
    old = check_kernels(Nodes({"a": "4.18.0-553.el8_10.x86_64", "b": "6.1.0"}), None)  # type: ignore[arg-type]
    assert old.status == FAIL and old.detail.endswith(": a (4.18.0-553.el8_10.x86_64)")


class Events:
    """The events list of ``default`` (None: the caller may not list them)."""

    def __init__(self, items: list[dict[str, Any]] | None) -> None:
        self.items = items
        self.asked: list[tuple[str, str]] = []

    def list_namespaced_event(self, namespace: str, field_selector: str) -> dict[str, Any]:
        self.asked.append((namespace, field_selector))
        if self.items is None:
            raise Forbidden(403, "Forbidden", "events is forbidden")
        return {"items": self.items}


def test_doctor_lists_the_nodes_whose_driver_found_its_state_damaged() -> None:
    quiet = Events([])
    assert check_state(quiet).status == OK  # type: ignore[arg-type]
    assert quiet.asked == [("default", "involvedObject.kind=Node,reason=DranetStateDamaged")]
    event = {
        "involvedObject": {"kind": "Node", "name": "gpu-7"},
        "lastTimestamp": "2026-11-28T05:00:00Z",
        "message": "dranet's prepared claims on this node were damaged (checkpoint.journal: moved aside)",
    }
    damaged = check_state(Events([event]))  # type: ignore[arg-type]
    assert damaged.status == WARN and "gpu-7 at 2026-11-28T05:00:00Z: dranet's prepared claims" in damaged.detail
    assert check_state(Events(None)).status == UNKNOWN  # type: ignore[arg-type]
