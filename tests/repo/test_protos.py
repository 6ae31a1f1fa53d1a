"""The committed gRPC stubs are fresh, and our .proto files carry the upstream wire contract.

Field numbers and full service names are what the kubelet matches on; a typo here
would silently break registration or decode garbage, so they are pinned via descriptors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hack import gen_protos

OUR_PROTOS = ["pluginregistration", "dra_v1", "dra_v1beta1", "dra_health_v1alpha1"]


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    generated = {p.name: p for p in gen_protos.generate(tmp_path / "out")}
    stems = sorted(p.stem for p in gen_protos.PROTO_DIR.glob("*.proto"))
    assert set(OUR_PROTOS) <= set(stems)
    for stem in stems:
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            name = stem + suffix
            committed = gen_protos.PROTO_DIR / name
            assert name in generated, f"{name} was not generated"
            assert committed.exists(), f"{name} is not committed; run python hack/gen_protos.py"
            assert committed.read_text() == generated[name].read_text(), (
                f"{name} is stale; run python hack/gen_protos.py"
            )


def _fields(message) -> dict[str, tuple[int, int]]:
    return {f.name: (f.number, f.type) for f in message.DESCRIPTOR.fields}


def test_registration_contract() -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    from dranet_proto import pluginregistration_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["Registration"]
    assert svc.full_name == "pluginregistration.Registration"
    assert [m.name for m in svc.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert _fields(pb.PluginInfo) == {
        "type": (1, F.TYPE_STRING),
        "name": (2, F.TYPE_STRING),
        "endpoint": (3, F.TYPE_STRING),
        "supported_versions": (4, F.TYPE_STRING),
    }
    assert pb.PluginInfo.DESCRIPTOR.fields_by_name["supported_versions"].is_repeated
    assert _fields(pb.RegistrationStatus) == {"plugin_registered": (1, F.TYPE_BOOL), "error": (2, F.TYPE_STRING)}
    assert _fields(pb.InfoRequest) == {} and _fields(pb.RegistrationStatusResponse) == {}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_contract(version: str) -> None:
    import importlib

    from google.protobuf.descriptor import FieldDescriptor as F

    pb = importlib.import_module(f"dranet_proto.dra_{version}_pb2")
    grpc_mod = importlib.import_module(f"dranet_proto.dra_{version}_pb2_grpc")
    svc = pb.DESCRIPTOR.services_by_name["DRAPlugin"]
    assert svc.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert {m.name for m in svc.methods} == {"NodePrepareResources", "NodeUnprepareResources"}
    assert all(not m.server_streaming and not m.client_streaming for m in svc.methods)
    src = Path(grpc_mod.__file__).read_text()
    assert f"'/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources'" in src
    assert f"'/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources'" in src

    device = {
        "request_names": (1, F.TYPE_STRING),
        "pool_name": (2, F.TYPE_STRING),
        "device_name": (3, F.TYPE_STRING),
        "cdi_device_ids": (4, F.TYPE_STRING),
    }
    if version == "v1":
        device["share_id"] = (5, F.TYPE_STRING)
        assert pb.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert _fields(pb.Device) == device
    assert _fields(pb.Claim) == {"namespace": (1, F.TYPE_STRING), "uid": (2, F.TYPE_STRING), "name": (3, F.TYPE_STRING)}
    assert _fields(pb.NodePrepareResourcesRequest) == {"claims": (1, F.TYPE_MESSAGE)}
    assert _fields(pb.NodeUnprepareResourcesRequest) == {"claims": (1, F.TYPE_MESSAGE)}
    assert _fields(pb.NodePrepareResourceResponse) == {"devices": (1, F.TYPE_MESSAGE), "error": (2, F.TYPE_STRING)}
    assert _fields(pb.NodeUnprepareResourceResponse) == {"error": (1, F.TYPE_STRING)}
    for resp in (pb.NodePrepareResourcesResponse, pb.NodeUnprepareResourcesResponse):
        claims = resp.DESCRIPTOR.fields_by_name["claims"]
        assert claims.number == 1 and claims.message_type.GetOptions().map_entry
        assert claims.message_type.fields_by_name["key"].type == F.TYPE_STRING


def test_health_contract() -> None:
    from google.protobuf.descriptor import FieldDescriptor as F

    from dranet_proto import dra_health_v1alpha1_pb2 as pb

    svc = pb.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    assert svc.full_name == "v1alpha1.DRAResourceHealth"
    (method,) = svc.methods
    assert method.name == "NodeWatchResources" and method.server_streaming and not method.client_streaming
    assert dict(pb.HealthStatus.items()) == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    assert _fields(pb.DeviceIdentifier) == {"pool_name": (1, F.TYPE_STRING), "device_name": (2, F.TYPE_STRING)}
    assert _fields(pb.DeviceHealth) == {
        "device": (1, F.TYPE_MESSAGE),
        "health": (2, F.TYPE_ENUM),
        "last_updated_time": (3, F.TYPE_INT64),
        "health_check_timeout_seconds": (4, F.TYPE_INT64),
        "message": (5, F.TYPE_STRING),
    }
    assert _fields(pb.NodeWatchResourcesResponse) == {"devices": (1, F.TYPE_MESSAGE)}


def test_wire_compat_v1_v1beta1() -> None:
    """v1beta1 bytes decode as v1 and back (the kubelet converts the same way)."""
    from dranet_proto import dra_v1_pb2 as v1
    from dranet_proto import dra_v1beta1_pb2 as v1beta1

    beta = v1beta1.NodePrepareResourceResponse(
        devices=[v1beta1.Device(request_names=["nic"], pool_name="node-a", device_name="pci-0000-8a-00-0")]
    )
    decoded = v1.NodePrepareResourceResponse.FromString(beta.SerializeToString())
    assert decoded.devices[0].device_name == "pci-0000-8a-00-0" and not decoded.devices[0].HasField("share_id")
