"""The claim device gauges follow what the real hooks do (real netns and veths): ready once the
NICs are in the pod, not after StopPodSandbox gave them back, gone with the claim."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import claim_device_counts
from driver.checkpoint.store import CheckpointStore
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import configure_host_nic, pod_json, prepare_claim

pytestmark = pytest.mark.root


def test_counts_through_run_stop_and_unprepare(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic1, peer1 = netns_factory.veth()
    nic2, peer2 = netns_factory.veth()
    configure_host_nic(nic1, peer1, netns_factory.subnet().cidr(1), [])
    configure_host_nic(nic2, peer2, netns_factory.subnet().cidr(1), [])
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = secrets.token_hex(8)
    claim_uid = prepare_claim(store, uid, [{"ifname": nic1}, {"ifname": nic2}, {"rdma_device": "mlx5_9"}])
    counts = lambda: store.read(claim_device_counts)
    assert counts() == (3, 1)  # prepared; the RDMA-only device has nothing to attach
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
    pod = json_format.ParseDict(pod_json(uid, f"/run/netns/{pod_ns}"), api.PodSandbox())
    hooks.run_pod_sandbox(pod)
    assert counts() == (3, 3)
    hooks.stop_pod_sandbox(pod)
    assert counts() == (3, 1)  # the NICs are home; the claim is still prepared
    hooks.claim_unprepared(store.read(lambda s: s.claims[claim_uid]))
    store.update(lambda s: s.claims.pop(claim_uid))
    assert counts() == (0, 0)
