"""Cloud providers against recorded metadata responses served on 127.0.0.1 (tests/fixtures/cloud)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import pytest

from driver.api.v1alpha1.network_config import NetworkConfig, RouteConfig, RuleConfig
from driver.inventory.cloud import alibaba, aws, azure, gce, oke
from driver.inventory.cloud.base import DeviceIdentifiers
from driver.inventory.cloud.detection import PROVIDERS, detect, parse_provider
from driver.inventory.cloud.metadata import MAX_RESPONSE_BYTES, MetadataClient, MetadataError
from driver.inventory.cloud.service import CloudMetadata
from driver.model.device import Device, HostFacts
from tests.support.metadata_server import MetadataServer

ALL = [p.name for p in PROVIDERS]


def client(server: MetadataServer, timeout: float = 2.0) -> MetadataClient:
    return MetadataClient(server.url, timeout=timeout)


@pytest.mark.parametrize("provider", ALL)
def test_detection_finds_exactly_the_serving_provider(provider: str) -> None:
    with MetadataServer(provider) as server:
        c = client(server)
        assert [p.name for p in PROVIDERS if p.probe(c)] == [provider]
        found = detect(c)
        assert found is not None and found.name == provider


def test_detection_of_nothing_is_quick() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there: every probe is refused at once
    started = time.monotonic()
    assert detect(MetadataClient(f"http://127.0.0.1:{port}", timeout=1.0)) is None
    assert time.monotonic() - started < 3


def test_gce_attributes_by_mac() -> None:
    with MetadataServer("gce") as server:
        inst = gce.fetch(client(server))
    assert ("GET", "/computeMetadata/v1/instance/attributes/physical_host") in server.requests
    node = {
        "gce.dra.net/machineType": "a3-ultragpu-8g",
        "gce.dra.net/block": "b7c3a1f2e4d6089a",
        "gce.dra.net/subBlock": "5e2f9c1d7a3b4e60",
        "gce.dra.net/host": "0c9d8e7f6a5b4c3d",
    }
    assert inst.device_attributes(DeviceIdentifiers("pci-x", mac="42:01:c0:a8:01:02")) == {
        **node,
        "gce.dra.net/networkName": "rdma-hpc-vpc",
        "gce.dra.net/networkProjectNumber": 987654321098,
        "gce.dra.net/ipAliases": "192.168.64.0/26,192.168.65.0/26",
    }
    # No aliases: no ipAliases attribute; an unknown MAC: only the VM-wide ones.
    assert "gce.dra.net/ipAliases" not in inst.device_attributes(DeviceIdentifiers("b", mac="42:01:c0:a8:02:02"))
    assert inst.device_attributes(DeviceIdentifiers("c", mac="02:00:00:00:00:01")) == node
    assert inst.device_config(DeviceIdentifiers("pci-x", mac="42:01:c0:a8:01:02")) is None


def test_gce_without_physical_host_has_no_placement() -> None:
    # A VM without compact placement: no physical_host (the server answers 404).
    with MetadataServer("gce") as server:
        original = server.body

        def body(name: str) -> bytes:
            if name == "physical_host.txt":
                raise FileNotFoundError(name)  # -> the handler fails -> the client sees an error
            return original(name)

        server.body = body  # type: ignore[method-assign]
        inst = gce.fetch(client(server))
    assert inst.device_attributes(DeviceIdentifiers("x")) == {"gce.dra.net/machineType": "a3-ultragpu-8g"}


def test_azure_attributes_and_policy_routing_config() -> None:
    with MetadataServer("azure") as server:
        inst = azure.fetch(client(server))
    vm = {
        "azure.dra.net/vmSize": "Standard_ND96isr_H100_v5",
        "azure.dra.net/placementGroupId": "8a2e6f1c-4b7d-4e93-9c05-3f1a7d2b6e48",
        "azure.dra.net/interconnectGroupId": "a3f9c2d17e4b",
        "azure.dra.net/interconnectSubgroupId": "a3f9c2d17e4b-07",
    }
    # IB NICs are not Azure NICs (not in IMDS): VM-wide attributes only, no config.
    ib = DeviceIdentifiers("pci-0101-00-00-0", mac="00:00:01:49:fe:80:00:00:00:00:00:00:00:15:5d:ff:fd:33:ff:00")
    assert inst.device_attributes(ib) == vm
    assert inst.device_config(ib) is None
    second = DeviceIdentifiers("eth1", mac="60:45:bd:a1:b2:d4")
    assert inst.device_attributes(second) == {**vm, "azure.dra.net/subnet": "10.225.4.0/24"}
    assert inst.device_config(second) == NetworkConfig(
        routes=(RouteConfig(destination="0.0.0.0/0", gateway="10.225.4.1", table=101),),
        rules=(RuleConfig(source="10.225.4.0/24", table=101),),
    )
    first = inst.device_config(DeviceIdentifiers("eth0", mac="60:45:BD:A1:B2:C3"))
    assert first is not None and first.rules == (RuleConfig(source="10.224.0.0/16", table=100),)


def test_azure_bad_network_drops_per_nic_data_only() -> None:
    with MetadataServer("azure", overrides={"network.json": b'{"interface": "nope"}'}) as server:
        inst = azure.fetch(client(server))
    assert inst.interfaces == ()
    assert inst.device_attributes(DeviceIdentifiers("x"))["azure.dra.net/vmSize"] == "Standard_ND96isr_H100_v5"
    bad_subnet = {
        "interface": [{"macAddress": "6045BDA1B2C3", "ipv4": {"subnet": [{"address": "10.0.0.5", "prefix": "24"}]}}]
    }
    with pytest.raises(MetadataError, match="not an IPv4 subnet"):
        azure.parse_network(bad_subnet)


def test_aws_efa_device_groups_on_neuron_instances() -> None:
    with MetadataServer("aws") as server:
        inst = aws.fetch(client(server))
    assert inst.instance_type == "trn2.48xlarge"
    efa = DeviceIdentifiers("pci-0000-c9-00-0", pci_address="0000:c9:00.0", pci_driver="efa", rdma_device="rdmap201s0")
    # The values of the aws-neuron library's own test for this EFA on trn2.
    assert inst.device_attributes(efa) == {
        "resource.aws.com/devicegroup1_id": "0000:c9:00.0",
        "resource.aws.com/devicegroup4_id": "13713e551cd37c19",
        "resource.aws.com/devicegroup8_id": "3593812b8066a078",
        "resource.aws.com/devicegroup16_id": "821d14afaf11327d",
    }
    # Same group of 4 (Neuron devices 0-3) -> same hash; an ENA or a non-Neuron instance: nothing.
    other = inst.device_attributes(DeviceIdentifiers("b", pci_address="0000:ca:00.0", pci_driver="efa"))
    assert other["resource.aws.com/devicegroup4_id"] == "13713e551cd37c19"
    assert inst.device_attributes(DeviceIdentifiers("ena", pci_address="0000:c9:00.0", pci_driver="ena")) == {}
    assert aws.AwsInstance("p5.48xlarge").device_attributes(efa) == {}
    assert aws.group_hash(["0000:ca:00.0", "0000:c9:00.0", "0000:c9:00.0"]) == "5ba52364feae51b7"


def test_aws_trn1_shared_efa_is_in_its_neurons_groups() -> None:
    table = aws.NEURON_TO_EFA["trn1"]
    groups = aws.device_groups(table, "0000:10:1a.0")  # Neuron devices 0 and 1
    assert groups["resource.aws.com/devicegroup1_id"] == "0000:10:1a.0"
    assert groups["resource.aws.com/devicegroup4_id"] == aws.group_hash([table[n] for n in range(4)])


def test_oke_topology_suffixes_fit_the_attribute_limit() -> None:
    with MetadataServer("oke") as server:
        inst = oke.fetch(client(server))
    attrs = inst.device_attributes(DeviceIdentifiers("any"))
    host = json.loads(server.body("host.json"))
    topo = host["rdmaTopologyData"]
    assert attrs == {
        "oke.dra.net/hpcIslandId": topo["customerHPCIslandId"].rsplit(".", 1)[1][-60:],
        "oke.dra.net/networkBlockId": topo["customerNetworkBlock"].rsplit(".", 1)[1][-60:],
        "oke.dra.net/localBlockId": topo["customerLocalBlock"].rsplit(".", 1)[1][-60:],
        "oke.dra.net/gpuMemoryFabricId": topo["customerGpuMemoryFabric"].rsplit(".", 1)[1][-60:],
        "oke.dra.net/rackId": host["rackId"],
    }
    assert all(len(v) <= 64 for v in attrs.values())
    assert oke.parse_host({"id": "x"}).device_attributes(DeviceIdentifiers("a")) == {}
    with pytest.raises(MetadataError, match="not an OCID"):
        oke.parse_host({"rdmaTopologyData": {"customerHPCIslandId": "fakehash"}})


def test_alibaba_instance_type_and_erdma() -> None:
    with MetadataServer("alibaba") as server:
        inst = alibaba.fetch(client(server))
    assert inst.device_attributes(DeviceIdentifiers("pci-0000-00-0b-0", rdma_device="erdma_0")) == {
        "alibaba.dra.net/instanceType": "ecs.gn8is-2x.8xlarge",
        "alibaba.dra.net/erdma": True,
    }
    assert inst.device_attributes(DeviceIdentifiers("eth1")) == {"alibaba.dra.net/instanceType": "ecs.gn8is-2x.8xlarge"}


def test_metadata_errors_are_one_type() -> None:
    with MetadataServer("gce", mode="garbage") as server:
        with pytest.raises(MetadataError, match="not JSON"):
            client(server).get(gce.HOST, "/x").json()
        with pytest.raises(MetadataError, match="not JSON"):
            gce.fetch(client(server))  # a captive portal answering 200 is not a metadata server
    with MetadataServer("azure", overrides={"compute.json": b"x" * (MAX_RESPONSE_BYTES + 10)}) as server:
        with pytest.raises(MetadataError, match="larger than"):
            azure.fetch(client(server))
    with MetadataServer("azure", mode="slow", delay=1.5) as server:
        started = time.monotonic()
        with pytest.raises(MetadataError):
            azure.fetch(client(server, timeout=0.3))
        assert time.monotonic() - started < 1.2


def test_parse_provider_accepts_ours_and_the_go_hints() -> None:
    assert parse_provider("auto") == "auto" and parse_provider("AZURE") == "azure" and parse_provider("") == "auto"
    assert parse_provider("NONE") == "none" and parse_provider("Gce") == "gce"
    with pytest.raises(ValueError, match="--cloud-provider: 'CKS' is not one of"):
        parse_provider("CKS")


# -- the background service -------------------------------------------------------------------


def _nic(name: str, mac: str) -> Device:
    return Device(name, {"dra.net/mac": mac, "dra.net/rdma": False}, HostFacts(ifname=name))


def test_service_publishes_without_attributes_until_the_service_recovers(caplog: pytest.LogCaptureFixture) -> None:
    changed = threading.Event()
    with MetadataServer("azure", mode="down") as server:
        cloud = CloudMetadata("azure", MetadataClient(server.url, 0.5), on_change=changed.set, retry_initial=0.05)
        with caplog.at_level(logging.DEBUG, logger="driver.inventory.cloud.service"):
            started = time.monotonic()
            cloud.start()
            assert not cloud.wait(0.5)  # start is held for the bounded wait only
            assert time.monotonic() - started < 1.0
            devices = [_nic("eth1", "60:45:bd:a1:b2:d4")]
            assert cloud.annotate(devices) == devices  # published without cloud attributes
            assert cloud.device_config(devices[0]) is None
            time.sleep(0.3)  # several retries happen
            server.mode = "ok"
            assert changed.wait(5), "on_change (rescan) not called when the metadata arrived"
        cloud.stop()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and cloud.attempts > 2  # logged once, retried quietly
    (out,) = cloud.annotate(devices)
    assert out.attributes["azure.dra.net/placementGroupId"] == "8a2e6f1c-4b7d-4e93-9c05-3f1a7d2b6e48"
    assert out.attributes["azure.dra.net/subnet"] == "10.225.4.0/24"
    assert out.attributes["dra.net/mac"] == "60:45:bd:a1:b2:d4"
    assert cloud.device_config(devices[0]) is not None


def test_service_auto_detects_and_none_does_nothing() -> None:
    with MetadataServer("oke") as server:
        cloud = CloudMetadata("auto", MetadataClient(server.url, 1.0))
        cloud.start()
        assert cloud.wait(5)
        assert cloud.instance is not None and cloud.instance.provider == "oke"
    off = CloudMetadata("none")
    off.start()
    assert off.wait(0) is False and off.instance is None


def test_long_cloud_values_stay_within_the_api_limits() -> None:
    nics = json.loads(MetadataServer("gce").body("network-interfaces.json"))
    nics[1]["ipAliases"] = [f"192.168.{i}.0/26" for i in range(20)]
    with MetadataServer("gce", overrides={"network-interfaces.json": json.dumps(nics).encode()}) as server:
        cloud = CloudMetadata("gce", MetadataClient(server.url))
        cloud.start()
        assert cloud.wait(5)
    (dev,) = cloud.annotate([_nic("eth1", "42:01:c0:a8:01:02")])
    aliases = dev.attributes["gce.dra.net/ipAliases"]
    assert isinstance(aliases, str) and len(aliases) <= 64
    assert aliases.split(",") == [f"192.168.{i}.0/26" for i in range(len(aliases.split(",")))]  # whole CIDRs
