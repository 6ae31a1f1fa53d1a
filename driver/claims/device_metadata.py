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
the pod's view of each NIC (:class:`~driver.claims.metadata_document.NicView`, in the pod's state under
:data:`~driver.claims.metadata_document.VIEW_RECORD`, written
before the file). The files the driver owns (the metadata file and the CDI spec of each request)
are checked (:meth:`DeviceMetadataWriter.keep`) at start, before each container of a pod is
created, and every few seconds in the background, and written again when missing, unreadable,
damaged or different: compact JSON on tmpfs, without a sync, always a temporary file renamed over
the old one (never half-written by the driver).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from driver.checkpoint.state import GpuPair, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.claims.container_settings import pod_gid_index
from driver.claims.metadata_document import (
    GPU_ATTRIBUTES,
    MAX_IPS,
    METADATA_FILE,
    PCI_BUS_ID,
    POD_CLAIM_ANNOTATION,
    VERSIONS,
    ClaimFacts,
    ClaimView,
    MetadataDocument,
    MetadataPaths,
    NicView,
    claim_view,
    decode_first,
    is_int,
    pair_up,
    put_views,
)
from driver.claims.metadata_leaving import LeavingClaims, strays
from driver.claims.owned_files import CDI, METADATA, Mend, OwnedFiles, cdi_parses
from driver.claims.status_entries import DeviceResult
from driver.dra.protocol import PrepareResult, ResultDevice
from driver.inventory import topology
from driver.model.device import ATTRIBUTE_DOMAIN

log = logging.getLogger(__name__)


class MetadataError(Exception):
    """A metadata file or CDI spec could not be written (the claim's prepare fails with it)."""


ForeignLookup = Callable[[str], Mapping[tuple[str, str], Mapping[str, Any]]]
"""driver -> (pool, device) -> attributes in API form: another driver's devices on this node, from
its ResourceSlices."""
ClaimFetch = Callable[[PreparedClaim], Mapping[str, Any]]
"""The ResourceClaim of a prepared claim, from the API server (raises when it cannot be had)."""


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
        self.document = MetadataDocument(paths, ATTRIBUTE_DOMAIN, versions)
        self.files = OwnedFiles()  # each owned file's stamp, and the files written again
        self._claim_paths: dict[str, tuple[Path, ...]] = {}  # claim UID -> its files
        self._facts: dict[str, ClaimFacts] = {}  # claim UID -> facts of a record without them
        self.leaving = LeavingClaims()  # unprepared claims whose files are still here
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
                    self._settle_leaving(record)
                    for request in requests:
                        self.files.put(
                            self.paths.file(record.namespace, record.name, request),
                            self.document.render(record, request, facts, None),
                        )
                        self.files.put(
                            self.paths.cdi_spec(record.uid, request), self.document.render_cdi(record, request, facts)
                        )
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
                if not self.store.update(lambda s: put_views(s, pod_uid, claim.uid, views)):
                    log.debug("device metadata: pod gone, not rewritten", extra={"kv": {"pod": pod_uid}})
                    return
            facts = self._claim_facts(claim)
            view = ClaimView(generation, views)
            for request in sorted({d.request for d in claim.devices}):
                self.files.put(
                    self.paths.file(claim.namespace, claim.name, request),
                    self.document.render(claim, request, facts, view),
                )
                cdi = self.paths.cdi_spec(claim.uid, request)
                if not self.files.unchanged([cdi]):
                    self._check(CDI, cdi, self.document.render_cdi(claim, request, facts), claim)

    def _view(self, claim_uid: str, generation: int, d: PreparedDevice, result: DeviceResult) -> NicView:
        """One NIC as the pod sees it. Its MTU is the pod link's (a claim's ``interface.mtu`` only
        when the hooks did not say: the published attribute is the host's at the last scan)."""
        mtu = result.mtu if result.mtu is not None else (d.config.interface.mtu if d.config.interface else None)
        rdma = result.rdma_in_pod or d.snapshot.host.rdma_device  # a share's own device in the pod
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
            if meta.get("uid") == claim.uid and is_int(meta.get("generation")):
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
            todo = {p for p in self._paths(record) if full or not self.files.unchanged([p])}
            if not todo:
                return
            prepared, view = True, None
            if self.store is not None:
                prepared, view = self.store.read(lambda s: (record.uid in s.claims, claim_view(s, record.uid)))
            if not prepared:
                return  # unprepared meanwhile: its files are gone for good
            self._settle_leaving(record)
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
                    # No pod's view: the file a pod's start wrote is kept (see MetadataDocument.same_claim).
                    kept = (
                        None if view else partial(self.document.same_claim, record=record, request=request, facts=facts)
                    )
                    self._check(METADATA, path, self.document.render(record, request, facts, view), record, kept)
                if spec in todo:
                    self._check(CDI, spec, self.document.render_cdi(record, request, facts), record)

    def _paths(self, record: PreparedClaim) -> tuple[Path, ...]:
        """The claim's files, each request's metadata file and CDI spec (made once: a path costs
        more to build than the stat that checks it)."""
        paths = self._claim_paths.get(record.uid)
        if paths is None:
            paths = self._claim_paths[record.uid] = self._paths_of(record)
        return paths

    def _paths_of(self, record: PreparedClaim) -> tuple[Path, ...]:
        requests = sorted({d.request for d in record.devices})
        return tuple(
            path
            for r in requests
            for path in (self.paths.file(record.namespace, record.name, r), self.paths.cdi_spec(record.uid, r))
        )

    def _check(
        self,
        kind: str,
        path: Path,
        expected: bytes,
        record: PreparedClaim,
        accept: Callable[[bytes], bool] | None = None,
    ) -> None:
        """``path`` holds ``expected`` (or what ``accept`` takes), else it is written again."""
        parses = self.document.parses if kind == METADATA else cdi_parses
        self.files.check(kind, path, expected, f"{record.namespace}/{record.name}", parses, accept)

    def mend_counts(self) -> dict[tuple[str, str], int]:
        """(kind, reason) -> files written again since start (the metric, read at scrape)."""
        return self.files.mend_counts()

    def take_mends(self) -> list[Mend]:
        """The files written again since the last call (for the daemon's Node event)."""
        return self.files.take_mends()

    # -- unprepare -----------------------------------------------------------------------------

    def unprepared(self, claim: PreparedClaim) -> None:
        """Remove the claim's files and CDI specs now (none there: nothing to do)."""
        with self._files_lock:
            self.leaving.take_named(claim.namespace, claim.name)
            self._forget(claim)
            self._remove(claim)

    def unprepared_later(self, claim: PreparedClaim) -> None:
        """The claim was unprepared: its files go with the next check, or before files of a claim of
        the same name are written (see :mod:`driver.claims.metadata_leaving`), not on the kubelet's
        call."""
        self._forget(claim)
        self.leaving.add(claim)

    def remove_leaving(self) -> int:
        """(a worker thread) Remove the files of every claim unprepared since the last call; how many."""
        if not len(self.leaving):
            return 0
        with self._files_lock:
            taken = self.leaving.take()
            for claim in taken:
                self._remove(claim)
        return len(taken)

    def sweep_strays(self) -> list[Path]:
        """(a worker thread) Remove our files and claim directories that no stored or leaving claim
        owns and that have not changed for :data:`~driver.claims.metadata_leaving.STRAY_AFTER`
        seconds (left by a crash); the paths removed. Only while the stored claims are whole."""
        if self.store is None:
            return []
        with self._files_lock:
            owners = [*self.store.read(lambda s: list(s.claims.values())), *self.leaving.claims()]
            found = strays(self.paths, owners, time.time())
            for path in found:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        if found:
            log.info("device metadata files no claim owns removed", extra={"kv": {"paths": [str(p) for p in found]}})
        return found

    def _settle_leaving(self, record: PreparedClaim) -> None:
        """(files lock held) Before ``record``'s files are written: the files of a leaving claim of
        the same namespace and name go first, but those ``record`` writes again (the same claim
        prepared again keeps its paths)."""
        for old in self.leaving.take_named(record.namespace, record.name):
            self._remove(old, keep=self._paths_of(record) if old.uid == record.uid else ())

    def _forget(self, claim: PreparedClaim) -> None:
        self._facts.pop(claim.uid, None)
        self._claim_paths.pop(claim.uid, None)

    def _remove(self, claim: PreparedClaim, keep: Collection[Path] = ()) -> None:
        """(files lock held) The claim's metadata files and CDI specs, but ``keep``."""
        if not keep:
            shutil.rmtree(self.paths.claim_dir(claim.namespace, claim.name), ignore_errors=True)
        for path in self._paths_of(claim):
            if path in keep:
                continue
            path.unlink(missing_ok=True)
            if path.name == METADATA_FILE:
                with contextlib.suppress(OSError):  # its request's directory, once empty
                    path.parent.rmdir()
            self.files.forget(path)
