"""RDMA exclusive netns mode through the NRI hooks: a pod whose RDMA device cannot follow its
netdev is refused naming the device, and the netdev is rolled back home."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.netlink import rdma_nldev
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from harness.nri import pod_json, prepare_claim
from tests.support import kernel

pytestmark = pytest.mark.kernel


@pytest.mark.root
def test_exclusive_mode_refuses_the_pod_naming_the_device_and_rolls_back(netns_factory, tmp_path: Path) -> None:
    ns = netns_factory.netns()
    host, _peer = netns_factory.veth()
    store = CheckpointStore(tmp_path / "state", tmp_path / "run")
    prepare_claim(store, "pod-rdma", [{"ifname": host, "rdma_device": "mlx5_0", "device": "pci-0000-8a-00-0"}])
    hooks = NRIHooks(store, rdma_exclusive=True)
    pod = json_format.Parse(json.dumps(pod_json("pod-rdma", f"/run/netns/{ns}")), api.PodSandbox())
    kernel.skip_if(
        rdma_nldev.netns_mode() != "unknown", "RDMA netlink", "the refusal path needs a device that cannot move"
    )
    with pytest.raises(HookError) as err:
        hooks.run_pod_sandbox(pod)
    assert "device pci-0000-8a-00-0: rdma move failed: RDMA device mlx5_0" in str(err.value)
    assert os.path.exists(f"/sys/class/net/{host}"), "the netdev must be back on the host"
    assert store.read(lambda s: s.pods.get("pod-rdma")) is None
