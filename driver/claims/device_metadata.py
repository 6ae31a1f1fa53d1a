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
(the pod-side name, addresses, MAC), the MTU and the RoCE GID index.

The files are derived state: a lost one is written again from the checkpoint and the
ResourceClaim (at the next prepare, and at every start: a reboot empties them while the kubelet
prepares nothing again), so they are compact JSON written without a sync (a temporary file renamed over the old one:
never half-written). The metadata file is also where the pod claim name lives between calls, so
the checkpoint's format is unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.checkpoint.state import PreparedClaim, PreparedDevice
from driver.claims.container_settings import pod_gid_index
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import PrepareResult, ResultDevice
from driver.inventory import topology
from driver.inventory.attributes import attribute_rank
from driver.model.device import ATTRIBUTE_DOMAIN, STANDARD_DOMAIN, AttributeValue, attribute_to_api

log = logging.getLogger(__name__)

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
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PATH_RANK = {c: i for i, c in enumerate((topology.PIX, topology.PXB, topology.PHB, topology.NODE, topology.SYS))}


class MetadataError(Exception):
    """A metadata file or CDI spec could not be written (the claim's prepare fails with it)."""


@dataclass(frozen=True)
class GpuPair:
    """The GPU of the same claim a NIC pairs with, and the PCIe path between them."""

    device: str  # the GPU's DRA device name
    driver: str
    pci_bus_id: str
    path: str  # PIX, PXB, PHB, NODE, SYS

    def attributes(self, domain: str) -> dict[str, AttributeValue]:
        return {f"{domain}/gpu": self.device, f"{domain}/gpuPciBusID": self.pci_bus_id, f"{domain}/gpuPath": self.path}


ForeignLookup = Callable[[str], Mapping[tuple[str, str], Mapping[str, Any]]]
"""driver -> (pool, device) -> attributes in API form: another driver's devices on this node, from
its ResourceSlices."""


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


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, never half-written (readable 0644: the container reads it as any user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


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


class DeviceMetadataWriter:
    """Writes, updates and removes the metadata files and CDI specs of our claims."""

    def __init__(
        self,
        paths: MetadataPaths,
        sysfs_root: str = "/sys",
        foreign: ForeignLookup | None = None,
        versions: Sequence[str] = VERSIONS,
    ) -> None:
        """``foreign`` finds another driver's device attributes (a GPU's ``pciBusID``) for the
        pairing; without it NICs are not paired."""
        self.paths, self.sysfs_root, self.foreign, self.versions = paths, sysfs_root, foreign, tuple(versions)
        # The pod-start rewrite runs beside the kubelet's calls: an unprepare never races it into
        # leaving a file behind.
        self._files_lock = threading.Lock()
        self.domain = ATTRIBUTE_DOMAIN  # our attributes' domain, whatever the driver's name

    # -- prepare -----------------------------------------------------------------------------

    def prepared(
        self,
        record: PreparedClaim,
        result: PrepareResult,
        claim: Mapping[str, Any] | None,
        fetch: Callable[[], Mapping[str, Any]] | None = None,
    ) -> PrepareResult:
        """``result`` with each device's CDI metadata device, the files written where missing.

        ``claim`` is the ResourceClaim just fetched; None when prepare answered from the checkpoint:
        the files are then kept as they are, and a lost one is written again from ``fetch()`` (the
        pod claim name and the GPUs are in the ResourceClaim, not in the checkpoint)."""
        if result.error:
            return result
        requests = sorted({d.request for d in record.devices})
        try:
            # A claim just fetched is written whole (its files exist only if a crash came between
            # them and the commit, and are the same): no stat on the prepare path.
            missing = requests if claim is not None else [r for r in requests if not self._complete(record, r)]
            if missing:
                if claim is None and fetch is not None:
                    if any(not self.paths.file(record.namespace, record.name, r).is_file() for r in missing):
                        claim = fetch()
                self._write_requests(record, missing, claim)
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

    def _complete(self, record: PreparedClaim, request: str) -> bool:
        return (
            self.paths.file(record.namespace, record.name, request).is_file()
            and self.paths.cdi_spec(record.uid, request).is_file()
        )

    def _write_requests(self, record: PreparedClaim, requests: list[str], claim: Mapping[str, Any] | None) -> None:
        pod_claim = None
        pairs: dict[str, GpuPair] = {}
        if claim is not None:
            pod_claim = ((claim.get("metadata") or {}).get("annotations") or {}).get(POD_CLAIM_ANNOTATION)
            pairs = self.gpu_pairs(record, claim)
        for request in requests:
            path = self.paths.file(record.namespace, record.name, request)
            if claim is None and path.is_file():  # only the CDI spec is gone: keep the file
                pod_claim = decode_first(path.read_bytes()).get("podClaimName")
            else:
                devices = [d for d in record.devices if d.request == request]
                doc = self._document(
                    record, pod_claim, 1, request, [self._device(d, pairs.get(d.device)) for d in devices]
                )
                _write_atomic(path, encode_stream(doc, self.versions))
            self._write_cdi(record, request, pod_claim)

    def _write_cdi(self, record: PreparedClaim, request: str, pod_claim: str | None) -> None:
        mount = {
            "hostPath": str(self.paths.file(record.namespace, record.name, request)),
            "containerPath": self.paths.container_file(record.name, pod_claim, request),
            "options": ["ro", "bind"],
        }
        names = [cdi_device_name(record.uid, request, d.device) for d in record.devices if d.request == request]
        spec = {
            "cdiVersion": CDI_DIGIT_NAME_VERSION if record.uid[:1].isdigit() else CDI_VERSION,
            "kind": f"{self.paths.driver_name}/metadata",
            "devices": [{"name": name, "containerEdits": {"mounts": [mount]}} for name in names],
        }
        _write_atomic(self.paths.cdi_spec(record.uid, request), _json(spec))

    def _document(
        self, record: PreparedClaim, pod_claim: str | None, generation: int, request: str, devices: list[dict[str, Any]]
    ) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "metadata": {
                "name": record.name,
                "namespace": record.namespace,
                "uid": record.uid,
                "generation": generation,
            }
        }
        if pod_claim:
            doc["podClaimName"] = pod_claim
        doc["requests"] = [{"name": request, "devices": devices}]
        return doc

    def _device(self, d: PreparedDevice, pair: GpuPair | None) -> dict[str, Any]:
        """One device entry: what the driver did first, then the published attributes by rank,
        at most :data:`MAX_ATTRIBUTES`."""
        own: dict[str, AttributeValue] = {}
        chars = ",".join(os.path.basename(c.path) for c in d.snapshot.host.char_devices)
        if chars:
            own[f"{self.domain}/rdmaCharDevices"] = chars[:64]
        if pair is not None:
            own |= pair.attributes(self.domain)
        published = {k: v for k, v in d.snapshot.attributes.items() if k not in own}
        ranked = sorted(published, key=lambda n: (attribute_rank(n), n))
        attributes = own | {n: published[n] for n in ranked[: max(0, MAX_ATTRIBUTES - len(own))]}
        return {
            "driver": self.paths.driver_name,
            "pool": d.pool,
            "name": d.device,
            "attributes": {k: attribute_to_api(v) for k, v in sorted(attributes.items())},
        }

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

    def network_ready(self, claim: PreparedClaim, results: Iterable[DeviceResult]) -> None:
        """The NICs are configured in the pod: add what the pod sees to the claim's files."""
        with self._files_lock:
            self._network_ready(claim, {r.device: r for r in results})

    def _network_ready(self, claim: PreparedClaim, by_device: dict[str, DeviceResult]) -> None:
        for request in sorted({d.request for d in claim.devices}):
            path = self.paths.file(claim.namespace, claim.name, request)
            try:
                current = decode_first(path.read_bytes())
            except FileNotFoundError:
                continue  # metadata off when the claim was prepared
            entries = {e.get("name"): e for r in current.get("requests", []) for e in r.get("devices", [])}
            devices = []
            for d in (d for d in claim.devices if d.request == request):
                old = entries.get(d.device) or {}
                result = by_device.get(d.device)
                devices.append(self._with_network(d, old, result))
            doc = {**current, "requests": [{"name": request, "devices": devices}]}
            doc["metadata"] = {**current.get("metadata", {}), "generation": int(current["metadata"]["generation"]) + 1}
            doc.pop("kind", None)
            doc.pop("apiVersion", None)
            _write_atomic(path, encode_stream(doc, self.versions))

    def _with_network(self, d: PreparedDevice, old: dict[str, Any], result: DeviceResult | None) -> dict[str, Any]:
        entry = {**old} if old else self._device(d, None)
        if result is None:
            return entry
        network: dict[str, Any] = {"interfaceName": result.interface_name}
        if result.ips:
            network["ips"] = list(result.ips)[:16]
        if result.hardware_address:
            network["hardwareAddress"] = result.hardware_address
        entry["networkData"] = network
        attrs = dict(entry.get("attributes") or {})
        mtu = (d.config.interface.mtu if d.config.interface else None) or d.snapshot.attributes.get(
            f"{self.domain}/mtu"
        )
        pod_side: dict[str, Any] = {f"{self.domain}/podInterfaceName": attribute_to_api(result.interface_name[:64])}
        if isinstance(mtu, int):
            pod_side[f"{self.domain}/podMTU"] = attribute_to_api(mtu)
        gid = self._gid_index(d, result)
        if gid is not None:
            pod_side[f"{self.domain}/roceGIDIndex"] = attribute_to_api(gid)
        for name in pod_side:
            attrs.pop(name, None)
        room = MAX_ATTRIBUTES - len(pod_side)
        if len(attrs) > room:  # drop the lowest-ranked published ones to make room
            keep = sorted(attrs, key=lambda n: (not n.startswith(f"{self.domain}/gpu"), attribute_rank(n), n))[:room]
            attrs = {k: attrs[k] for k in keep}
        entry["attributes"] = dict(sorted((attrs | pod_side).items()))
        return entry

    def _gid_index(self, d: PreparedDevice, result: DeviceResult) -> int | None:
        """The RoCE v2 GID index of the pod's address on the NIC, if it has one."""
        rdma = d.snapshot.host.rdma_device
        return pod_gid_index(self.sysfs_root, rdma, result.ips) if rdma and not result.no_rdma else None

    # -- unprepare -----------------------------------------------------------------------------

    def unprepared(self, claim: PreparedClaim) -> None:
        """Remove the claim's files and CDI specs (none there: nothing to do)."""
        with self._files_lock:
            shutil.rmtree(self.paths.claim_dir(claim.namespace, claim.name), ignore_errors=True)
            for request in {d.request for d in claim.devices}:
                self.paths.cdi_spec(claim.uid, request).unlink(missing_ok=True)


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
prepare-time file, as after a failed rewrite."""


class MetadataStatusSink:
    """The NRI hooks' status sink with the metadata update: RunPodSandbox queues the rewrite of the
    files (off its path, like the claim status write) and :meth:`settle`, called before a container
    of the pod is created, waits for it: the containers mount the files, and the runtime creates
    them only after RunPodSandbox answered."""

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
            self.metadata.network_ready(claim, results)
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
        prepare-time facts)."""
        with self._lock:
            futures = list(self._pending.get(pod_uid, ()))
        if futures and wait(futures, timeout).not_done:
            log.warning("device metadata rewrite still running: container created", extra={"kv": {"pod": pod_uid}})

    def close(self) -> None:
        """Finish the queued rewrites (at shutdown)."""
        self._writer.shutdown(wait=True)

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        self.status.pod_network_failed(pod_uid, claim, device, step, message)

    def nic_returned_unattended(
        self, pod_uid: str, claim: PreparedClaim, device: str, message: str, lost: bool
    ) -> None:
        self.status.nic_returned_unattended(pod_uid, claim, device, message, lost)
