"""Crash-safe driver state: prepared claims and the network state of running pods.

Everything the driver must remember across a restart lives here, in two JSON
files written by atomic replace (write temp, fsync, rename, fsync dir), so a
driver killed at any instant finds either the old or the new state, never a torn
one:

- ``<state dir>/checkpoint.json``: :class:`PreparedClaim` entries written by
  NodePrepareResources. On disk: the kubelet re-prepares after a reboot but
  expects unprepare to work for claims prepared before a driver restart.
- ``<runtime dir>/pods.json``: :class:`PodNetState` entries the NRI hooks write
  *before* each netlink step (write-ahead), so a restarted driver knows which
  NICs may sit in which namespace and under which name. This belongs on tmpfs
  (``/run/dranet``): it survives driver restarts, and a reboot (which destroys
  every pod namespace and returns every NIC) clears it, which is exactly right.
  tmpfs also keeps fsync out of the RunPodSandbox budget (disk fsync p99 was
  26 ms here).

An update writes only the file whose content changed. Two driver instances may share the files for
a moment (a DaemonSet rolling update with surge: the kubelet may prepare a claim in one and
unprepare it in the other), so the store is coherent across processes: every read first checks
(one ``stat`` per file) whether another process replaced a file and reloads it then, and every
update holds an ``flock`` on ``checkpoint.lock`` in the state directory around reload, change
and write. Each file carries ``version``
(:data:`SCHEMA_VERSION`); an older file is migrated when read (:data:`MIGRATIONS`, one step per
version), a newer one is refused: a downgraded driver must not guess at state it cannot read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from driver.model.device import Device
from driver.model.network_config import NetworkConfig

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
"""Version of both state files. 1: device configs as raw ``{"opaque": [params, ...]}`` dicts,
pods with ``rdma_moved``/``host_up``; 2: each device's config in its canonical typed form; 3: configs
may carry dranet's remaining fields (rules, neighbors, VRF, sysctls, GSO/GRO sizes, eBPF, DHCP,
profile) and pods what the hooks changed for them. A version-2 driver would ignore those fields
(moving a NIC without its VRF) or fail on them, so it must refuse a version-3 file instead.

A file is written as version 3 only when its content needs it (:data:`COMPATIBLE_VERSION`
otherwise): until a claim uses one of those fields, a version-2 driver (the old instance of a
rolling update with surge, a downgrade) keeps reading the files this one writes."""
COMPATIBLE_VERSION = 2
"""The version written while nothing in a file needs :data:`SCHEMA_VERSION`."""
_V2_INTERFACE_KEYS = frozenset({"name", "addresses", "mtu", "hardwareAddr"})
_V3_POD_FIELDS = (
    "host_rules",
    "host_neighbors",
    "host_offload_sizes",
    "host_sysctls",
    "vrf",
    "ebpf_detached",
    "dhcp_lease",
)
"""MovedDevice fields a version-2 reader does not know: written only when set."""
T = TypeVar("T")


@dataclass
class PreparedDevice:
    """One allocated device of a prepared claim, with what pod start will need."""

    request: str  # base request name ("nic", not "nic/sub")
    pool: str
    device: str
    snapshot: Device  # the device as discovered at prepare time (attributes + host facts)
    config: NetworkConfig = field(default_factory=NetworkConfig)  # decoded and validated once, at prepare
    # The cloud provider's config for this NIC, already merged under the claim's into ``config``;
    # kept to tell its routes from the claim's (host routes are copied only when the claim set none).
    cloud_config: NetworkConfig | None = None
    # Allocated with adminAccess (or a shareID): other claims may hold the device at the same time.
    # Written only when true; absent (files from before, older drivers): False, the safe reading.
    shared: bool = False

    @property
    def needs_v3(self) -> bool:
        """Whether the config holds what a version-2 driver cannot read right (see :data:`SCHEMA_VERSION`):
        interface fields beyond name/addresses/MTU/MAC, neighbors, a profile, or rules of the claim's
        own (a cloud provider's rules were in version 2 already)."""
        cfg = self.config
        if cfg.neighbors is not None or cfg.profile is not None:
            return True
        iface = cfg.to_parameters().get("interface") or {}
        if set(iface) - _V2_INTERFACE_KEYS:
            return True
        cloud_rules = set(self.cloud_config.rules or ()) if self.cloud_config else set()
        return any(r not in cloud_rules for r in cfg.rules or ())

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form: the config as its canonical parameters."""
        out: dict[str, Any] = {name: getattr(self, name) for name in ("request", "pool", "device")}
        out.update(snapshot=_plain(self.snapshot), config=self.config.to_parameters())
        if self.cloud_config is not None:  # absent in older files; ignored by older drivers
            out["cloudConfig"] = self.cloud_config.to_parameters()
        if self.shared:
            out["shared"] = True
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDevice:
        """Inverse of :meth:`to_dict`."""
        snapshot, config = Device.from_dict(data["snapshot"]), NetworkConfig.from_parameters(data["config"])
        cloud = data.get("cloudConfig")
        cloud_config = None if cloud is None else NetworkConfig.from_parameters(cloud)
        return cls(
            data["request"], data["pool"], data["device"], snapshot, config, cloud_config, data.get("shared") is True
        )


@dataclass
class PreparedClaim:
    """A ResourceClaim the kubelet asked us to prepare, keyed by claim UID."""

    uid: str
    namespace: str
    name: str
    pod_uids: list[str] = field(default_factory=list)  # from status.reservedFor (pods)
    devices: list[PreparedDevice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form."""
        out: dict[str, Any] = {name: getattr(self, name) for name in ("uid", "namespace", "name", "pod_uids")}
        out["devices"] = [d.to_dict() for d in self.devices]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedClaim:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["devices"] = [PreparedDevice.from_dict(d) for d in data.get("devices", [])]
        return cls(**data)


@dataclass
class MovedDevice:
    """Where one NIC of a pod is, and how to give it back exactly as it was.

    ``step`` is written before the corresponding netlink operation so that after
    a crash the driver knows the NIC may already be in the pod namespace.
    """

    device: str
    host_ifname: str
    pod_ifname: str
    permanent_mac: str | None = None
    pci_address: str | None = None
    host_mtu: int | None = None
    host_mac: str | None = None
    host_addresses: list[str] = field(default_factory=list)  # CIDRs on the host side
    host_routes: list[dict[str, Any]] = field(default_factory=list)  # route dicts, see netns module
    # Its host rules and permanent neighbors (driver.netlink.pod_rules dicts), put back on return.
    host_rules: list[dict[str, Any]] = field(default_factory=list)
    host_neighbors: list[dict[str, Any]] = field(default_factory=list)
    rdma_device: str | None = None
    pod_mac: str | None = None  # MAC in the pod (configured or host MAC), to find it again
    # ethtool settings changed in the pod: their host values (kernel names), restored on return.
    host_features: dict[str, bool] = field(default_factory=dict)
    host_private_flags: dict[str, bool] = field(default_factory=dict)
    # Part B settings (see driver/nri/pod_extras.py): the host's GSO/GRO sizes and sysctls, set
    # back on return; the VRF it is enslaved to in the pod; the eBPF programs taken off it
    # ({"hook", "id", "how"}: ids only, a program is not kept and cannot be reattached).
    host_offload_sizes: dict[str, int] = field(default_factory=dict)
    host_sysctls: dict[str, int] = field(default_factory=dict)
    vrf: str | None = None
    ebpf_detached: list[dict[str, Any]] = field(default_factory=list)
    step: str = "pending"  # pending -> moving -> in-pod -> returning -> returned
    # interface.dhcp: the lease taken in the pod (``driver.dhcp.wire.Lease`` form), released on return.
    dhcp_lease: dict[str, Any] | None = None


@dataclass
class PodNetState:
    """The network namespace of a pod and the NICs moved into it."""

    pod_uid: str
    sandbox_id: str = ""
    namespace: str = ""
    name: str = ""
    netns_path: str = ""
    devices: list[MovedDevice] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PodNetState:
        """Inverse of the checkpoint's plain form."""
        return cls(**{**data, "devices": [MovedDevice(**d) for d in data.get("devices", [])]})


@dataclass
class DriverState:
    """The whole checkpoint: claims by UID, pods by UID."""

    claims: dict[str, PreparedClaim] = field(default_factory=dict)
    pods: dict[str, PodNetState] = field(default_factory=dict)

    def claims_for_pod(self, pod_uid: str) -> list[PreparedClaim]:
        """Prepared claims reserved for ``pod_uid``, in stable (UID) order."""
        return [c for _, c in sorted(self.claims.items()) if pod_uid in c.pod_uids]

    def claims_json(self) -> dict[str, Any]:
        """The prepared claims part (``checkpoint.json``)."""
        return {"claims": {k: v.to_dict() for k, v in self.claims.items()}}

    def pods_json(self) -> dict[str, Any]:
        """The pod network state part (``pods.json``); version-3 device fields only where set."""
        pods = {k: _plain(v) for k, v in self.pods.items()}
        for pod in pods.values():
            for device in pod["devices"]:
                for name in _V3_POD_FIELDS:
                    if not device.get(name):
                        device.pop(name, None)
        return {"pods": pods}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriverState:
        """Both parts from one document of the current version (see :func:`migrate` for older)."""
        _check_version(data)
        return cls(
            claims={k: PreparedClaim.from_dict(v) for k, v in data.get("claims", {}).items()},
            pods={k: PodNetState.from_dict(v) for k, v in data.get("pods", {}).items()},
        )


def claim_device_counts(state: DriverState) -> tuple[int, int]:
    """``(allocated, ready)``: the devices of prepared claims, once per pod each claim is reserved
    for, and how many of them the NRI hook has attached (their NIC is ``in-pod`` for that pod).

    A device without a netdev (RDMA only) has nothing to attach: ready once prepared.
    """
    allocated = ready = 0
    for claim in state.claims.values():
        for pod_uid in claim.pod_uids:
            pod = state.pods.get(pod_uid)
            in_pod = {m.device for m in pod.devices if m.step == "in-pod"} if pod else set()
            for d in claim.devices:
                allocated += 1
                ready += not d.snapshot.host.ifname or d.device in in_pod
    return allocated, ready


def _check_version(data: dict[str, Any]) -> None:
    version = data.get("version")
    # A version-2 file is a valid version-3 file (3 only adds optional fields; see COMPATIBLE_VERSION).
    if version not in (COMPATIBLE_VERSION, SCHEMA_VERSION) or isinstance(version, bool):
        raise CheckpointError(f"checkpoint schema version {version!r} is not {SCHEMA_VERSION}")


def _v1_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A version-1 device config (flat parameters, or prepare's ``{"opaque": [params, ...]}``
    merged in order) as canonical parameters. Version-1 daemons stored only configs their strict
    decoder had accepted, in canonical form, so reading them back needs no validation."""
    config = config or {}
    params = config["opaque"] if isinstance(config.get("opaque"), list) else [config]
    merged = NetworkConfig()
    for p in params:
        merged = merged.merged(NetworkConfig.from_parameters(p or {}))
    return merged.to_parameters()


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    claims = {
        uid: {**c, "devices": [{**d, "config": _v1_config(d.get("config"))} for d in c.get("devices", [])]}
        for uid, c in data.get("claims", {}).items()
    }
    dropped = ("rdma_moved", "host_up")  # never read: a moved RDMA device follows its netdev; links come back up
    pods = {
        uid: {**p, "devices": [{k: v for k, v in d.items() if k not in dropped} for d in p.get("devices", [])]}
        for uid, p in data.get("pods", {}).items()
    }
    return {
        **data,
        "version": 2,
        **({"claims": claims} if "claims" in data else {}),
        **({"pods": pods} if "pods" in data else {}),
    }


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 only adds optional fields: a version-2 file is a valid version-3 file."""
    return {**data, "version": 3}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}
"""Version N -> the function that turns a version-N file into version N + 1."""


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A state file of any version this driver knows, brought to :data:`SCHEMA_VERSION`.

    Files without ``version`` are refused like any unknown version; so is a file from a newer
    driver, with a message that says so.
    """
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise CheckpointError(
            f"checkpoint schema version {version} was written by a newer driver (this one "
            f"reads versions 1 to {SCHEMA_VERSION}); refusing to start rather than lose state"
        )
    while version in MIGRATIONS:
        data = MIGRATIONS[version](data)
        version = data["version"]
    _check_version(data)
    return data


def _plain(obj: Any) -> Any:
    """JSON-able copy of dataclasses/lists/dicts; same result as ``asdict`` but ~3x faster.

    The whole state is serialised on every prepare, so this is on the NodePrepareResources
    path (``asdict`` deep-copies every leaf: 27 ms for 100 prepared 4-device claims).
    """
    if hasattr(obj, "__dataclass_fields__"):
        return {name: _plain(getattr(obj, name)) for name in obj.__dataclass_fields__}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


_Stamp = tuple[int, int, int]
_UNSEEN: Any = object()  # never equal to a stamp: a file we have not looked at yet is "changed"


def _stamp_of(st: os.stat_result) -> _Stamp:
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _stamp(path: Path) -> _Stamp | None:
    try:
        return _stamp_of(os.stat(path))
    except FileNotFoundError:
        return None


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be used (unreadable, or written by a newer driver)."""


class CheckpointWriteError(CheckpointError):
    """A state file could not be saved; the previous file is intact and the change was not applied.

    The message names the file and the errno, e.g. ``cannot save state to
    /var/lib/dranet/checkpoint.json: No space left on device (ENOSPC)``: it is returned to the kubelet
    (or the runtime) as the error of every call that needed the write.
    """

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.errno = error.errno
        name = errno.errorcode.get(error.errno or 0, "unknown errno")
        reason = error.strerror or str(error)
        super().__init__(f"cannot save state to {path}: {reason} ({name}); the previous state is kept")


@dataclass(frozen=True)
class QuarantinedFile:
    """A state file that could not be parsed at start, moved aside (never deleted) for a human."""

    path: Path
    moved_to: Path
    reason: str


@dataclass(frozen=True)
class FileOps:
    """The system calls a state write makes. The default is the real thing; tests pass a
    replacement to inject the faults a real disk gives rarely (EIO) or to count the steps."""

    open: Callable[[str, int, int], int] = os.open
    write: Callable[[int, bytes | memoryview], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    close: Callable[[int], None] = os.close
    replace: Callable[[str, str], None] = os.replace
    unlink: Callable[[str], None] = os.unlink


_CORRUPT = (ValueError, AttributeError, KeyError, TypeError)
"""What parsing a damaged file raises (``json.JSONDecodeError`` is a ``ValueError``)."""


class CheckpointStore:
    """Owns the checkpoint files; every mutation is persisted before it returns.

    Use :meth:`update` for read-modify-write: it runs ``fn`` on the in-memory
    state under a lock and writes the changed part(s) atomically. Readers use
    :meth:`read`, which gives the function a consistent view. ``runtime_directory``
    holds the pod network state (default: ``directory``, e.g. in tests).

    At start a temporary file left by an interrupted write is removed, and a state file that
    cannot be parsed is moved aside (``<name>.corrupt-<UTC time>``, kept) and :attr:`quarantined`
    lists it, so the daemon can rebuild what it can instead of crash-looping. A file written by a
    newer driver is still refused (:class:`CheckpointError`): it is valid, only not ours to read.
    A failed write raises :class:`CheckpointWriteError` and leaves :attr:`write_error` set until
    a write succeeds (``/healthz`` reports it).
    """

    FILENAME = "checkpoint.json"
    PODS_FILENAME = "pods.json"
    LOCK_FILENAME = "checkpoint.lock"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        runtime_directory: str | os.PathLike[str] | None = None,
        *,
        ops: FileOps | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.runtime_directory = Path(runtime_directory) if runtime_directory else self.directory
        self.path = self.directory / self.FILENAME
        self.pods_path = self.runtime_directory / self.PODS_FILENAME
        self.ops = ops or FileOps()
        self.quarantined: list[QuarantinedFile] = []
        self.write_error: CheckpointWriteError | None = None
        self._lock = threading.RLock()
        self._written: dict[Path, bytes] = {}  # last bytes written (or read) per file: what is on disk
        # (inode, mtime, size) of each file as last read or written by us (None: absent); a
        # different stamp means another driver instance replaced it (atomic rename: new inode).
        self._stamps: dict[Path, _Stamp | None] = {}
        self._lock_path = self.directory / self.LOCK_FILENAME
        self._lock_fd = -1  # open while an update holds the cross-process lock
        self._lock_depth = 0  # update() may nest (RLock): only the outermost takes the flock
        # Encoded JSON per claim, reused while the same object is stored: a prepare then
        # encodes only its new claims, not the whole node's state (14 ms for 100 claims).
        # Stored PreparedClaims are never mutated in place (prepare adds/removes whole claims).
        self._encoded: dict[str, tuple[PreparedClaim, bytes, bool]] = {}  # (claim, JSON, needs version 3)
        with self._lock, self._cross_process():
            # Under the lock: a leftover temporary file is then never another instance's write.
            self._state = self._load(cleanup=True)

    @contextlib.contextmanager
    def _cross_process(self) -> Iterator[None]:
        """Hold ``checkpoint.lock`` (re-entrant within this store): other driver instances wait."""
        self._lock_depth += 1
        try:
            if self._lock_depth == 1:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing releases the flock
                self._lock_fd = -1

    def _load(self, cleanup: bool = False) -> DriverState:
        claims = self._load_part(self.path, "claims", cleanup)
        pods = self._load_part(self.pods_path, "pods", cleanup)
        # A checkpoint from before the split holds the pods too; keep them.
        return DriverState(claims=claims.claims, pods={**claims.pods, **pods.pods})

    def _load_part(self, path: Path, part: str, cleanup: bool = False) -> DriverState:
        path.parent.mkdir(parents=True, exist_ok=True)
        if cleanup:
            _remove_leftover(path)
        try:
            with open(path, "rb") as f:
                # The stamp of the very inode we read (a rename after the read gives a new one).
                stamp = _stamp_of(os.fstat(f.fileno()))
                raw = f.read()
        except FileNotFoundError:
            # A missing file is an empty part: no need to write it until something goes in.
            self._written[path] = _encode({part: {}})
            self._stamps[path] = None
            return DriverState()
        except OSError as exc:  # EIO, EACCES: not damaged, unreadable; never guess at state
            raise CheckpointError(f"cannot read {path}: {exc}") from exc
        self._stamps[path] = stamp
        try:
            data = migrate(json.loads(raw))
            state = DriverState.from_json(data)
        except CheckpointError as exc:
            if not isinstance(data_version(raw), int):
                return self._quarantine(path, part, str(exc))
            raise  # a valid file of another version: kept, refused
        except (*_CORRUPT, RecursionError) as exc:
            return self._quarantine(path, part, f"{type(exc).__name__}: {exc}")
        self._written[path] = raw
        return state

    def _quarantine(self, path: Path, part: str, reason: str) -> DriverState:
        """Move a damaged state file aside (kept for a human) and start that part empty."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved = path.with_name(f"{path.name}.corrupt-{stamp}")
        n = 1
        while moved.exists():
            n += 1
            moved = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        try:
            os.rename(path, moved)
        except OSError as exc:
            raise CheckpointError(f"cannot parse {path} ({reason}) nor move it aside: {exc}") from exc
        log.error(
            "state file is corrupt: moved aside, starting without it and rebuilding what can be rebuilt",
            extra={"kv": {"path": str(path), "moved_to": str(moved), "error": reason}},
        )
        self.quarantined.append(QuarantinedFile(path, moved, reason))
        self._stamps[path] = None
        self._written[path] = _encode({part: {}})
        return DriverState()

    def refresh(self) -> bool:
        """Reload the files another process replaced since we last read or wrote them.

        Returns True if anything was reloaded. Raises :class:`CheckpointError` when the new
        content cannot be read (e.g. a newer driver's schema): never act on a misread state.
        """
        with self._lock:
            if all(_stamp(p) == self._stamps.get(p, _UNSEEN) for p in (self.path, self.pods_path)):
                return False
            self._encoded.clear()
            self._state = self._load()
            return True

    def read(self, fn: Callable[[DriverState], T]) -> T:
        """Run ``fn`` on the current state under the lock (do not mutate)."""
        with self._lock:
            self.refresh()
            return fn(self._state)

    def update(self, fn: Callable[[DriverState], T]) -> T:
        """Mutate the state with ``fn`` and persist it before returning ``fn``'s result.

        Raises :class:`CheckpointWriteError` when the new state could not be saved; the state
        is then what it was before the call (in memory and on disk).
        """
        with self._lock, self._cross_process():  # the whole read-modify-write is one step
            try:
                self.refresh()
                result = fn(self._state)
                self._write()
            except BaseException:
                # fn may have mutated the state before failing, or the write failed (ENOSPC):
                # go back to what is on disk so memory never claims what was not persisted.
                self._encoded.clear()
                self._state = self._on_disk()
                raise
            return result

    def retry_write(self) -> bool:
        """After a failed write, write the current state again; True once writes work again.

        The state equals what is on disk (a failed update is rolled back), so this rewrites the
        same bytes: it only proves the disk takes writes again and clears :attr:`write_error`.
        """
        with self._lock:
            failed = self.write_error
            if failed is None:
                return True
            try:
                self._atomic_write(failed.path, self._written[failed.path])
            except CheckpointWriteError:
                return False
            log.info("state writes work again", extra={"kv": {"path": str(failed.path)}})
            return True

    def _on_disk(self) -> DriverState:
        """The state from the bytes last written or read (no I/O: it cannot fail like the disk)."""
        claims = DriverState.from_json(json.loads(self._written[self.path]))
        pods = DriverState.from_json(json.loads(self._written[self.pods_path]))
        return DriverState(claims=claims.claims, pods={**claims.pods, **pods.pods})

    def _write(self) -> None:
        pods = self._state.pods_json()
        parts = ((self.path, self._encode_claims()), (self.pods_path, _encode(pods, _pods_version(pods))))
        for path, data in parts:
            if self._written.get(path) != data:
                self._atomic_write(path, data)
                self._written[path] = data
                self._stamps[path] = _stamp(path)

    def _atomic_write(self, path: Path, data: bytes) -> None:
        try:
            _atomic_write(path, data, self.ops)
        except OSError as exc:
            error = CheckpointWriteError(path, exc)
            if self.write_error is None or str(self.write_error) != str(error):
                log.error("cannot save driver state", extra={"kv": {"path": str(path), "error": str(error)}})
            self.write_error = error
            raise error from exc
        self.write_error = None

    def _encode_claims(self) -> bytes:
        """The claims file, byte for byte what ``_encode(claims_json(), version)`` gives, from cached
        pieces; ``version`` is 3 only when a claim needs it."""
        claims = self._state.claims
        pieces = []
        version = COMPATIBLE_VERSION
        for uid in sorted(claims):
            cached = self._encoded.get(uid)
            if cached is None or cached[0] is not claims[uid]:
                cached = (
                    claims[uid],
                    json.dumps(claims[uid].to_dict(), sort_keys=True, separators=(",", ":")).encode(),
                    any(d.needs_v3 for d in claims[uid].devices),
                )
                self._encoded[uid] = cached
            pieces.append(json.dumps(uid).encode() + b":" + cached[1])
            version = max(version, SCHEMA_VERSION if cached[2] else COMPATIBLE_VERSION)
        for uid in self._encoded.keys() - claims.keys():
            del self._encoded[uid]
        return b'{"claims":{' + b",".join(pieces) + b'},"version":' + str(version).encode() + b"}"


def data_version(raw: bytes) -> Any:
    """The ``version`` of a state file's bytes, or None when they are not a JSON object."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data.get("version") if isinstance(data, dict) else None


def _encode(body: dict[str, Any], version: int = COMPATIBLE_VERSION) -> bytes:
    return json.dumps({"version": version, **body}, sort_keys=True, separators=(",", ":")).encode()


def _pods_version(body: dict[str, Any]) -> int:
    """Version 3 when a pod device carries a field version 2 does not know (:func:`DriverState.pods_json`)."""
    pods = body["pods"].values()
    needed = any(set(_V3_POD_FIELDS) & d.keys() for p in pods for d in p["devices"])
    return SCHEMA_VERSION if needed else COMPATIBLE_VERSION


def _tmp_path(path: Path) -> Path:
    return path.with_suffix(".tmp")


def _remove_leftover(path: Path) -> None:
    """Remove the temporary file of a write that was interrupted (kill -9, power loss)."""
    tmp = _tmp_path(path)
    try:
        tmp.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning(
            "cannot remove a leftover temporary state file", extra={"kv": {"path": str(tmp), "error": str(exc)}}
        )
        return
    log.info("removed the temporary file of an interrupted state write", extra={"kv": {"path": str(tmp)}})


def _atomic_write(path: Path, data: bytes, ops: FileOps) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, never a mix.

    Every byte is written (a short write on a nearly full disk is continued, and fails with
    ENOSPC when nothing more fits), the file and then its directory are fsynced, and only a
    complete temporary file is renamed over the old one. On any failure the temporary file is
    removed and the old file is untouched; the ``OSError`` propagates.
    """
    tmp = _tmp_path(path)
    renamed = False
    try:
        fd = ops.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = ops.write(fd, view)
                if written <= 0:  # no progress and no error: treat as a full disk, never spin
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                view = view[written:]
            ops.fsync(fd)
        finally:
            ops.close(fd)
        ops.replace(str(tmp), str(path))
        renamed = True
        dir_fd = ops.open(str(path.parent), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, 0)
        try:
            ops.fsync(dir_fd)
        finally:
            ops.close(dir_fd)
    except OSError:
        if not renamed:
            try:
                ops.unlink(str(tmp))
            except OSError:
                pass  # never created, or the disk is gone: the start-up cleanup retries
        raise
