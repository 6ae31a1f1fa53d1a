"""The kubelet's gRPC requests as untrusted bytes: random bytes, and well-formed requests with
random claim references, sent over the real unix socket to the real KubeletPlugin (v1 and
v1beta1), a real Preparer, checkpoint and KubeClient (fake apiserver). Property: an answer with
an entry per claim, or a gRPC error status for bytes that are not a request; the plugin keeps
serving; never a crash."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dranet_proto import dra_v1_pb2 as v1_pb
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.config import DriverConfig
from driver.dra.plugin import KubeletPlugin
from driver.kube.client import KubeClient
from driver.metrics import Metrics
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory
from tests.fuzz import FUZZ, LoopThread

SERVICES = ["k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"]
METHODS = ["NodePrepareResources", "NodeUnprepareResources"]


@pytest.fixture(scope="module")
def dra_channel() -> Iterator[grpc.Channel]:
    with tempfile.TemporaryDirectory(prefix="dranet-fz-") as d, FakeAPIServer() as api:
        root = Path(d)
        api.add_claim(make_claim("ns", "real", "uid-real", [result("pci-0000-8a-00-0", NODE)]))
        config = DriverConfig(node_name=NODE, kubelet_root=str(root / "kubelet"), state_dir=str(root / "state"))
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(root / "kubeconfig")))
        preparer = Preparer(kube, CheckpointStore(config.state_dir), ClaimBuilder(inventory, "dra.net", NODE))
        loop = LoopThread()

        async def make() -> KubeletPlugin:  # grpc.aio objects belong to the loop they are made on
            sockets = (config.dra_socket, config.registration_socket)
            plugin = KubeletPlugin(preparer, config.driver_name, *sockets, metrics=Metrics())
            await plugin.start()
            return plugin

        plugin = loop.run(make())
        channel = grpc.insecure_channel(f"unix://{config.dra_socket}")
        try:
            yield channel
        finally:
            channel.close()
            loop.run(plugin.stop(grace=0.1))
            loop.close()


def _call(channel: grpc.Channel, service: str, method: str, payload: bytes) -> bytes:
    rpc = channel.unary_unary(f"/{service}/{method}", request_serializer=None, response_deserializer=None)
    return rpc(payload, timeout=20)


@FUZZ
@given(st.sampled_from(SERVICES), st.sampled_from(METHODS), st.binary(max_size=200))
def test_random_bytes_as_a_request(dra_channel: grpc.Channel, service: str, method: str, data: bytes) -> None:
    try:
        answer = _call(dra_channel, service, method, data)
    except grpc.RpcError as exc:
        # Bytes that are not a request: INVALID_ARGUMENT naming the message, for this call only.
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "the request is not a" in exc.details(), exc
        return
    request = v1_pb.NodePrepareResourcesRequest.FromString(data)
    response = v1_pb.NodePrepareResourcesResponse.FromString(answer)
    assert set(response.claims) == {c.uid for c in request.claims}


claims = st.lists(
    st.builds(
        v1_pb.Claim,
        namespace=st.sampled_from(["ns", "", "a/b", "..", "ns%2F", "\u00e9"]) | st.text(max_size=8),
        name=st.sampled_from(["real", "", "x?y", "../../nodes", "a" * 300]) | st.text(max_size=8),
        uid=st.sampled_from(["uid-real", "", "uid-x"]) | st.text(max_size=8),
    ),
    max_size=5,
)


@FUZZ
@given(st.sampled_from(SERVICES), claims)
def test_random_claim_references(dra_channel: grpc.Channel, service: str, refs: list) -> None:
    request = v1_pb.NodePrepareResourcesRequest(claims=refs)
    response = v1_pb.NodePrepareResourcesResponse.FromString(
        _call(dra_channel, service, "NodePrepareResources", request.SerializeToString())
    )
    assert set(response.claims) == {c.uid for c in refs}  # an answer for every claim, never left out
    for ref in refs:
        entry = response.claims[ref.uid]
        if (ref.namespace, ref.name, ref.uid) != ("ns", "real", "uid-real"):
            # A uid the kubelet repeats with another name may answer either way; otherwise: an error.
            assert entry.error or ref.uid == "uid-real", (ref, entry)
    unprepare = v1_pb.NodeUnprepareResourcesRequest(claims=[r for r in refs if r.uid != "uid-real"])
    answer = v1_pb.NodeUnprepareResourcesResponse.FromString(
        _call(dra_channel, service, "NodeUnprepareResources", unprepare.SerializeToString())
    )
    assert set(answer.claims) == {c.uid for c in unprepare.claims}
