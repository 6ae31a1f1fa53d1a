"""The files the driver owns (each request's device metadata file and its CDI spec) are checked and
written again, byte for byte what the pod's containers read, when deleted, emptied, half-written or
zeroed: before a container of the pod is created (``settle``), by the background check, and by a
restarted driver (the pod's view of its NICs is in the pod's state, the prepare-time facts in the
claim's record).

A real Preparer over a fake apiserver and a real checkpoint in a temporary directory; the pod's
state is what RunPodSandbox commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.schema import SCHEMA_VERSION
from driver.checkpoint.state import (
    IN_POD,
    DriverState,
    MovedDevice,
    PodNetState,
    PreparedClaim,
    PreparedDevice,
)
from driver.checkpoint.store import CheckpointStore
from driver.claims import owned_files
from driver.claims.claim_build import ClaimBuilder
from driver.claims.device_metadata import DeviceMetadataWriter
from driver.claims.metadata_document import VIEW_RECORD, MetadataPaths, decode_first
from driver.claims.metadata_sink import MetadataStatusSink
from driver.claims.owned_files import CDI, METADATA
from driver.claims.prepare import Preparer
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.device import Device
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory
from tests.support.damage import empty, half, zero

UID = "0b5c7a52-1111-4222-8333-944455556666"
CLAIM = "pod-devices-x7k2p"
POD = "pod-1"
PUBLISHED_MTU = 2044  # the host's MTU at the last scan, as published
RESULTS = [  # what RunPodSandbox reports: the links as the pod has them
    DeviceResult("pci-0000-8a-00-0", "net1", ["192.168.7.2/24"], "0c:42:a1:00:00:01", mtu=4092),
    DeviceResult("pci-0000-8a-00-1", "ib1", mtu=PUBLISHED_MTU),
]


def _published() -> dict[str, Device]:
    return {n: replace(d, attributes={**d.attributes, "dra.net/mtu": PUBLISHED_MTU}) for n, d in inventory(2).items()}


@dataclass
class Node:
    """One node's driver with a running pod of the claim, and the bytes its containers read."""

    api: FakeAPIServer
    paths: MetadataPaths
    state_dir: Path
    preparer: Preparer
    sink: MetadataStatusSink
    read: dict[str, bytes]  # kind -> the file's bytes once the pod started

    @property
    def writer(self) -> DeviceMetadataWriter:
        assert self.preparer.metadata is not None
        return self.preparer.metadata

    def file(self, kind: str) -> Path:
        return self.paths.file("ns", CLAIM, "nic") if kind == METADATA else self.paths.cdi_spec(UID, "nic")

    def restarted(self) -> Preparer:
        """A new driver on the same node: the same state directory and files, nothing in memory."""
        kube = KubeClient.from_kubeconfig(str(self.api.write_kubeconfig(self.state_dir.parent / "kubeconfig2")))
        store = CheckpointStore(self.state_dir)
        return Preparer(
            kube, store, ClaimBuilder(_published, "dra.net", NODE), metadata=DeviceMetadataWriter(self.paths)
        )


def _pod_holds(store: CheckpointStore, record: PreparedClaim, pod: str = POD) -> None:
    """The pod's state with the claim's NICs in it (what RunPodSandbox commits)."""
    moved = [MovedDevice(d.device, f"ib{i}", f"net{i}", step=IN_POD) for i, d in enumerate(record.devices)]
    store.update(lambda s: s.pods.__setitem__(pod, PodNetState(pod, devices=moved)))


class _Status:
    def pod_network_ready(self, pod_uid: str, claim: Any, results: list[DeviceResult]) -> None:
        pass


async def _prepare(api: FakeAPIServer, tmp_path: Path) -> tuple[MetadataPaths, Preparer]:
    devices = [result("pci-0000-8a-00-0", NODE), result("pci-0000-8a-00-1", NODE)]
    claim = make_claim("ns", CLAIM, UID, devices, pods=[POD, "pod-2"])
    claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "devices"}
    api.add_claim(claim)
    paths = MetadataPaths("dra.net", str(tmp_path / "run/dranet"), str(tmp_path / "cdi"))
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    builder = ClaimBuilder(_published, "dra.net", NODE)
    preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), builder, metadata=DeviceMetadataWriter(paths))
    assert (await preparer.prepare([ClaimRef("ns", CLAIM, UID)]))[UID].error == ""
    return paths, preparer


@pytest.fixture
async def node(api: FakeAPIServer, tmp_path: Path) -> AsyncIterator[Node]:
    paths, preparer = await _prepare(api, tmp_path)
    assert preparer.metadata is not None
    record = preparer.store.read(lambda s: s.claims[UID])
    _pod_holds(preparer.store, record)
    sink = MetadataStatusSink(preparer.metadata, _Status())
    sink.pod_network_ready(POD, record, RESULTS)
    sink.settle(POD)
    read = {METADATA: paths.file("ns", CLAIM, "nic").read_bytes(), CDI: paths.cdi_spec(UID, "nic").read_bytes()}
    doc = decode_first(read[METADATA])
    assert doc["metadata"]["generation"] == 2 and doc["requests"][0]["devices"][0]["networkData"]["ips"]
    time.sleep(0.02)  # damage comes well after the driver's write (file times are the kernel's clock ticks)
    yield Node(api, paths, tmp_path / "state", preparer, sink, read)
    sink.close()


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted": (Path.unlink, "missing"),
    "emptied": (empty, "truncated"),
    "half-written": (half, "truncated"),
    "zeroed": (zero, "unparsable"),
}
"""How a file is damaged, and the reason the driver gives when it writes it again."""
CASES = [(kind, damage) for kind in (METADATA, CDI) for damage in DAMAGE]


def _assert_as_read(node: Node, kind: str) -> None:
    """The file holds what the containers read before: for the metadata file, the pod's view too."""
    assert node.file(kind).read_bytes() == node.read[kind]
    if kind == METADATA:
        doc = decode_first(node.file(kind).read_bytes())
        first, second = doc["requests"][0]["devices"]
        assert doc["metadata"]["generation"] == 2 and doc["podClaimName"] == "devices"
        assert first["networkData"] == {
            "interfaceName": "net1",
            "ips": ["192.168.7.2/24"],
            "hardwareAddress": "0c:42:a1:00:00:01",
        }
        assert second["networkData"] == {"interfaceName": "ib1"}


@pytest.mark.parametrize(("kind", "damage"), CASES)
def test_before_a_container_starts_a_damaged_file_is_written_again_as_the_pod_read_it(
    node: Node, kind: str, damage: str
) -> None:
    spoil, reason = DAMAGE[damage]
    spoil(node.file(kind))
    node.sink.settle(POD)  # what CreateContainer calls, for a restarted container too
    _assert_as_read(node, kind)
    assert node.writer.mend_counts() == {(kind, reason): 1}
    [mend] = node.writer.take_mends()
    assert (mend.kind, mend.reason, mend.path, mend.claim) == (kind, reason, str(node.file(kind)), f"ns/{CLAIM}")
    node.sink.settle(POD)  # right now: nothing more written
    assert node.writer.mend_counts() == {(kind, reason): 1}


@pytest.mark.parametrize(("kind", "damage"), CASES)
def test_a_restarted_driver_writes_a_damaged_file_again_with_the_pods_view(node: Node, kind: str, damage: str) -> None:
    spoil, reason = DAMAGE[damage]
    node.sink.close()
    spoil(node.file(kind))
    restarted = node.restarted()
    gets = node.api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/")
    assert restarted.restore_metadata() == []
    _assert_as_read(node, kind)
    assert restarted.metadata is not None and restarted.metadata.mend_counts() == {(kind, reason): 1}
    # From the checkpoint alone: the pod claim name and the pod's view are kept there.
    assert node.api.count("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/") == gets


def test_the_background_check_mends_a_cdi_spec_with_a_stat_per_file(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime resolves CDI devices before any NRI hook: only the background check sees a broken spec."""
    reads: list[Path] = []
    real_read = owned_files._read

    def counting(path: Path) -> tuple[bytes, Any]:
        reads.append(path)
        return real_read(path)

    monkeypatch.setattr(owned_files, "_read", counting)
    assert node.writer.keep_all() == []
    assert reads == []  # as last written: a stat each, nothing read
    half(node.file(CDI))
    assert node.writer.keep_all() == []
    assert reads == [node.file(CDI)] and node.file(CDI).read_bytes() == node.read[CDI]
    assert node.writer.keep_all(full=True) == [] and len(reads) == 3  # the periodic full pass reads both
    assert node.writer.mend_counts() == {(CDI, "truncated"): 1}


def test_the_pod_mtu_is_the_pod_links_not_the_published_one(node: Node) -> None:
    devices = decode_first(node.read[METADATA])["requests"][0]["devices"]
    assert [d["attributes"]["dra.net/podMTU"] for d in devices] == [{"int": 4092}, {"int": PUBLISHED_MTU}]
    assert devices[0]["attributes"]["dra.net/mtu"] == {"int": PUBLISHED_MTU}  # the published one stays as it was


def test_the_hooks_report_the_links_mtu_in_the_pod() -> None:
    from driver.netlink.link_info import LinkInfo
    from driver.netlink.nic_moves import LinkState, PodLinkConfig, PodLinkResult
    from driver.nic_settings.setting import Nic
    from driver.nri.claim_reports import device_result as _device_result

    device = PreparedDevice("nic", NODE, "pci-0000-8a-00-0", _published()["pci-0000-8a-00-0"])
    nic = Nic(
        PreparedClaim(UID, "ns", CLAIM, [POD], [device]), device, LinkState("ib0", 2044, ""), PodLinkConfig("ib0")
    )
    nic.link = LinkInfo(index=7, ifname="ib0", mtu=4092, mac="0c:42:a1:00:00:01")
    assert _device_result(nic, PodLinkResult("ib0", "0c:42:a1:00:00:01", [])).mtu == 4092


async def test_a_pod_gone_before_its_rewrite_leaves_the_file(api: FakeAPIServer, tmp_path: Path) -> None:
    """A pod stopped before its queued rewrite ran: neither its view nor its file is written."""
    paths, preparer = await _prepare(api, tmp_path)
    assert preparer.metadata is not None
    before = paths.file("ns", CLAIM, "nic").read_bytes()
    sink = MetadataStatusSink(preparer.metadata, _Status())
    sink.pod_network_ready(POD, preparer.store.read(lambda s: s.claims[UID]), RESULTS)  # no state: stopped
    sink.settle(POD)
    sink.close()
    assert paths.file("ns", CLAIM, "nic").read_bytes() == before
    assert decode_first(before)["metadata"]["generation"] == 1


def test_a_stopped_pods_file_is_kept_and_the_next_start_counts_on_it(node: Node) -> None:
    """Once the pod stopped (its state dropped) its file stays: the next sandbox's start is generation 3."""
    node.preparer.store.update(lambda s: s.pods.pop(POD))
    restarted = node.restarted()
    assert restarted.restore_metadata() == []
    assert node.file(METADATA).read_bytes() == node.read[METADATA]
    assert restarted.metadata is not None and restarted.metadata.mend_counts() == {}
    record = restarted.store.read(lambda s: s.claims[UID])
    _pod_holds(restarted.store, record, "pod-2")
    restarted.metadata.network_ready(record, RESULTS, "pod-2")
    assert decode_first(node.file(METADATA).read_bytes())["metadata"]["generation"] == 3


def test_the_state_is_kept_where_an_older_driver_reads_past_it(node: Node) -> None:
    """An older driver (rolling update) builds a claim and a pod's NIC from every key (``cls(**data)``)
    and a device from the keys it knows: the facts are a device's key, the view a NIC's record."""
    node.preparer.store.compact()  # the whole file, as an older driver that reads no journal finds it
    claims = json.loads((node.state_dir / "checkpoint.json").read_text())["claims"]
    assert set(claims[UID]) == {"uid", "namespace", "name", "pod_uids", "devices"}
    assert [d["deviceMetadata"] for d in claims[UID]["devices"]] == [{"podClaimName": "devices"}] * 2
    pods = json.loads(node.state_dir.joinpath("pods.json").read_text())["pods"]
    devices = pods[POD]["devices"]
    assert all(set(d) <= set(MovedDevice.__dataclass_fields__) for d in devices)
    assert devices[0]["records"][VIEW_RECORD] == {
        "claim": UID,
        "generation": 2,
        "interfaceName": "net1",
        "ips": ["192.168.7.2/24"],
        "hardwareAddress": "0c:42:a1:00:00:01",
        "mtu": 4092,
    }
    state = DriverState.from_json({"version": SCHEMA_VERSION, "claims": claims, "pods": pods})
    assert [d.metadata for d in state.claims[UID].devices] == [
        d.metadata for d in node.preparer.store.read(lambda s: s.claims[UID].devices)
    ]
    older = PreparedDevice.from_dict({k: v for k, v in claims[UID]["devices"][0].items() if k != "deviceMetadata"})
    assert older.metadata is None  # a record from before: its facts are asked of the ResourceClaim
