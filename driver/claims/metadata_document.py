"""What a claim's device metadata file and its CDI spec say: rendered from durable state, recognised.

The file (the DRA device-metadata protocol, KEP-5304) is one ``DeviceMetadata`` object per API
version, newest first, for one request of a claim: each NIC's published attributes and what the
driver did with it (:class:`MetadataDocument`); the CDI spec mounts it read-only at the protocol's
path in the containers. Both are pure functions of durable state, so a file written again holds the
bytes a container read before: the :class:`~driver.checkpoint.state.PreparedClaim`, what only the
ResourceClaim told at prepare (:class:`ClaimFacts`: the pod claim name, each NIC's GPU, paired by
:func:`pair_up`), and the pod's view of each NIC (:class:`NicView`, kept in the pod's state under
:data:`VIEW_RECORD`). Where the files live: :class:`MetadataPaths`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from driver.checkpoint.state import DriverState, GpuPair, MetadataFacts, PreparedClaim, PreparedDevice
from driver.inventory import topology
from driver.inventory.attributes import attribute_rank
from driver.inventory.vfio_binding import VFIO_CONTAINER
from driver.model.device import STANDARD_DOMAIN, AttributeValue, attribute_to_api

GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1beta1", "v1alpha1")
"""The API versions written, newest first (a reader takes the first it knows)."""
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR, TEMPLATES_SUBDIR = "resourceclaims", "resourceclaimtemplates"
METADATA_SUBDIR = "dra-device-metadata"
METADATA_FILE = "metadata.json"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
CDI_VERSION, CDI_DIGIT_NAME_VERSION = "0.3.0", "0.5.0"
"""The lowest CDI spec version with mounts, and the lowest that allows a device name starting with a
digit (a claim UID may): the CDI library refuses a spec that claims less than it uses, and every
runtime with CDI reads both (the minimum, as the Go helper's ``MinimumRequiredVersion``)."""
MAX_ATTRIBUTES = 32  # the protocol's limit per device, as a ResourceSlice's
MAX_IPS = 16  # NetworkDeviceData.ips limit
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
GPU_ATTRIBUTES = ("gpu", "gpuPciBusID", "gpuPath")
"""A paired NIC's attributes (in our domain): the GPU's device name, its PCI address, the PCIe path."""
PATH_RANK = {c: i for i, c in enumerate((topology.PIX, topology.PXB, topology.PHB, topology.NODE, topology.SYS))}
VFIO_DEVICE_ENV, VFIO_GROUP_ENV = "DRANET_VFIO_DEVICE_", "DRANET_VFIO_GROUP_"
"""A VF on vfio-pci: the prefixes of its PCI address's and its VFIO group's environment variables."""
VIEW_RECORD = "deviceMetadata"
"""The name of a NIC's :class:`NicView` among its records in the pod's state."""


@dataclass(frozen=True)
class MetadataPaths:
    """Where the files of one driver live on the host and in the containers."""

    driver_name: str
    directory: str  # the runtime dir (tmpfs, as /var/run/cdi): the same path in and out of the driver's container
    cdi_dir: str

    def claim_dir(self, namespace: str, name: str) -> Path:
        return Path(self.directory, METADATA_SUBDIR, f"{namespace}_{name}")

    def file(self, namespace: str, name: str, request: str) -> Path:
        return self.claim_dir(namespace, name) / request / METADATA_FILE

    def cdi_spec(self, uid: str, request: str) -> Path:
        return Path(self.cdi_dir, f"{self.driver_name}_metadata_{uid}_{request}.json")

    def cdi_device_id(self, uid: str, request: str, device: str) -> str:
        return f"{self.driver_name}/metadata={cdi_device_name(uid, request, device)}"

    def container_file(self, claim_name: str, pod_claim_name: str | None, request: str) -> str:
        sub, name = (TEMPLATES_SUBDIR, pod_claim_name) if pod_claim_name else (CLAIMS_SUBDIR, claim_name)
        return f"{CONTAINER_DIR}/{sub}/{name}/{request}/{self.driver_name}-metadata.json"


def cdi_device_name(uid: str, request: str, device: str) -> str:
    """One CDI device per NIC, each mounting its request's file (CDI keeps one mount per path).

    Not one per request: the kubelet reports each device's health in the pod status under its
    first CDI device, and merges devices sharing one, so a shared ID would hide every NIC's health
    but one (the Go helper's single ID per request does that to a driver with no CDI devices of its
    own)."""
    return f"{uid}_{request}_{device}"


@dataclass(frozen=True)
class NicView:
    """What the pod sees of one NIC of a claim, as its metadata file says it: kept in the pod's state
    (:data:`VIEW_RECORD` among the NIC's records) so a file written again after any loss, by this
    driver or a restarted one, is the one the pod's containers read."""

    claim: str  # the claim's UID
    generation: int  # the file's generation once the pod's sandbox started
    interface_name: str
    ips: tuple[str, ...] = ()  # CIDRs
    hardware_address: str | None = None
    mtu: int | None = None  # the link's MTU in the pod
    gid_index: int | None = None  # RoCE v2 GID index of the pod's address

    def to_record(self) -> dict[str, Any]:
        """The record's plain form (what is set only)."""
        out: dict[str, Any] = {"claim": self.claim, "generation": self.generation, "interfaceName": self.interface_name}
        if self.ips:
            out["ips"] = list(self.ips)
        if self.hardware_address:
            out["hardwareAddress"] = self.hardware_address
        if self.mtu is not None:
            out["mtu"] = self.mtu
        if self.gid_index is not None:
            out["gidIndex"] = self.gid_index
        return out

    @classmethod
    def from_record(cls, data: Any) -> NicView | None:
        """Inverse of :meth:`to_record`; None for anything else (the NIC then has no view)."""
        if not isinstance(data, dict):
            return None
        claim, generation, name = data.get("claim"), data.get("generation"), data.get("interfaceName")
        ips, mac, mtu, gid = data.get("ips", []), data.get("hardwareAddress"), data.get("mtu"), data.get("gidIndex")
        if not (isinstance(claim, str) and isinstance(name, str) and isinstance(generation, int)):
            return None
        if not (isinstance(ips, list) and all(isinstance(ip, str) for ip in ips)):
            return None
        if (mac is not None and not isinstance(mac, str)) or not all(v is None or is_int(v) for v in (mtu, gid)):
            return None
        return cls(claim, generation, name, tuple(ips), mac, mtu, gid) if is_int(generation) else None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ClaimView:
    """A claim's NICs as the pod that started last with it sees them (device -> view)."""

    generation: int
    nics: Mapping[str, NicView]


def claim_view(state: DriverState, claim_uid: str) -> ClaimView | None:
    """The claim's view in the durable state: its NICs' views in the pod with the highest generation
    (a claim shared by pods: the one whose start wrote the file last), None when no pod has one."""
    best: tuple[int, str] | None = None
    found: ClaimView | None = None
    for pod_uid, pod in state.pods.items():
        views = {
            m.device: v
            for m in pod.devices
            if (v := NicView.from_record(m.records.get(VIEW_RECORD))) is not None and v.claim == claim_uid
        }
        if not views:
            continue
        generation = max(v.generation for v in views.values())
        if best is None or (generation, pod_uid) > best:
            best = (generation, pod_uid)
            found = ClaimView(generation, {d: v for d, v in views.items() if v.generation == generation})
    return found


def put_views(state: DriverState, pod_uid: str, claim_uid: str, views: Mapping[str, NicView]) -> bool:
    """Record the pod's view of the claim's NICs in its state; False (nothing done) when the pod
    holds no NIC any more or the claim is gone (unprepared)."""
    pod = state.pods.get(pod_uid)
    if pod is None or claim_uid not in state.claims or not any(m.device in views for m in pod.devices):
        return False
    devices = [
        replace(m, records={**m.records, VIEW_RECORD: views[m.device].to_record()}) if m.device in views else m
        for m in pod.devices
    ]
    state.pods[pod_uid] = replace(pod, devices=devices)
    return True


@dataclass(frozen=True)
class ClaimFacts:
    """The prepare-time facts of a claim's files: the pod claim name and each NIC's GPU."""

    pod_claim_name: str | None = None
    pairs: Mapping[str, GpuPair] = field(default_factory=dict)  # our device -> its GPU

    @classmethod
    def of_record(cls, record: PreparedClaim) -> ClaimFacts | None:
        """The facts the checkpoint holds, None for a record without them (from before, or metadata off)."""
        if not record.devices or any(d.metadata is None for d in record.devices):
            return None
        facts = [d.metadata for d in record.devices if d.metadata is not None]
        pairs = {d.device: d.metadata.gpu for d in record.devices if d.metadata is not None and d.metadata.gpu}
        return cls(facts[0].pod_claim_name, pairs)

    def apply(self, record: PreparedClaim) -> PreparedClaim:
        """``record`` with these facts on each device (what the checkpoint keeps)."""
        devices = [
            replace(d, metadata=MetadataFacts(self.pod_claim_name, self.pairs.get(d.device))) for d in record.devices
        ]
        return replace(record, devices=devices)


def compact_json(obj: Any) -> bytes:
    """Compact JSON: with ``indent`` the standard library encodes in Python, ten times slower than
    its C encoder, and these files are read by programs."""
    return json.dumps(obj, separators=(",", ":")).encode()


def encode_stream(document: dict[str, Any], versions: Sequence[str] = VERSIONS) -> bytes:
    """One JSON object per version, newest first, each on its own lines (the protocol's stream)."""
    return b"".join(
        compact_json({"kind": "DeviceMetadata", "apiVersion": f"{GROUP}/{v}", **document}) + b"\n" for v in versions
    )


def decode_first(data: bytes) -> dict[str, Any]:
    """The first object of a metadata stream (ours: the newest version)."""
    obj, _ = json.JSONDecoder().raw_decode(data.decode())
    if not isinstance(obj, dict):
        raise ValueError("not a DeviceMetadata object")
    return obj


def decode_stream(data: bytes) -> list[dict[str, Any]]:
    """Every object of a metadata stream; ValueError when any is not a JSON object."""
    text, decoder, pos = data.decode(), json.JSONDecoder(), 0
    out: list[dict[str, Any]] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except RecursionError:
            raise ValueError("nested too deep") from None
        if not isinstance(obj, dict):
            raise ValueError("not a DeviceMetadata object")
        out.append(obj)


class MetadataDocument:
    """The bytes of a claim's files, as durable state says they are: the metadata file of a request
    (generation 1 at prepare, the pod's view once it started) and its CDI spec; and whether bytes
    found on disk are such a file. ``domain``: our attributes' domain, whatever the driver's name."""

    def __init__(self, paths: MetadataPaths, domain: str, versions: Sequence[str] = VERSIONS) -> None:
        self.paths, self.domain, self.versions = paths, domain, tuple(versions)

    def render(self, record: PreparedClaim, request: str, facts: ClaimFacts, view: ClaimView | None) -> bytes:
        """The metadata file of ``request``: generation 1 at prepare, the pod's view once it started."""
        devices = []
        for d in (d for d in record.devices if d.request == request):
            entry = self._device(d, facts.pairs.get(d.device))
            nic = view.nics.get(d.device) if view is not None else None
            devices.append(entry if nic is None else self._with_view(entry, nic))
        doc: dict[str, Any] = {
            "metadata": {
                "name": record.name,
                "namespace": record.namespace,
                "uid": record.uid,
                "generation": view.generation if view is not None else 1,
            }
        }
        if facts.pod_claim_name:
            doc["podClaimName"] = facts.pod_claim_name
        doc["requests"] = [{"name": request, "devices": devices}]
        return encode_stream(doc, self.versions)

    def render_cdi(self, record: PreparedClaim, request: str, facts: ClaimFacts) -> bytes:
        """The CDI spec of ``request``: one device per NIC, each mounting the request's file."""
        mount = {
            "hostPath": str(self.paths.file(record.namespace, record.name, request)),
            "containerPath": self.paths.container_file(record.name, facts.pod_claim_name, request),
            "options": ["ro", "bind"],
        }
        devices = [
            {"name": cdi_device_name(record.uid, request, d.device), "containerEdits": self._edits(d, mount)}
            for d in record.devices
            if d.request == request
        ]
        spec = {
            "cdiVersion": CDI_DIGIT_NAME_VERSION if record.uid[:1].isdigit() else CDI_VERSION,
            "kind": f"{self.paths.driver_name}/metadata",
            "devices": devices,
        }
        return compact_json(spec)

    def _edits(self, d: PreparedDevice, mount: dict[str, Any]) -> dict[str, Any]:
        """One NIC's container edits: the request's metadata file; for a VF on vfio-pci also its VFIO
        group and the VFIO container and iommufd devices the node has (the runtime reads their
        numbers on the host and allows them in the container's device cgroup) and
        ``DRANET_VFIO_DEVICE_<DEVICE>`` (its PCI address) and ``DRANET_VFIO_GROUP_<DEVICE>`` (its
        group's device) in the environment."""
        edits: dict[str, Any] = {"mounts": [mount]}
        group = vfio_group(d, self.domain)
        if group is None:
            return edits
        key = d.device.upper().replace("-", "_").replace(".", "_")
        edits["env"] = [
            f"{VFIO_DEVICE_ENV}{key}={d.snapshot.host.pci_address}",
            f"{VFIO_GROUP_ENV}{key}=/dev/vfio/{group}",
        ]
        nodes = d.vfio_nodes if d.vfio_nodes is not None else (f"/dev/vfio/{group}", VFIO_CONTAINER)
        edits["deviceNodes"] = [{"path": path} for path in nodes]
        return edits

    def _device(self, d: PreparedDevice, pair: GpuPair | None) -> dict[str, Any]:
        """One device entry: what the driver did first, then the published attributes by rank,
        at most :data:`MAX_ATTRIBUTES`."""
        own: dict[str, AttributeValue] = {}
        chars = ",".join(os.path.basename(c.path) for c in d.snapshot.host.char_devices)
        group = vfio_group(d, self.domain)
        if group is not None:  # user space drives the VF: its group, not the kernel's RDMA devices
            own[f"{self.domain}/vfioGroupDevice"] = f"/dev/vfio/{group}"
        elif chars:
            own[f"{self.domain}/rdmaCharDevices"] = chars[:64]
        if pair is not None:
            values = (pair.device, pair.pci_bus_id, pair.path)
            own |= {f"{self.domain}/{k}": v for k, v in zip(GPU_ATTRIBUTES, values, strict=True)}
        published = {k: v for k, v in d.snapshot.attributes.items() if k not in own}
        ranked = sorted(published, key=lambda n: (attribute_rank(n), n))
        attributes = own | {n: published[n] for n in ranked[: max(0, MAX_ATTRIBUTES - len(own))]}
        return {
            "driver": self.paths.driver_name,
            "pool": d.pool,
            "name": d.device,
            "attributes": {k: attribute_to_api(v) for k, v in sorted(attributes.items())},
        }

    def _with_view(self, entry: dict[str, Any], nic: NicView) -> dict[str, Any]:
        """A device entry with what the pod sees: ``networkData`` and the pod-side attributes (the
        lowest-ranked published ones make room for them)."""
        network: dict[str, Any] = {"interfaceName": nic.interface_name}
        if nic.ips:
            network["ips"] = list(nic.ips)[:MAX_IPS]
        if nic.hardware_address:
            network["hardwareAddress"] = nic.hardware_address
        entry = {**entry, "networkData": network}
        attrs = dict(entry.get("attributes") or {})
        pod_side: dict[str, Any] = {f"{self.domain}/podInterfaceName": attribute_to_api(nic.interface_name[:64])}
        if nic.mtu is not None:
            pod_side[f"{self.domain}/podMTU"] = attribute_to_api(nic.mtu)
        if nic.gid_index is not None:
            pod_side[f"{self.domain}/roceGIDIndex"] = attribute_to_api(nic.gid_index)
        for name in pod_side:
            attrs.pop(name, None)
        room = MAX_ATTRIBUTES - len(pod_side)
        if len(attrs) > room:  # drop the lowest-ranked published ones to make room
            keep = sorted(attrs, key=lambda n: (not n.startswith(f"{self.domain}/gpu"), attribute_rank(n), n))[:room]
            attrs = {k: attrs[k] for k in keep}
        entry["attributes"] = dict(sorted((attrs | pod_side).items()))
        return entry

    def parses(self, data: bytes) -> bool:
        """Whether ``data`` is a stream of one object per version written."""
        try:
            return len(decode_stream(data)) == len(self.versions)
        except ValueError:
            return False

    def same_claim(self, data: bytes, record: PreparedClaim, request: str, facts: ClaimFacts) -> bool:
        """Whether ``data`` is a whole metadata file of this claim's request, whatever its pod part
        and generation: what a pod's start wrote before its state was dropped (the pod stopped, a
        driver of before kept no view), which the next start counts on."""
        try:
            objects = decode_stream(data)
        except ValueError:
            return False
        if [o.get("apiVersion") for o in objects] != [f"{GROUP}/{v}" for v in self.versions]:
            return False
        first = objects[0]
        if any({**o, "apiVersion": ""} != {**first, "apiVersion": ""} for o in objects):
            return False
        meta, requests = first.get("metadata") or {}, first.get("requests")
        names = [d.device for d in record.devices if d.request == request]
        return (
            first.get("kind") == "DeviceMetadata"
            and (meta.get("uid"), meta.get("name"), meta.get("namespace"))
            == (record.uid, record.name, record.namespace)
            and is_int(meta.get("generation"))
            and first.get("podClaimName") == facts.pod_claim_name
            and isinstance(requests, list)
            and len(requests) == 1
            and isinstance(requests[0], dict)
            and requests[0].get("name") == request
            and [e.get("name") if isinstance(e, dict) else None for e in requests[0].get("devices") or []] == names
        )


def vfio_group(d: PreparedDevice, domain: str) -> int | None:
    """The IOMMU group of a VF the pod gets on vfio-pci (as published at prepare), else None."""
    group = d.snapshot.attributes.get(f"{domain}/iommuGroup")
    return group if d.vfio and isinstance(group, int) and not isinstance(group, bool) else None


def pair_up(
    sysfs_root: str, gpus: Sequence[tuple[str, str, str]], nics: Sequence[tuple[str, str]]
) -> dict[str, GpuPair]:
    """NIC device -> GPU, one NIC per GPU, the closest PCIe paths paired first (ties by bus ID)."""
    if not gpus or not nics:
        return {}
    ends = {bdf: topology.pci_endpoint(sysfs_root, bdf) for bdf in {g[2] for g in gpus} | {n[1] for n in nics}}
    options = sorted(
        (PATH_RANK.get(path, len(PATH_RANK)), nic_bdf, gpu_bdf, nic, driver, gpu, path)
        for nic, nic_bdf in nics
        for driver, gpu, gpu_bdf in gpus
        for path in (topology.relation(ends[nic_bdf], ends[gpu_bdf]),)
    )
    out: dict[str, GpuPair] = {}
    used: set[str] = set()
    for _, _, gpu_bdf, nic, driver, gpu, path in options:
        if nic in out or gpu_bdf in used:
            continue
        out[nic] = GpuPair(device=gpu, driver=driver, pci_bus_id=gpu_bdf, path=path)
        used.add(gpu_bdf)
    return out
