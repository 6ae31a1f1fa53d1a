"""What the driver remembers: prepared claims, the NICs of running pods, and their plain JSON form.

:class:`PreparedClaim` (with its :class:`PreparedDevice` s) is written by NodePrepareResources;
:class:`PodNetState` (with its :class:`MovedDevice` s) by the NRI hooks, before each netlink step.
:class:`DriverState` holds both and gives the two files' bodies; which version each body needs
(the oldest whose readers know every field it holds) is decided here, next to the fields, against
the versions :mod:`driver.checkpoint.schema` defines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.schema import (
    COMPATIBLE_VERSION,
    CONFIG_FIELDS_VERSION,
    IDENTITY_VERSION,
    RECORDS_VERSION,
    SCHEMA_VERSION,
    SRIOV_VERSION,
    check_version,
)
from driver.model.device import Device, quantity_value

_V2_INTERFACE_KEYS = frozenset({"name", "addresses", "mtu", "hardwareAddr"})
_V4_POD_FIELDS = ("host_index", "pod_index", "identity")
"""MovedDevice fields a version-3 reader does not know (how the NIC is found again): written when set."""

# A NIC's step in its pod's PodNetState (MovedDevice.step), written ahead of the netlink work:
# pending -> moving -> in-pod -> returning -> returned.
PENDING = "pending"
MOVING = "moving"
IN_POD = "in-pod"
RETURNING = "returning"
RETURNED = "returned"


@dataclass(frozen=True)
class GpuPair:
    """The GPU of the same claim a NIC pairs with, and the PCIe path between them (its device
    metadata's ``dra.net/gpu*`` attributes)."""

    device: str  # the GPU's DRA device name
    driver: str
    pci_bus_id: str
    path: str  # PIX, PXB, PHB, NODE, SYS

    def to_dict(self) -> dict[str, str]:
        """Checkpoint form."""
        return {"device": self.device, "driver": self.driver, "pciBusID": self.pci_bus_id, "path": self.path}

    @classmethod
    def from_dict(cls, data: Any) -> GpuPair | None:
        """Inverse of :meth:`to_dict`; None for anything else (never a half-read pair)."""
        if not isinstance(data, dict):
            return None
        device, driver, bus_id, path = (data.get(k) for k in ("device", "driver", "pciBusID", "path"))
        if isinstance(device, str) and isinstance(driver, str) and isinstance(bus_id, str) and isinstance(path, str):
            return cls(device, driver, bus_id, path)
        return None


@dataclass(frozen=True)
class MetadataFacts:
    """What a device's metadata file says that only the ResourceClaim told at prepare: the pod's own
    name for the claim (``resource.kubernetes.io/pod-claim-name``: a template's claim is mounted
    under it) and the claim's GPU this NIC pairs with. Kept so that a lost or damaged file is written
    again byte for byte, with no GET."""

    pod_claim_name: str | None = None
    gpu: GpuPair | None = None

    def to_dict(self) -> dict[str, Any]:
        """Checkpoint form: only what is set (``{}``: known to be neither)."""
        out: dict[str, Any] = {}
        if self.pod_claim_name:
            out["podClaimName"] = self.pod_claim_name
        if self.gpu is not None:
            out["gpu"] = self.gpu.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> MetadataFacts | None:
        """Inverse of :meth:`to_dict`; None when absent or not an object (a record from before)."""
        if not isinstance(data, dict):
            return None
        name = data.get("podClaimName")
        return cls(name if isinstance(name, str) and name else None, GpuPair.from_dict(data.get("gpu")))


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
    # The allocation's shareID on a NIC allocated many times (consumable capacity): the pod gets a
    # sub-interface of the NIC, the NIC itself stays on the host. Written only when set.
    share_id: str | None = None
    # What the allocation consumed of the NIC's capacity (``consumedCapacity``, quantities as the API
    # wrote them), for the metrics of capacity used. Written only when set.
    consumed: dict[str, str] = field(default_factory=dict)
    # The device metadata's prepare-time facts (None: not recorded, metadata off or a record from
    # before: the ResourceClaim is asked again). Here, on the device, because an older driver
    # reads a device's known keys only, where a new key of the claim's would fail its reader.
    metadata: MetadataFacts | None = None
    # A VF the claim holds on vfio-pci (``sriov.driver``): the kernel driver it was bound to at
    # prepare, which it is given back to at unprepare. Written only when set.
    host_driver: str | None = None
    # A VF on vfio-pci whose claim sets its PF's VF settings (``sriov.vlan``, ``sriov.mac``, ...):
    # where they are (``pf``, ``vf``), what the PF reported before (``host``) and what the claim
    # wants (``pod``), as a pod's NIC records them. Written only when set.
    vf_settings: dict[str, Any] | None = None
    # A VF on vfio-pci: the device nodes its container gets (its group's, and of /dev/vfio/vfio and
    # /dev/iommu those the node's kernel has), read at prepare. None: a record from before (the
    # group's and /dev/vfio/vfio). Written only when set.
    vfio_nodes: tuple[str, ...] | None = None

    @property
    def vfio(self) -> bool:
        """Whether the pod gets this VF on vfio-pci (its VFIO group), not its netdev."""
        return self.config.vfio

    @property
    def moves(self) -> bool:
        """Whether a netdev goes into the pod for this device (or a sub-interface of it is made there)."""
        return bool(self.snapshot.host.ifname) and not self.vfio

    @property
    def sub_interface(self) -> bool:
        """Whether the pod gets a sub-interface of this NIC rather than the NIC itself: a share of it,
        or a claim asking for one (``interface.type``)."""
        return self.share_id is not None or bool(self.config.interface and self.config.interface.type)

    @property
    def needed_version(self) -> int:
        """The oldest claims-file version whose readers handle this device right: a VF on vfio-pci (a
        driver before version 7 would look for its netdev and never give it back to its driver), a
        VF's settings (a driver before version 6 would move the VF without them), a sub-interface (a
        driver before version 5 would move the NIC itself into the pod), else see :attr:`needs_v3`."""
        if self.vfio:
            return SCHEMA_VERSION
        if self.config.sriov is not None:
            return SRIOV_VERSION
        if self.sub_interface:
            return RECORDS_VERSION
        return CONFIG_FIELDS_VERSION if self.needs_v3 else COMPATIBLE_VERSION

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
        snapshot = _plain(self.snapshot)
        if snapshot.get("share") is None:  # published capacity is re-derived at every scan
            snapshot.pop("share", None)
        out.update(snapshot=snapshot, config=self.config.to_parameters())
        if self.cloud_config is not None:  # absent in older files; ignored by older drivers
            out["cloudConfig"] = self.cloud_config.to_parameters()
        if self.shared:
            out["shared"] = True
        if self.share_id is not None:
            out["shareID"] = self.share_id
        if self.consumed:
            out["consumedCapacity"] = dict(self.consumed)
        if self.metadata is not None:  # absent in older files; ignored by older drivers
            out["deviceMetadata"] = self.metadata.to_dict()
        if self.host_driver is not None:
            out["hostDriver"] = self.host_driver
        if self.vf_settings is not None:
            out["vfSettings"] = self.vf_settings
        if self.vfio_nodes is not None:
            out["vfioNodes"] = list(self.vfio_nodes)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDevice:
        """Inverse of :meth:`to_dict`."""
        snapshot, config = Device.from_dict(data["snapshot"]), NetworkConfig.from_parameters(data["config"])
        cloud = data.get("cloudConfig")
        cloud_config = None if cloud is None else NetworkConfig.from_parameters(cloud)
        share_id = data.get("shareID")
        consumed = data.get("consumedCapacity")
        return cls(
            data["request"],
            data["pool"],
            data["device"],
            snapshot,
            config,
            cloud_config,
            data.get("shared") is True,
            share_id if isinstance(share_id, str) and share_id else None,
            {str(k): str(v) for k, v in consumed.items()} if isinstance(consumed, dict) else {},
            MetadataFacts.from_dict(data.get("deviceMetadata")),
            data.get("hostDriver") if isinstance(data.get("hostDriver"), str) else None,
            data.get("vfSettings") if isinstance(data.get("vfSettings"), dict) else None,
            _strings(data.get("vfioNodes")),
        )


def _strings(value: Any) -> tuple[str, ...] | None:
    """A list of strings as a tuple; None when it is not one."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


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


@dataclass(frozen=True)
class MovedDevice:
    """Where one NIC of a pod is, and how to give it back exactly as it was.

    ``step`` is written before the corresponding netlink operation so that after
    a crash the driver knows the NIC may already be in the pod namespace. Frozen, like
    :class:`PodNetState`: a change is a new object (``dataclasses.replace``), which is how the
    store tells which pods to encode again.
    """

    device: str
    host_ifname: str
    pod_ifname: str
    permanent_mac: str | None = None
    pci_address: str | None = None
    host_mtu: int | None = None
    host_mac: str | None = None
    pod_mac: str | None = None  # MAC in the pod (configured or host MAC), to find it again
    step: str = PENDING
    # How the NIC is found again wherever it is (driver.netlink.link_identity): its host ifindex, the
    # ifindex the move gives it in the pod, and what a pod cannot forge (``LinkIdentity.to_dict``).
    host_index: int | None = None
    pod_index: int | None = None
    identity: dict[str, Any] | None = None
    # Per NIC setting (driver.nic_settings), under its name: what undoing it needs, as the setting
    # wrote it (the host's values, what it did in the pod). Only settings the claim uses have one.
    # Also what the pod's device metadata file says of the NIC (``deviceMetadata``, written by
    # driver.claims.metadata_document): a reader takes the names it knows and ignores the others,
    # where a new field here would fail an older driver's reader.
    records: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PodNetState:
    """The network namespace of a pod and the NICs moved into it.

    Never changed in place (frozen; ``created`` is replaced, never appended to): the store keeps
    each stored pod's encoded JSON while the same object is stored, so a hook's write encodes only
    the pod it changed.
    """

    pod_uid: str
    sandbox_id: str = ""
    namespace: str = ""
    name: str = ""
    netns_path: str = ""
    devices: list[MovedDevice] = field(default_factory=list)
    # Links the hooks created in the pod (VRFs), each recorded right after its creation as
    # ``{"kind", "index", "name"}``: deleted at return only while the link at that index is still
    # of that kind, so a link the pod made is never deleted.
    created: list[dict[str, Any]] = field(default_factory=list)

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

    def pods_json(self) -> dict[str, Any]:
        """The pod network state part (``pods.json``); fields of newer versions only where set."""
        return {"pods": {k: pod_json(v) for k, v in self.pods.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DriverState:
        """Both parts from one document of the current version (older ones: first
        :func:`~driver.checkpoint.schema.migrate`)."""
        check_version(data)
        return cls(
            claims={k: PreparedClaim.from_dict(v) for k, v in data.get("claims", {}).items()},
            pods={k: PodNetState.from_dict(v) for k, v in data.get("pods", {}).items()},
        )


def claim_device_counts(state: DriverState) -> tuple[int, int]:
    """``(allocated, ready)``: the devices of prepared claims, once per pod each claim is reserved
    for, and how many of them the NRI hook has attached (their NIC is ``in-pod`` for that pod).

    A device without a netdev (RDMA only) or on vfio-pci has nothing to attach: ready once prepared.
    """
    allocated = ready = 0
    for claim in state.claims.values():
        for pod_uid in claim.pod_uids:
            pod = state.pods.get(pod_uid)
            in_pod = {m.device for m in pod.devices if m.step == IN_POD} if pod else set()
            for d in claim.devices:
                allocated += 1
                ready += not d.moves or d.device in in_pod
    return allocated, ready


def share_usage(state: DriverState) -> dict[str, tuple[int, dict[str, int]]]:
    """Per shared NIC (device name): how many prepared claims hold a share of it, and the sum of
    each capacity they consumed (``consumedCapacity``; a quantity that is not a whole number is
    left out)."""
    out: dict[str, tuple[int, dict[str, int]]] = {}
    for claim in state.claims.values():
        for d in claim.devices:
            if d.share_id is None:
                continue
            shares, consumed = out.get(d.device, (0, {}))
            for name, text in d.consumed.items():
                value = quantity_value(text)
                if value is not None:
                    consumed[name] = consumed.get(name, 0) + value
            out[d.device] = (shares + 1, consumed)
    return out


def pod_json(pod: PodNetState) -> dict[str, Any]:
    """One pod's plain form in ``pods.json``: fields of newer versions only where set.

    Field by field rather than :func:`_plain`: ``identity``, ``records`` and ``created`` hold plain
    JSON values already (the encoder copies nothing), and this runs twice per pod start and stop.
    """
    out: dict[str, Any] = {name: getattr(pod, name) for name in _POD_FIELDS}
    if pod.created:
        out["created"] = pod.created
    devices = []
    for m in pod.devices:
        device = {name: getattr(m, name) for name in _MOVED_FIELDS}
        for name in _V4_POD_FIELDS:
            value = getattr(m, name)
            if value is not None:
                device[name] = value
        if m.records:
            device["records"] = m.records
        devices.append(device)
    out["devices"] = devices
    return out


SRIOV_RECORD = "sriov"
"""The record of a VF's settings through its PF (``driver.nic_settings.sriov_vf``'s name)."""
_POD_FIELDS = tuple(f.name for f in fields(PodNetState) if f.name not in ("devices", "created"))
_MOVED_FIELDS = tuple(f.name for f in fields(MovedDevice) if f.name not in (*_V4_POD_FIELDS, "records"))
"""The fields of :class:`PodNetState` and :class:`MovedDevice` always written (the rest only when set)."""


def pod_version(pod: dict[str, Any]) -> int:
    """The version one pod's plain form (:func:`pod_json`) needs: 6 when a NIC carries the record of
    a VF's settings through its PF (``sriov``, which version 5 does not undo), 5 when a NIC carries
    another record (a setting's, or what its device metadata file says: version 4 has no
    ``records``), else 4 when the pod or a NIC carries a field version 3 does not know, else 2."""
    if any(SRIOV_RECORD in d.get("records", ()) for d in pod["devices"]):
        return SRIOV_VERSION
    if any("records" in d for d in pod["devices"]):
        return RECORDS_VERSION
    if "created" in pod or any(set(_V4_POD_FIELDS) & d.keys() for d in pod["devices"]):
        return IDENTITY_VERSION
    return COMPATIBLE_VERSION


def pods_version(body: dict[str, Any]) -> int:
    """The version ``pods.json`` is written as: the newest one of its pods needs (:func:`pod_version`)."""
    return max((pod_version(p) for p in body["pods"].values()), default=COMPATIBLE_VERSION)


def _plain(obj: Any) -> Any:
    """JSON-able copy of dataclasses/lists/dicts; same result as ``asdict`` but ~3x faster.

    The whole state is serialised on every prepare, so this is on the NodePrepareResources
    path (``asdict`` deep-copies every leaf; its cost: docs/performance.md, "Small costs the code's
    choices rest on").
    """
    if hasattr(obj, "__dataclass_fields__"):
        return {name: _plain(getattr(obj, name)) for name in obj.__dataclass_fields__}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj
