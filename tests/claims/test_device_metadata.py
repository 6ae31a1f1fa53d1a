"""Device metadata files (KEP-5304): written at prepare, completed at pod start, removed at unprepare.

A real Preparer over a fake apiserver and a real checkpoint; the files are read back as a
container would (the CDI spec's hostPath and containerPath), and decoded by the upstream Go
decoder with its validation in ``test_the_upstream_decoder_accepts_our_files``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.state import IN_POD, DriverState, MovedDevice, PodNetState, PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import (
    CONTAINER_DIR,
    MAX_ATTRIBUTES,
    MetadataDocument,
    MetadataPaths,
    decode_first,
    pair_up,
)
from driver.claims.metadata_sink import MetadataStatusSink
from driver.claims.prepare import Preparer
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import ClaimRef, PrepareResult
from driver.kube.client import KubeClient
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory

UID = "0b5c7a52-1111-4222-8333-944455556666"


@pytest.fixture
def paths(tmp_path: Path) -> MetadataPaths:
    return MetadataPaths("dra.net", str(tmp_path / "plugins/dra.net"), str(tmp_path / "cdi"))


@pytest.fixture
def meta_preparer(api: FakeAPIServer, tmp_path: Path, paths: MetadataPaths) -> Preparer:
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    writer = DeviceMetadataWriter(paths)
    builder = ClaimBuilder(inventory, "dra.net", NODE)
    return Preparer(kube, CheckpointStore(tmp_path / "state"), builder, metadata=writer)


def _template_claim(api: FakeAPIServer, uid: str = UID, name: str = "pod-devices-x7k2p") -> dict[str, Any]:
    claim = make_claim("ns", name, uid, [result("pci-0000-8a-00-0", NODE), result("pci-0000-8a-00-1", NODE)])
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "devices"}
    return api.add_claim(claim)


def _stream(path: Path) -> list[dict[str, Any]]:
    """Every object of a metadata stream, in order."""
    text, out, pos = path.read_text(), [], 0
    decoder = json.JSONDecoder()
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
    return out


async def test_prepare_writes_the_file_the_cdi_spec_and_answers_the_cdi_device(
    api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths
) -> None:
    _template_claim(api)
    out = (await meta_preparer.prepare([ClaimRef("ns", "pod-devices-x7k2p", UID)]))[UID]
    assert out.error == ""
    # One CDI device per NIC (the kubelet reports each device's health under its first CDI device).
    assert [d.cdi_device_ids for d in out.devices] == [
        [f"dra.net/metadata={UID}_nic_pci-0000-8a-00-0"],
        [f"dra.net/metadata={UID}_nic_pci-0000-8a-00-1"],
    ]

    spec = json.loads(Path(paths.cdi_dir, f"dra.net_metadata_{UID}_nic.json").read_text())
    # The UID starts with a digit: a device name the CDI library takes from spec version 0.5.0 on.
    assert spec["kind"] == "dra.net/metadata" and spec["cdiVersion"] == "0.5.0"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}_nic_pci-0000-8a-00-0", f"{UID}_nic_pci-0000-8a-00-1"]
    device = spec["devices"][0]
    assert spec["devices"][1]["containerEdits"] == device["containerEdits"]  # the same file, one mount
    [mount] = device["containerEdits"]["mounts"]
    # A template's claim: keyed by the pod's claim name (the generated name is not predictable).
    assert mount["containerPath"] == f"{CONTAINER_DIR}/resourceclaimtemplates/devices/nic/dra.net-metadata.json"
    assert mount["options"] == ["ro", "bind"]
    host = Path(mount["hostPath"])
    assert host == Path(paths.directory, "dra-device-metadata/ns_pod-devices-x7k2p/nic/metadata.json")
    assert host.stat().st_mode & 0o777 == 0o644

    objects = _stream(host)
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    assert objects[0] == {**objects[1], "apiVersion": objects[0]["apiVersion"]}  # one meaning, two versions
    doc = objects[0]
    assert doc["kind"] == "DeviceMetadata" and doc["podClaimName"] == "devices"
    assert doc["metadata"] == {"name": "pod-devices-x7k2p", "namespace": "ns", "uid": UID, "generation": 1}
    [request] = doc["requests"]
    assert request["name"] == "nic"
    assert [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
        ("dra.net", NODE, "pci-0000-8a-00-0"),
        ("dra.net", NODE, "pci-0000-8a-00-1"),
    ]
    assert request["devices"][0]["attributes"]["dra.net/ifName"] == {"string": "ib0"}
    assert request["devices"][0]["attributes"]["dra.net/rdma"] == {"bool": True}


async def test_a_claim_by_name_is_under_resourceclaims(
    api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths
) -> None:
    api.add_claim(make_claim("ns", "shared-nic", UID, [result("pci-0000-8a-00-2", NODE)]))
    assert (await meta_preparer.prepare([ClaimRef("ns", "shared-nic", UID)]))[UID].error == ""
    spec = json.loads(paths.cdi_spec(UID, "nic").read_text())
    path = spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"]
    assert path == f"{CONTAINER_DIR}/resourceclaims/shared-nic/nic/dra.net-metadata.json"
    assert "podClaimName" not in decode_first(paths.file("ns", "shared-nic", "nic").read_bytes())


async def test_a_retry_keeps_the_file_and_a_lost_cdi_spec_is_written_again(
    api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths, tmp_path: Path
) -> None:
    _template_claim(api)
    ref = ClaimRef("ns", "pod-devices-x7k2p", UID)
    first = await meta_preparer.prepare([ref])
    file = paths.file("ns", "pod-devices-x7k2p", "nic")
    meta_preparer.metadata.network_ready(  # type: ignore[union-attr]
        meta_preparer.store.read(lambda s: s.claims[UID]), [DeviceResult("pci-0000-8a-00-0", "ib0")]
    )
    updated = file.read_bytes()
    paths.cdi_spec(UID, "nic").unlink()  # a reboot empties /var/run/cdi; the plugin dir stays
    gets = api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/")
    again = await meta_preparer.prepare([ref])
    assert again == first
    assert file.read_bytes() == updated  # generation 2 kept: the retry did not reset it
    spec = json.loads(paths.cdi_spec(UID, "nic").read_text())
    assert "resourceclaimtemplates/devices/" in spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"]
    assert api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") == gets  # from the file

    shutil.rmtree(paths.claim_dir("ns", "pod-devices-x7k2p"))  # both gone: from the checkpoint alone
    paths.cdi_spec(UID, "nic").unlink()
    assert await meta_preparer.prepare([ref]) == first
    assert decode_first(file.read_bytes())["podClaimName"] == "devices"
    assert api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") == gets

    # A record an older driver wrote (no facts kept), read by a restarted driver: one GET.
    record = meta_preparer.store.read(lambda s: s.claims[UID])
    older = replace(record, devices=[replace(d, metadata=None) for d in record.devices])
    meta_preparer.store.update(lambda s: s.claims.__setitem__(UID, older))
    shutil.rmtree(paths.claim_dir("ns", "pod-devices-x7k2p"))
    paths.cdi_spec(UID, "nic").unlink()
    store = CheckpointStore(tmp_path / "state")
    restarted = Preparer(meta_preparer.kube, store, meta_preparer.builder, metadata=DeviceMetadataWriter(paths))
    assert await restarted.prepare([ref]) == first
    assert decode_first(file.read_bytes())["podClaimName"] == "devices"
    assert api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") == gets + 1


def _pods_hold(store: CheckpointStore, record: PreparedClaim, *pods: str) -> None:
    """Each pod's state holding the claim's NICs, in the pod (what RunPodSandbox commits)."""

    def put(s: DriverState) -> None:
        for pod in pods:
            moved = [MovedDevice(d.device, f"ib{i}", f"net{i}", step=IN_POD) for i, d in enumerate(record.devices)]
            s.pods[pod] = PodNetState(pod, devices=moved)

    store.update(put)


async def test_pod_start_adds_network_data_and_bumps_the_generation(
    api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths
) -> None:
    _template_claim(api)
    await meta_preparer.prepare([ClaimRef("ns", "pod-devices-x7k2p", UID)])
    record = meta_preparer.store.read(lambda s: s.claims[UID])
    seen: list[str] = []

    class Status:
        def pod_network_ready(self, pod_uid: str, claim: Any, results: list[DeviceResult]) -> None:
            seen.append(pod_uid)

    sink = MetadataStatusSink(meta_preparer.metadata, Status())  # type: ignore[arg-type]
    results = [
        DeviceResult("pci-0000-8a-00-0", "net1", ["192.168.7.2/24", "fd07::2/64"], "0c:42:a1:00:00:01"),
        DeviceResult("pci-0000-8a-00-1", "ib1"),
    ]
    _pods_hold(meta_preparer.store, record, "pod-1", "pod-2")  # as RunPodSandbox leaves them
    sink.pod_network_ready("pod-1", record, results)
    assert seen == ["pod-1"]  # the status writer still gets it
    sink.settle("pod-1")  # what CreateContainer waits for
    assert sink._pending == {}  # nothing kept for a pod once its rewrites are done
    doc = decode_first(paths.file("ns", "pod-devices-x7k2p", "nic").read_bytes())
    assert doc["metadata"]["generation"] == 2 and doc["podClaimName"] == "devices"
    first, second = doc["requests"][0]["devices"]
    assert first["networkData"] == {
        "interfaceName": "net1",
        "ips": ["192.168.7.2/24", "fd07::2/64"],
        "hardwareAddress": "0c:42:a1:00:00:01",
    }
    assert first["attributes"]["dra.net/podInterfaceName"] == {"string": "net1"}
    assert second["networkData"] == {"interfaceName": "ib1"}
    assert first["attributes"]["dra.net/ifName"] == {"string": "ib0"}  # the host's name stays too
    sink.pod_network_ready("pod-2", record, results)  # the pod's next sandbox
    sink.settle("pod-2")
    sink.close()
    assert decode_first(paths.file("ns", "pod-devices-x7k2p", "nic").read_bytes())["metadata"]["generation"] == 3


async def test_unprepare_removes_the_files(api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths) -> None:
    _template_claim(api)
    ref = ClaimRef("ns", "pod-devices-x7k2p", UID)
    await meta_preparer.prepare([ref])
    assert await meta_preparer.unprepare([ref]) == {UID: ""}
    assert meta_preparer.metadata is not None
    assert meta_preparer.metadata.remove_leaving() == 1  # after the answer (tests/claims/test_metadata_leaving.py)
    assert not paths.claim_dir("ns", "pod-devices-x7k2p").exists()
    assert list(Path(paths.cdi_dir).iterdir()) == []


async def test_an_unwritable_directory_is_the_claims_error(
    api: FakeAPIServer, meta_preparer: Preparer, paths: MetadataPaths
) -> None:
    Path(paths.cdi_dir).parent.mkdir(parents=True, exist_ok=True)
    Path(paths.cdi_dir).write_text("not a directory")
    _template_claim(api)
    out = (await meta_preparer.prepare([ClaimRef("ns", "pod-devices-x7k2p", UID)]))[UID]
    assert out.error.startswith("device metadata of ResourceClaim ns/pod-devices-x7k2p:")
    assert not out.devices


def test_at_most_32_attributes_with_the_drivers_own_first(paths: MetadataPaths) -> None:
    from driver.checkpoint.state import PreparedDevice
    from driver.model.device import CharDevice, Device, HostFacts

    attrs: dict[str, Any] = {f"dra.net/extra{i}": i for i in range(40)} | {"dra.net/rdma": True}
    host = HostFacts(char_devices=[CharDevice("/dev/infiniband/uverbs0", 231, 192)], rdma_device="mlx5_0")
    device = PreparedDevice("nic", NODE, "nic-0", Device("nic-0", attrs, host))
    entry = MetadataDocument(paths, "dra.net")._device(device, None)
    assert len(entry["attributes"]) == MAX_ATTRIBUTES
    assert entry["attributes"]["dra.net/rdmaCharDevices"] == {"string": "uverbs0"}
    assert entry["attributes"]["dra.net/rdma"] == {"bool": True}  # ranked above the unknown ones


def test_gpus_pair_with_the_closest_nics(sysfs_trees: Any) -> None:
    """DGX H100: each GPU shares a PCIe switch with one NIC (PIX); no NIC pairs twice."""
    from driver.inventory.topology import read_topology

    root = str(sysfs_trees.get("dgx-h100"))
    topo = read_topology(root, ["enp170s0f0np0"])
    gpus = [("gpu.nvidia.com", f"gpu-{i}", g.pci_bus_id) for i, g in enumerate(topo.gpus)]
    ib = [n for n in topo.nics if n.rdma_device and any(x.startswith("ibp") for x in n.netdevs)]
    nics = [(n.device_name or "", n.pci_bus_id) for n in ib]
    pairs = pair_up(root, gpus, nics)
    assert len(pairs) == len(ib) == len(gpus) == 8
    assert {p.path for p in pairs.values()} == {"PIX"}
    assert len({p.pci_bus_id for p in pairs.values()}) == 8
    # Half the GPUs: each still gets its own switch's NIC, the other NICs stay unpaired.
    half = pair_up(root, gpus[:4], nics)
    assert len(half) == 4 and {p.path for p in half.values()} == {"PIX"}


GO_DECODER = Path(__file__).resolve().parents[2] / "harness" / "metadata_decoder"


def test_the_upstream_decoder_accepts_our_files(tmp_path: Path, paths: MetadataPaths) -> None:
    """k8s.io/dynamic-resource-allocation's own reader (devicemetadata.DecodeMetadataFromStream, with
    its validation) decodes a file this driver wrote after pod start."""
    from driver.checkpoint.state import PreparedClaim, PreparedDevice
    from harness.metadata_decoder_build import decoder_binary

    try:
        binary = decoder_binary()
    except (OSError, subprocess.CalledProcessError, RuntimeError) as exc:
        pytest.fail(f"cannot build the upstream decoder: {exc}")
    devices = [PreparedDevice("nic", NODE, name, dev) for name, dev in inventory(2).items()]
    claim = PreparedClaim(UID, "ns", "c1", ["pod-1"], devices)
    writer = DeviceMetadataWriter(paths)
    writer.prepared(claim, PrepareResult(), {"metadata": {"annotations": {}}})
    writer.network_ready(claim, [DeviceResult(devices[0].device, "net1", ["10.0.0.2/24"], "0c:42:a1:00:00:01")])
    out = subprocess.run(
        [str(binary), str(paths.file("ns", "c1", "nic")), str(paths.cdi_spec(UID, "nic"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    decoded = json.loads(out.stdout)
    assert decoded["gvk"] == "metadata.resource.k8s.io/v1beta1, Kind=DeviceMetadata"
    assert decoded["generation"] == 2 and decoded["devices"] == 2
    assert decoded["interfaces"] == ["net1", ""]
    # The CDI library loads our spec.
    assert decoded["cdiDevices"] == [paths.cdi_device_id(UID, "nic", d.device) for d in devices]


@pytest.mark.parametrize("uid", [UID, "b20f8e34-9509-44dc-9218-b5b873892828"], ids=["digit-first", "letter-first"])
def test_the_cdi_library_loads_the_spec_for_every_uid(paths: MetadataPaths, uid: str) -> None:
    """A UID starting with a digit needs CDI spec version 0.5.0: with 0.3.0 containerd refused the
    spec ("the spec version must be at least v0.5.0") and half the pods failed to start."""
    from driver.checkpoint.state import PreparedClaim, PreparedDevice
    from harness.metadata_decoder_build import decoder_binary

    devices = [PreparedDevice("nic", NODE, name, dev) for name, dev in inventory(1).items()]
    claim = PreparedClaim(uid, "ns", "c1", [], devices)
    DeviceMetadataWriter(paths).prepared(claim, PrepareResult(), {})
    args = [str(decoder_binary()), str(paths.file("ns", "c1", "nic")), str(paths.cdi_spec(uid, "nic"))]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cdiDevices"] == [paths.cdi_device_id(uid, "nic", devices[0].device)]


def test_the_pod_start_rewrite_is_off_the_hook_and_containers_wait_for_it(tmp_path: Path) -> None:
    """RunPodSandbox only queues the rewrite; CreateContainer (``settle``) waits for it, and a stuck
    one holds a container back only for the timeout."""
    release, started = threading.Event(), threading.Event()
    written: list[str] = []

    class SlowWriter:
        def network_ready(self, claim: Any, results: list[DeviceResult], pod_uid: str) -> None:
            started.set()
            release.wait(10)
            written.append(claim)

        def keep_pod(self, pod_uid: str) -> None:
            pass

    class Status:
        def pod_network_ready(self, pod_uid: str, claim: Any, results: list[DeviceResult]) -> None:
            pass

    sink = MetadataStatusSink(SlowWriter(), Status())  # type: ignore[arg-type]
    t0 = time.monotonic()
    sink.pod_network_ready("pod-1", "claim-1", [])  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 0.5 and started.wait(5) and written == []
    threading.Timer(0.3, release.set).start()
    sink.settle("pod-1")
    assert written == ["claim-1"] and time.monotonic() - t0 >= 0.3
    sink.settle("pod-unknown")  # nothing queued: returns at once
    release.clear()
    sink.pod_network_ready("pod-2", "claim-2", [])  # type: ignore[arg-type]
    t1 = time.monotonic()
    sink.settle("pod-2", timeout=0.2)  # stuck: the container is created with the prepare-time file
    assert 0.2 <= time.monotonic() - t1 < 2 and written == ["claim-1"]
    release.set()
    sink.close()
    assert written == ["claim-1", "claim-2"] and sink._pending == {}
