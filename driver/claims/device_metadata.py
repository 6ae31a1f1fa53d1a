"""Device metadata in the containers: the DRA device-metadata protocol (KEP-5304) for our NICs.

For each request of a prepared claim with devices of ours, three things:

- a file ``<runtime dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`` on the
  host (tmpfs, as the CDI specs and the claims: the Go kubelet-plugin helper keeps its own in its
  plugin directory, on disk, for no reader but the runtime), holding one ``DeviceMetadata`` object
  per API version, newest first (``metadata.resource.k8s.io/v1beta1``, then ``v1alpha1``);
- a CDI spec ``<cdi dir>/<driver>_metadata_<claim uid>_<request>.json`` that bind-mounts it
  read-only at the protocol's path in the container,
  ``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json``
  (``resourceclaimtemplates/<pod claim name>/...`` for a claim made from a template);
- a CDI device ``<driver>/metadata=<claim uid>_<request>_<device>`` per device in the
  NodePrepareResources answer, which the kubelet hands to the runtime for every container that
  uses the claim (one per device: see :func:`cdi_device_name`).

The protocol needs no feature gate: the kubelet has passed CDI devices through since 1.31, so the
file appears on 1.34 as on 1.37, wherever the runtime has CDI (containerd 2, CRI-O).

What the file says about each NIC: its published attributes, and what the driver did with it.
Prepare writes generation 1 (the attributes, the RDMA character devices, and in a claim that also
holds GPUs the GPU each NIC pairs with, best PCIe path first); RunPodSandbox rewrites it once the
NICs are configured in the pod, before any container starts (generation + 1): ``networkData``
(the pod-side name, addresses, MAC), the pod link's MTU and the RoCE GID index.

Each file is a pure function of durable state, rendered the same way at its first write and at
every rewrite, so a file written again holds the bytes a container read before: the
:class:`~driver.checkpoint.state.PreparedClaim`, what only the ResourceClaim told at prepare (the
pod claim name, each NIC's GPU: :class:`~driver.checkpoint.state.MetadataFacts` on each device), and
the pod's view of each NIC (:class:`NicView`, in the pod's state under :data:`VIEW_RECORD`, written
before the file). The files the driver owns (the metadata file and the CDI spec of each request)
are checked (:meth:`DeviceMetadataWriter.keep`) at start, before each container of a pod is
created, and every few seconds in the background, and written again when missing, unreadable,
damaged or different: compact JSON on tmpfs, without a sync, always a temporary file renamed over
the old one (never half-written by the driver).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from driver.checkpoint.state import DriverState, GpuPair, MetadataFacts, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.claims.container_settings import pod_gid_index
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import PrepareResult, ResultDevice
from driver.inventory import topology
from driver.inventory.attributes import attribute_rank
from driver.model.device import ATTRIBUTE_DOMAIN, STANDARD_DOMAIN, AttributeValue, attribute_to_api

log = logging.getLogger(__name__)

__all__ = ["GpuPair"]  # the pairing's record lives with the claims (driver.checkpoint.state)

GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1beta1", "v1alpha1")
"""The API versions written, newest first (a reader takes the first it knows)."""
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR, TEMPLATES_SUBDIR = "resourceclaims", "resourceclaimtemplates"
METADATA_SUBDIR = "dra-device-metadata"
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
VIEW_RECORD = "deviceMetadata"
"""The name of a NIC's :class:`NicView` among its records in the pod's state."""
METADATA, CDI = "metadata", "cdi"
"""The kinds of files the driver owns per request: the metadata file, the CDI spec that mounts it."""
MISSING, UNREADABLE, TRUNCATED, UNPARSABLE, DIFFERS = "missing", "unreadable", "truncated", "unparsable", "differs"
"""What was wrong with an owned file written again (the log's, the metric's and the event's words)."""

_Stamp = tuple[int, int, int, int]
"""(size, mtime_ns, ctime_ns, inode) of a file as the driver last wrote or checked it: any write,
truncation or replacement since changes one of them."""


class MetadataError(Exception):
    """A metadata file or CDI spec could not be written (the claim's prepare fails with it)."""


ForeignLookup = Callable[[str], Mapping[tuple[str, str], Mapping[str, Any]]]
"""driver -> (pool, device) -> attributes in API form: another driver's devices on this node, from
its ResourceSlices."""
ClaimFetch = Callable[[PreparedClaim], Mapping[str, Any]]
"""The ResourceClaim of a prepared claim, from the API server (raises when it cannot be had)."""


@dataclass(frozen=True)
class MetadataPaths:
    """Where the files of one driver live on the host and in the containers."""

    driver_name: str
    directory: str  # the runtime dir (tmpfs, as /var/run/cdi): the same path in and out of the driver's container
    cdi_dir: str

    def claim_dir(self, namespace: str, name: str) -> Path:
        return Path(self.directory, METADATA_SUBDIR, f"{namespace}_{name}")

    def file(self, namespace: str, name: str, request: str) -> Path:
        return self.claim_dir(namespace, name) / request / "metadata.json"

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
        if (mac is not None and not isinstance(mac, str)) or not all(v is None or _is_int(v) for v in (mtu, gid)):
            return None
        return cls(claim, generation, name, tuple(ips), mac, mtu, gid) if _is_int(generation) else None


def _is_int(value: Any) -> bool:
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


def _put_views(state: DriverState, pod_uid: str, claim_uid: str, views: Mapping[str, NicView]) -> bool:
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


@dataclass(frozen=True)
class Mend:
    """One owned file written again: which, what was wrong, whose."""

    kind: str  # METADATA or CDI
    reason: str  # MISSING, UNREADABLE, TRUNCATED, UNPARSABLE, DIFFERS
    path: str
    claim: str  # namespace/name


def _write_atomic(path: Path, data: bytes) -> _Stamp:
    """``data`` at ``path``, never half-written (readable 0644: the container reads it as any user);
    returns the file's stamp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), 0o644)
    os.replace(tmp, path)
    return _stamp(os.stat(path))  # after the rename, which changes the file's ctime


def _stamp(st: os.stat_result) -> _Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _read(path: Path) -> tuple[bytes, _Stamp]:
    """The file's bytes and stamp, from one open (a rename in between cannot mix two files)."""
    with open(path, "rb") as f:
        return f.read(), _stamp(os.fstat(f.fileno()))


def _json(obj: Any) -> bytes:
    """Compact JSON: with ``indent`` the standard library encodes in Python, ten times slower than
    its C encoder, and these files are read by programs."""
    return json.dumps(obj, separators=(",", ":")).encode()


def encode_stream(document: dict[str, Any], versions: Sequence[str] = VERSIONS) -> bytes:
    """One JSON object per version, newest first, each on its own lines (the protocol's stream)."""
    return b"".join(
        _json({"kind": "DeviceMetadata", "apiVersion": f"{GROUP}/{v}", **document}) + b"\n" for v in versions
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


def _cdi_parses(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except (ValueError, RecursionError):
        return False


def _damage(data: bytes, expected: bytes, parses: bool) -> str:
    """What is wrong with an owned file holding ``data`` where ``expected`` belongs."""
    if expected.startswith(data):
        return TRUNCATED  # empty, or cut short (a write that never finished)
    return DIFFERS if parses else UNPARSABLE


class DeviceMetadataWriter:
    """Writes, checks, mends and removes the metadata files and CDI specs of our claims."""

    def __init__(
        self,
        paths: MetadataPaths,
        sysfs_root: str = "/sys",
        foreign: ForeignLookup | None = None,
        versions: Sequence[str] = VERSIONS,
    ) -> None:
        """``foreign`` finds another driver's device attributes (a GPU's ``pciBusID``) for the
        pairing; without it NICs are not paired. The checkpoint and the API server are bound by
        the :class:`~driver.claims.prepare.Preparer` (:meth:`bind`)."""
        self.paths, self.sysfs_root, self.foreign, self.versions = paths, sysfs_root, foreign, tuple(versions)
        self.store: CheckpointStore | None = None  # the durable state the files are rendered from
        self.fetch: ClaimFetch | None = None
        # One writer of the files at a time (prepare retries, the pod-start rewrite, the checks,
        # unprepare): an unprepare never races a rewrite into leaving a file behind.
        self._files_lock = threading.Lock()
        self._written: dict[Path, _Stamp] = {}  # each owned file as last written or found right
        self._claim_paths: dict[str, tuple[Path, ...]] = {}  # claim UID -> its files
        self._facts: dict[str, ClaimFacts] = {}  # claim UID -> facts of a record without them
        self._mends_lock = threading.Lock()
        self._mends: list[Mend] = []  # not reported yet (the daemon's Node event)
        self.mended: dict[tuple[str, str], int] = {}  # (kind, reason) -> files written again (the metric)
        self.domain = ATTRIBUTE_DOMAIN  # our attributes' domain, whatever the driver's name

    def bind(self, store: CheckpointStore, fetch: ClaimFetch | None) -> None:
        """Render from ``store``; ``fetch`` gets a ResourceClaim whose facts the record lacks."""
        self.store, self.fetch = store, fetch

    # -- prepare -----------------------------------------------------------------------------

    def with_facts(self, record: PreparedClaim, claim: Mapping[str, Any]) -> PreparedClaim:
        """``record`` holding what its files need of the ResourceClaim ``claim`` just fetched."""
        return self._facts_of_claim(record, claim).apply(record)

    def prepared(self, record: PreparedClaim, result: PrepareResult, claim: Mapping[str, Any] | None) -> PrepareResult:
        """``result`` with each device's CDI metadata device, the claim's files written.

        ``claim`` is the ResourceClaim just fetched: the files are written whole (they exist only
        if a crash came between them and the commit, and are the same), no stat on the prepare
        path. None when prepare answered from the checkpoint: the files are checked and written
        again where missing or damaged."""
        if result.error:
            return result
        requests = sorted({d.request for d in record.devices})
        try:
            if claim is None:
                self.keep_claim(record, full=True)
            else:
                facts = ClaimFacts.of_record(record) or self._facts_of_claim(record, claim)
                with self._files_lock:
                    for request in requests:
                        self._put(
                            self.paths.file(record.namespace, record.name, request),
                            self._render(record, request, facts, None),
                        )
                        self._put(self.paths.cdi_spec(record.uid, request), self._render_cdi(record, request, facts))
        except (OSError, ValueError, KeyError) as exc:
            raise MetadataError(f"device metadata of ResourceClaim {record.namespace}/{record.name}: {exc}") from exc
        return PrepareResult(
            devices=[
                ResultDevice(
                    request_names=d.request_names,
                    pool=d.pool,
                    device=d.device,
                    cdi_device_ids=[
                        *d.cdi_device_ids,
                        *(self.paths.cdi_device_id(record.uid, r, d.device) for r in d.request_names if r in requests),
                    ],
                    share_id=d.share_id,
                )
                for d in result.devices
            ]
        )

    def _facts_of_claim(self, record: PreparedClaim, claim: Mapping[str, Any]) -> ClaimFacts:
        """The facts as the ResourceClaim tells them (remembered for a record that lacks them)."""
        pod_claim = ((claim.get("metadata") or {}).get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
        facts = ClaimFacts(
            pod_claim if isinstance(pod_claim, str) and pod_claim else None, self.gpu_pairs(record, claim)
        )
        self._facts[record.uid] = facts
        return facts

    def _claim_facts(self, record: PreparedClaim) -> ClaimFacts:
        """The claim's prepare-time facts: from the checkpoint; for a record from before, as found
        earlier, or in its own files (when each is this claim's), or from the ResourceClaim."""
        facts = ClaimFacts.of_record(record) or self._facts.get(record.uid) or self._facts_in_files(record)
        if facts is not None:
            return facts
        if self.fetch is None:
            return ClaimFacts()  # nobody to ask: a claim by name without GPUs (tests' writers)
        return self._facts_of_claim(record, self.fetch(record))

    def _facts_in_files(self, record: PreparedClaim) -> ClaimFacts | None:
        """The facts as the claim's files say them (a record written before they were kept)."""
        pod_claim: str | None = None
        pairs: dict[str, GpuPair] = {}
        for request in sorted({d.request for d in record.devices}):
            try:
                doc = decode_first(self.paths.file(record.namespace, record.name, request).read_bytes())
            except (OSError, ValueError):
                return None
            if (doc.get("metadata") or {}).get("uid") != record.uid:
                return None
            name: Any = doc.get("podClaimName")
            pod_claim = name if isinstance(name, str) else None
            requests: Any = doc.get("requests") or [{}]
            for entry in requests[0].get("devices") or []:
                attrs: Any = entry.get("attributes") or {}
                gpu, bus_id, path = ((attrs.get(f"{self.domain}/{k}") or {}).get("string") for k in GPU_ATTRIBUTES)
                if isinstance(gpu, str) and isinstance(bus_id, str) and isinstance(path, str):
                    pairs[entry.get("name", "")] = GpuPair(gpu, "", bus_id, path)
        facts = ClaimFacts(pod_claim, pairs)
        self._facts[record.uid] = facts
        return facts

    # -- rendering -----------------------------------------------------------------------------

    def _render(self, record: PreparedClaim, request: str, facts: ClaimFacts, view: ClaimView | None) -> bytes:
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

    def _render_cdi(self, record: PreparedClaim, request: str, facts: ClaimFacts) -> bytes:
        """The CDI spec of ``request``: one device per NIC, each mounting the request's file."""
        mount = {
            "hostPath": str(self.paths.file(record.namespace, record.name, request)),
            "containerPath": self.paths.container_file(record.name, facts.pod_claim_name, request),
            "options": ["ro", "bind"],
        }
        names = [cdi_device_name(record.uid, request, d.device) for d in record.devices if d.request == request]
        spec = {
            "cdiVersion": CDI_DIGIT_NAME_VERSION if record.uid[:1].isdigit() else CDI_VERSION,
            "kind": f"{self.paths.driver_name}/metadata",
            "devices": [{"name": name, "containerEdits": {"mounts": [mount]}} for name in names],
        }
        return _json(spec)

    def _device(self, d: PreparedDevice, pair: GpuPair | None) -> dict[str, Any]:
        """One device entry: what the driver did first, then the published attributes by rank,
        at most :data:`MAX_ATTRIBUTES`."""
        own: dict[str, AttributeValue] = {}
        chars = ",".join(os.path.basename(c.path) for c in d.snapshot.host.char_devices)
        if chars:
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

    # -- GPU pairing ---------------------------------------------------------------------------

    def gpu_pairs(self, record: PreparedClaim, claim: Mapping[str, Any]) -> dict[str, GpuPair]:
        """Our device -> the claim's GPU it pairs with: each GPU (another driver's device with a
        ``pciBusID`` that sysfs shows as a GPU) to one NIC, closest PCIe paths first."""
        if self.foreign is None:
            return {}
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        gpus: list[tuple[str, str, str]] = []  # (driver, device, bus id)
        slices: dict[str, Mapping[tuple[str, str], Mapping[str, Any]]] = {}
        for r in results:
            driver = r.get("driver")
            if not driver or driver == self.paths.driver_name:
                continue
            if driver not in slices:
                try:
                    slices[driver] = self.foreign(driver)
                except Exception as exc:  # noqa: BLE001 - best effort: the file is written without pairs
                    log.warning(
                        "GPU pairing: no devices of driver", extra={"kv": {"driver": driver, "error": str(exc)}}
                    )
                    return {}
            attrs = slices[driver].get((r.get("pool", ""), r.get("device", ""))) or {}
            bus_id = (attrs.get(PCI_BUS_ID) or {}).get("string")
            if isinstance(bus_id, str) and topology.is_gpu_function(self.sysfs_root, bus_id):
                gpus.append((driver, r.get("device", ""), bus_id))
        nics = [(d.device, d.snapshot.host.pci_address) for d in record.devices if d.snapshot.host.pci_address]
        return pair_up(self.sysfs_root, gpus, [(n, b) for n, b in nics if b])

    # -- pod start -----------------------------------------------------------------------------

    def network_ready(self, claim: PreparedClaim, results: Iterable[DeviceResult], pod_uid: str | None = None) -> None:
        """The NICs are configured in pod ``pod_uid``: its view of them goes into its state first
        (nothing when the pod stopped meanwhile), then into the claim's files (generation + 1)."""
        by_device = {r.device: r for r in results}
        with self._files_lock:
            generation = self._generation(claim) + 1
            views = {
                d.device: self._view(claim.uid, generation, d, by_device[d.device])
                for d in claim.devices
                if d.device in by_device
            }
            if self.store is not None and pod_uid is not None:
                if not self.store.update(lambda s: _put_views(s, pod_uid, claim.uid, views)):
                    log.debug("device metadata: pod gone, not rewritten", extra={"kv": {"pod": pod_uid}})
                    return
            facts = self._claim_facts(claim)
            view = ClaimView(generation, views)
            for request in sorted({d.request for d in claim.devices}):
                self._put(
                    self.paths.file(claim.namespace, claim.name, request), self._render(claim, request, facts, view)
                )
                cdi = self.paths.cdi_spec(claim.uid, request)
                if not self._unchanged([cdi]):
                    self._check(CDI, cdi, self._render_cdi(claim, request, facts), claim)

    def _view(self, claim_uid: str, generation: int, d: PreparedDevice, result: DeviceResult) -> NicView:
        """One NIC as the pod sees it. Its MTU is the pod link's (a claim's ``interface.mtu`` only
        when the hooks did not say: the published attribute is the host's at the last scan)."""
        mtu = result.mtu if result.mtu is not None else (d.config.interface.mtu if d.config.interface else None)
        rdma = d.snapshot.host.rdma_device
        gid = pod_gid_index(self.sysfs_root, rdma, result.ips) if rdma and not result.no_rdma else None
        ips = tuple(result.ips)[:MAX_IPS]
        return NicView(claim_uid, generation, result.interface_name, ips, result.hardware_address, mtu, gid)

    def _generation(self, claim: PreparedClaim) -> int:
        """The claim's generation now: its files' (when they are its own), else the highest a pod's
        view of it holds, else 1 (prepare's)."""
        found = [1]
        for request in sorted({d.request for d in claim.devices}):
            try:
                doc = decode_first(self.paths.file(claim.namespace, claim.name, request).read_bytes())
            except (OSError, ValueError):
                continue
            meta = doc.get("metadata") or {}
            if meta.get("uid") == claim.uid and _is_int(meta.get("generation")):
                found.append(meta["generation"])
        if self.store is not None:
            view = self.store.read(lambda s: claim_view(s, claim.uid))
            if view is not None:
                found.append(view.generation)
        return max(found)

    # -- checks --------------------------------------------------------------------------------

    def keep_pod(self, pod_uid: str) -> None:
        """Before a container of the pod starts: its claims' files as they should be (a stat each
        when they are as last written; logged, never raised: the container starts anyway)."""
        if self.store is not None:
            self.keep(self.store.read(lambda s: s.claims_for_pod(pod_uid)))

    def keep_all(self, full: bool = False) -> list[str]:
        """Every prepared claim's files checked (``full``: read and compared, else a stat each when
        they are as last written) and written again where needed; the claims that failed."""
        if self.store is None:
            return []
        return self.keep(self.store.read(lambda s: list(s.claims.values())), full=full)

    def keep(self, records: Iterable[PreparedClaim], full: bool = False) -> list[str]:
        """:meth:`keep_claim` for each claim, one failure never stopping the others (each logged);
        returns the claims (``namespace/name``) whose files could not be made right."""
        failed = []
        for record in records:
            try:
                self.keep_claim(record, full=full)
            except Exception as exc:  # noqa: BLE001 - a claim that cannot be kept is logged; the others go on
                log.warning(
                    "device metadata files not kept",
                    extra={"kv": {"claim": f"{record.namespace}/{record.name}", "error": str(exc)}},
                )
                failed.append(f"{record.namespace}/{record.name}")
        return failed

    def keep_claim(self, record: PreparedClaim, full: bool = False) -> None:
        """The claim's files compared with what durable state says they hold, and each missing,
        unreadable, damaged or different one written again (logged, counted, reported); without
        ``full``, files whose stamp is the one last written are taken as right. Raises
        :class:`MetadataError` when the files cannot be rendered or written."""
        requests = sorted({d.request for d in record.devices})
        with self._files_lock:
            todo = {p for p in self._paths(record) if full or not self._unchanged([p])}
            if not todo:
                return
            prepared, view = True, None
            if self.store is not None:
                prepared, view = self.store.read(lambda s: (record.uid in s.claims, claim_view(s, record.uid)))
            if not prepared:
                return  # unprepared meanwhile: its files are gone for good
            try:
                facts = self._claim_facts(record)
            except Exception as exc:
                raise MetadataError(f"the ResourceClaim's facts for its device metadata: {exc}") from exc
            for request in requests:
                path, spec = (
                    self.paths.file(record.namespace, record.name, request),
                    self.paths.cdi_spec(record.uid, request),
                )
                if path in todo:
                    # No pod's view: the file a pod's start wrote is kept (see _same_claim).
                    kept = None if view else partial(self._same_claim, record=record, request=request, facts=facts)
                    self._check(METADATA, path, self._render(record, request, facts, view), record, kept)
                if spec in todo:
                    self._check(CDI, spec, self._render_cdi(record, request, facts), record)

    def _paths(self, record: PreparedClaim) -> tuple[Path, ...]:
        """The claim's files, each request's metadata file and CDI spec (made once: a path costs
        more to build than the stat that checks it)."""
        paths = self._claim_paths.get(record.uid)
        if paths is None:
            requests = sorted({d.request for d in record.devices})
            paths = tuple(
                path
                for r in requests
                for path in (self.paths.file(record.namespace, record.name, r), self.paths.cdi_spec(record.uid, r))
            )
            self._claim_paths[record.uid] = paths
        return paths

    def _unchanged(self, paths: Iterable[Path]) -> bool:
        """Whether each file is the one last written or checked (same size, times and inode)."""
        for path in paths:
            known = self._written.get(path)
            if known is None:
                return False
            try:
                if _stamp(os.stat(path)) != known:
                    return False
            except OSError:
                return False
        return True

    def _check(
        self,
        kind: str,
        path: Path,
        expected: bytes,
        record: PreparedClaim,
        accept: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``path`` holds ``expected`` (or what ``accept`` takes), else it is written again."""
        try:
            data, stamp = _read(path)
        except FileNotFoundError:
            reason = MISSING
        except OSError:
            reason = UNREADABLE
        else:
            if data == expected or (accept is not None and accept(data)):
                self._written[path] = stamp
                return
            parses = self._parses(data) if kind == METADATA else _cdi_parses(data)
            reason = _damage(data, expected, parses)
        self._put(path, expected)
        self._mended(Mend(kind, reason, str(path), f"{record.namespace}/{record.name}"))

    def _parses(self, data: bytes) -> bool:
        """Whether ``data`` is a stream of one object per version written."""
        try:
            return len(decode_stream(data)) == len(self.versions)
        except ValueError:
            return False

    def _same_claim(self, data: bytes, record: PreparedClaim, request: str, facts: ClaimFacts) -> bool:
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
            and _is_int(meta.get("generation"))
            and first.get("podClaimName") == facts.pod_claim_name
            and isinstance(requests, list)
            and len(requests) == 1
            and isinstance(requests[0], dict)
            and requests[0].get("name") == request
            and [e.get("name") if isinstance(e, dict) else None for e in requests[0].get("devices") or []] == names
        )

    def _put(self, path: Path, data: bytes) -> None:
        self._written[path] = _write_atomic(path, data)

    def _mended(self, mend: Mend) -> None:
        log.warning(
            "owned file written again",
            extra={"kv": {"file": mend.path, "kind": mend.kind, "reason": mend.reason, "claim": mend.claim}},
        )
        with self._mends_lock:
            self.mended[(mend.kind, mend.reason)] = self.mended.get((mend.kind, mend.reason), 0) + 1
            self._mends.append(mend)

    def mend_counts(self) -> dict[tuple[str, str], int]:
        """(kind, reason) -> files written again since start (the metric, read at scrape)."""
        with self._mends_lock:
            return dict(self.mended)

    def take_mends(self) -> list[Mend]:
        """The files written again since the last call (for the daemon's Node event)."""
        with self._mends_lock:
            out, self._mends = self._mends, []
        return out

    # -- unprepare -----------------------------------------------------------------------------

    def unprepared(self, claim: PreparedClaim) -> None:
        """Remove the claim's files and CDI specs (none there: nothing to do)."""
        with self._files_lock:
            shutil.rmtree(self.paths.claim_dir(claim.namespace, claim.name), ignore_errors=True)
            for request in {d.request for d in claim.devices}:
                self.paths.cdi_spec(claim.uid, request).unlink(missing_ok=True)
            for path in self._paths(claim):
                self._written.pop(path, None)
            self._facts.pop(claim.uid, None)
            self._claim_paths.pop(claim.uid, None)


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


SETTLE_TIMEOUT = 5.0
"""Seconds a container of a pod waits for its metadata rewrite (a few ms): then it starts with the
file as it was, as after a failed rewrite."""


class MetadataStatusSink:
    """The NRI hooks' status sink with the metadata update: RunPodSandbox queues the rewrite of the
    files (off its path, like the claim status write) and :meth:`settle`, called before a container
    of the pod is created, waits for it and checks the pod's files: the containers mount the files,
    and the runtime creates them only after RunPodSandbox answered."""

    def __init__(self, metadata: DeviceMetadataWriter, status: Any) -> None:
        self.metadata, self.status = metadata, status
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="device-metadata")
        self._pending: dict[str, set[Future[None]]] = {}  # pod UID -> its rewrites not done yet
        self._lock = threading.Lock()

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        future = self._writer.submit(self._rewrite, pod_uid, claim, list(results))
        with self._lock:
            self._pending.setdefault(pod_uid, set()).add(future)
        future.add_done_callback(lambda f: self._done(pod_uid, f))
        self.status.pod_network_ready(pod_uid, claim, results)

    def _rewrite(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        try:
            self.metadata.network_ready(claim, results, pod_uid)
        except Exception as exc:  # noqa: BLE001 - the pod runs; its file keeps the prepare-time facts
            log.warning(
                "device metadata not updated", extra={"kv": {"pod": pod_uid, "claim": claim.uid, "error": str(exc)}}
            )

    def _done(self, pod_uid: str, future: Future[None]) -> None:
        with self._lock:
            left = self._pending.get(pod_uid)
            if left is not None:
                left.discard(future)
                if not left:
                    del self._pending[pod_uid]

    def settle(self, pod_uid: str, timeout: float = SETTLE_TIMEOUT) -> None:
        """The pod's queued rewrites are on the node (a failed one is logged: the file keeps the
        prepare-time facts), and its claims' files are as they should be (a lost or damaged one
        written again: a restarted container mounts them with no prepare and no sandbox start)."""
        with self._lock:
            futures = list(self._pending.get(pod_uid, ()))
        if futures and wait(futures, timeout).not_done:
            log.warning("device metadata rewrite still running: container created", extra={"kv": {"pod": pod_uid}})
        try:
            self.metadata.keep_pod(pod_uid)
        except Exception as exc:  # noqa: BLE001 - the container is created in any case
            log.warning("device metadata files not checked", extra={"kv": {"pod": pod_uid, "error": str(exc)}})

    def close(self) -> None:
        """Finish the queued rewrites (at shutdown)."""
        self._writer.shutdown(wait=True)

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        self.status.pod_network_failed(pod_uid, claim, device, step, message)

    def nic_returned_unattended(
        self, pod_uid: str, claim: PreparedClaim, device: str, message: str, lost: bool
    ) -> None:
        self.status.nic_returned_unattended(pod_uid, claim, device, message, lost)
