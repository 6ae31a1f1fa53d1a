"""Pods that started while no driver was connected to the runtime (a lost NRI connection, a
handover's gap): the next Synchronize gives each live one its NICs in its running namespace, and
says on its claim when its containers were created without what the driver gives them. Real
hooks, real namespaces and veths; the runtime's side is the hooks' Synchronize call itself, and,
at the end, the real containerd/nri adaptation (Go harness) with a real driver process."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import IN_POD, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.nri import hooks as hooks_module
from harness.netns import NetnsFactory
from harness.nri import DriverProcess, Harness, configure_host_nic, link_facts, pod_json, prepare_claim
from tests.support.hook_node import Node

pytestmark = [pytest.mark.root]


class Sink:
    def __init__(self) -> None:
        self.ready: list[tuple[str, list[str]]] = []
        self.failed: list[tuple[str, str, str]] = []

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[Any]) -> None:
        self.ready.append((pod_uid, [r.interface_name for r in results]))

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        assert device in {d.device for d in claim.devices}, "Ready False goes on one of the claim's devices"
        self.failed.append((pod_uid, step, message))

    def nic_returned_unattended(self, *args: object, **kwargs: object) -> None:
        pass


def _container(pod: api.PodSandbox, state: int, name: str = "main") -> api.Container:
    c = json_format.ParseDict({"id": f"c-{secrets.token_hex(3)}", "name": name}, api.Container())
    c.pod_sandbox_id, c.state = pod.id, state  # type: ignore[assignment]
    return c


def _node(netns_factory: NetnsFactory, tmp_path: Path) -> tuple[Node, Sink, list[str]]:
    node = Node(netns_factory, tmp_path)
    sink, problems = Sink(), []
    node.hooks.status = sink
    node.hooks.on_problem = problems.append
    prepare_claim(node.store, node.uid, [{"ifname": node.nic}])
    return node, sink, problems


def test_a_pod_started_with_no_driver_connected_gets_its_nics_before_its_first_container(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node, sink, problems = _node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    node.hooks.synchronize([node.pod], [])  # no RunPodSandbox ever reached the driver; no container yet
    assert link_facts(node.nic, node.host) == before, "a sandbox without containers may be ending: wait"
    adjust = node.hooks.create_container(node.pod, _container(node.pod, api.CONTAINER_UNKNOWN))
    assert link_facts(node.nic, node.pod_ns) is not None, "the NIC is in the running pod"
    assert link_facts(node.nic, node.host) is None
    assert adjust is not None and {e.key: e.value for e in adjust.env}["DRANET_INTERFACES"] == node.nic
    assert node.store.read(lambda s: [m.step for m in s.pods[node.uid].devices]) == [IN_POD]
    assert sink.ready == [(node.uid, [node.nic])] and sink.failed == [], "nothing was missing"
    assert problems == ["started-without-driver"]
    node.hooks.create_container(node.pod, _container(node.pod, api.CONTAINER_UNKNOWN, "second"))
    node.hooks.synchronize([node.pod], [])  # a later reconnect: nothing more to do
    assert problems == ["started-without-driver"] and len(sink.ready) == 1
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) == before
    node.hooks.close()


def test_containers_created_without_the_driver_are_reported_on_the_claim(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node, sink, problems = _node(netns_factory, tmp_path)
    node.hooks.synchronize([node.pod], [_container(node.pod, api.CONTAINER_RUNNING)])
    assert link_facts(node.nic, node.pod_ns) is not None, "the NIC is given all the same"
    assert len(sink.failed) == 1
    uid, step, message = sink.failed[0]
    assert (uid, step) == (node.uid, "container setup")
    assert "were created while the driver was not connected to the container runtime" in message
    assert "(main)" in message and "delete the pod" in message
    assert problems == ["started-without-driver"]
    node.hooks.stop_pod_sandbox(node.pod)
    node.hooks.close()


def test_an_ending_pod_or_a_gone_namespace_is_left_alone(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    node, sink, problems = _node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    node.hooks.synchronize([node.pod], [_container(node.pod, api.CONTAINER_STOPPED)])
    gone = json_format.ParseDict(pod_json(node.uid, "/run/netns/dn-not-there"), api.PodSandbox())
    node.hooks.synchronize([gone], [])
    assert link_facts(node.nic, node.host) == before
    assert sink.ready == [] and sink.failed == [] and problems == []
    assert node.store.read(lambda s: node.uid not in s.pods)
    node.hooks.close()


def test_pods_past_the_synchronize_budget_are_reported_not_attached(
    netns_factory: NetnsFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks_module, "SYNC_ATTACH_BUDGET_S", -1.0)  # the budget is spent before the first
    node, sink, problems = _node(netns_factory, tmp_path)
    before = link_facts(node.nic, node.host)
    node.hooks.synchronize([node.pod], [_container(node.pod, api.CONTAINER_RUNNING)])
    assert link_facts(node.nic, node.host) == before
    assert [(u, s) for u, s, _ in sink.failed] == [(node.uid, "late attach")]
    assert "more such pods than fit the runtime's time limit" in sink.failed[0][2]
    assert problems == ["started-without-driver"]
    node.hooks.close()


@pytest.mark.slow
def test_the_real_runtime_side_a_pod_run_before_the_driver_connects(
    nri_harness: Harness, netns_factory: NetnsFactory, driver_procs: list[DriverProcess], tmp_path: Path
) -> None:
    pod_ns = netns_factory.netns()
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, "10.81.0.1/24", [])
    before = link_facts(nic)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(CheckpointStore(tmp_path), pod_uid, [{"ifname": nic}])
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    assert nri_harness.cmd("run", pod=pod)["ok"]  # no plugin connected: the runtime starts it alone
    assert link_facts(nic) == before
    drv = DriverProcess.start(nri_harness.socket, str(tmp_path))
    driver_procs.append(drv)
    res = nri_harness.cmd("wait-sync", count=1, timeout=15)
    assert res["ok"], f"{res}\n{drv.log()[-2000:]}"
    assert link_facts(nic) == before, "no container yet: the NIC waits for the first"
    res = nri_harness.cmd("create", pod=pod, container={"id": "c-1", "name": "main", "pod_sandbox_id": pod["id"]})
    assert res["ok"], f"{res}\n{drv.log()[-2000:]}"
    assert link_facts(nic, netns=pod_ns) is not None, drv.log()[-2000:]
    assert "attaching its NICs now" in drv.log()
    assert nri_harness.cmd("stop", pod=pod)["ok"]
    assert link_facts(nic) == before
