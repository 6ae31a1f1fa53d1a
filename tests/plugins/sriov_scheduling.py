"""Claims for an SR-IOV PF and its VFs through the real scheduler: templates asking for a PF whole or
one of its VFs, and a node's view of what the scheduler gives pods using them (no kubelet: pods stay
bound and pending). Shared by the fixture node's test (tests/e2e/test_sriov_partitions_apiserver.py)
and the real igb PFs' (the SR-IOV guests, tests/kernels/test_stock_kernel.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devcluster.cluster.controlplane import create_objects, wait_for
from devcluster.demo.allocation import allocated_claim, pod_for_template
from driver.kube.client import KubeClient

GUEST_OUT_ENV = "DRANET_GUEST_OUT"
"""Set in the SR-IOV guests: a folder the host reads after the boot (tests/kernels/test_stock_kernel.py)."""
SLICES_FILE = "sriov-slices.json"
"""What the guest's driver would publish for its PFs and VFs, left there for the host's scheduler."""
NODE_PLACEHOLDER, UID_PLACEHOLDER = "guest-node-name", "guest-node-uid"
"""The node the guest's slices name until the host publishes them for a node of its own."""


def request(name: str, expression: str) -> dict[str, Any]:
    exactly = {"deviceClassName": "dranet.net", "selectors": [{"cel": {"expression": expression}}]}
    return {"name": name, "exactly": exactly}


def whole(pf: str) -> str:
    """CEL: the PF itself (by its PCI address)."""
    return f'device.attributes["dra.net"].pciAddress == "{pf}"'


def vf_of(pf: str) -> str:
    """CEL: any VF of the PF."""
    return f'has(device.attributes["dra.net"].pfPciAddress) && device.attributes["dra.net"].pfPciAddress == "{pf}"'


def template(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": list(requests)}}},
    }


def pf_templates(pf0: str, pf1: str) -> list[dict[str, Any]]:
    """PF 0 whole, a VF of PF 0, a VF of PF 1, and PF 1 whole with one of its VFs in one claim."""
    return [
        template("pf0-whole", request("pf", whole(pf0))),
        template("pf0-vf", request("vf", vf_of(pf0))),
        template("pf1-vf", request("vf", vf_of(pf1))),
        template("pf1-and-its-vf", request("pf", whole(pf1)), request("vf", vf_of(pf1))),
    ]


def allocated_devices(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


@dataclass
class SchedulingNode:
    """A node whose pods the real scheduler places, in ``namespace``."""

    kube: KubeClient
    node: str
    namespace: str

    def schedule(self, pod: str, tmpl: str, within: float = 60) -> dict[str, Any]:
        """A pod of ``tmpl``'s claim: its claim once allocated."""
        create_objects(self.kube, [pod_for_template(pod, tmpl, self.node)], self.namespace)
        return wait_for(lambda: allocated_claim(self.kube, self.namespace, pod), within, what=f"{pod} allocated")

    def unschedulable(self, pod: str, tmpl: str) -> dict[str, Any]:
        """A pod of ``tmpl``'s claim that the scheduler cannot place: its PodScheduled condition."""
        create_objects(self.kube, [pod_for_template(pod, tmpl, self.node)], self.namespace)

        def condition() -> dict[str, Any] | None:
            p = self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{pod}")
            cond = [c for c in p.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"]
            return cond[0] if cond and cond[0]["status"] == "False" and cond[0].get("message") else None

        cond = wait_for(condition, 60, what=f"{pod} PodScheduled=False")
        assert cond["reason"] == "Unschedulable", cond
        return cond
