"""The typed claim configuration: what a ``dra.net`` opaque config asks of one NIC.

These are the objects every layer passes around once a config is decoded: prepare builds them
(:func:`driver.api.v1alpha1.decode.decode_config`, strict, naming every wrong field), the checkpoint
stores their canonical JSON form (:meth:`NetworkConfig.to_parameters`) and reads it back with
:meth:`NetworkConfig.from_parameters`, the NRI hooks read their fields. Every field is optional
and ``None`` means "not set", so configs merge field by field (:meth:`NetworkConfig.merged`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from driver.config import DRIVER_NAME

API_VERSION = f"{DRIVER_NAME}/v1alpha1"
"""The only schema version this driver understands (``apiVersion`` is optional; see docs)."""
KIND = "NetworkConfig"
RDMA_INJECT_ENV_DEFAULT = True
"""``rdma.injectEnv`` when no config sets it: RDMA NICs' environment goes into the containers."""
VFIO_PCI = "vfio-pci"
"""``sriov.driver`` that binds a VF to vfio-pci for the claim (the only driver a claim may ask for)."""
NUMA_PIN_DEFAULT = False
"""``numa.pin`` when no config sets it: containers are not pinned to the NICs' NUMA node."""


@dataclass(frozen=True)
class InterfaceConfig:
    """How the NIC looks inside the pod."""

    name: str | None = None  # interface name in the pod; default: the host name
    addresses: tuple[str, ...] | None = None  # CIDRs ("192.0.2.5/24"); default: keep the host's
    dhcp: bool | None = None  # configure the NIC by DHCP (never together with addresses)
    mtu: int | None = None
    hardware_addr: str | None = None  # JSON "hardwareAddr"
    # Segmentation/receive offload size limits (``ip link set gso_max_size ...``, BIG TCP).
    gso_max_size: int | None = None  # JSON "gsoMaxSize" (IPv6 and the default)
    gro_max_size: int | None = None  # JSON "groMaxSize"
    gso_ipv4_max_size: int | None = None  # JSON "gsoIPv4MaxSize"
    gro_ipv4_max_size: int | None = None  # JSON "groIPv4MaxSize"
    disable_ebpf_programs: bool | None = None  # JSON "disableEbpfPrograms": detach XDP/TC/tcx programs
    # Per-interface sysctls in the pod (``net.ipv{4,6}.conf.<if>.*``).
    forwarding: bool | None = None  # ipv4 and ipv6 forwarding of this interface
    arp_ignore: int | None = None  # JSON "arpIgnore": 0-3 or 8
    arp_announce: int | None = None  # JSON "arpAnnounce": 0-2
    vrf: VrfConfig | None = None  # enslave the NIC to a VRF device in the pod
    # A sub-interface of the NIC in the pod instead of the NIC (dranet's ``type: IPVLAN``):
    # ``macvlan`` or ``ipvlan`` (SUB_INTERFACE_TYPES); a share of a shared NIC is one in any case.
    type: str | None = None

    @property
    def sysctls_set(self) -> bool:
        """Whether any per-interface sysctl is configured (forwarding, arpIgnore, arpAnnounce)."""
        return self.forwarding is not None or self.arp_ignore is not None or self.arp_announce is not None

    @property
    def offload_sizes(self) -> dict[str, int]:
        """The configured GSO/GRO size limits by JSON name (empty: nothing to set)."""
        pairs = (
            ("gsoMaxSize", self.gso_max_size),
            ("groMaxSize", self.gro_max_size),
            ("gsoIPv4MaxSize", self.gso_ipv4_max_size),
            ("groIPv4MaxSize", self.gro_ipv4_max_size),
        )
        return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class VrfConfig:
    """A VRF device in the pod that the NIC is enslaved to (dranet's ``VRFConfig``).

    NICs of one pod naming the same VRF share it. The claim's routes go into ``table``.
    """

    name: str | None = None  # the VRF device's name in the pod (required by the decoder)
    table: int | None = None  # its routing table; default: 100 + the NIC's index in the pod


@dataclass(frozen=True)
class RouteConfig:
    """One route added in the pod namespace through this NIC."""

    destination: str
    gateway: str | None = None
    source: str | None = None
    scope: int = 0  # 0 universe, 253 link
    table: int = 0  # 0 = main


@dataclass(frozen=True)
class RuleConfig:
    """One policy-routing rule (``ip rule``) added in the pod, dranet's ``RuleConfig``.

    From claims and from cloud providers (Azure: ``from <subnet> lookup 100+i`` per NIC,
    :mod:`driver.inventory.cloud.azure`). ``table`` ``None``/0 is the main table.
    """

    priority: int | None = None
    source: str | None = None  # CIDR
    destination: str | None = None  # CIDR
    table: int | None = None


@dataclass(frozen=True)
class NeighborConfig:
    """One permanent neighbor (ARP/NDP) entry on the NIC in the pod, dranet's ``NeighborConfig``."""

    destination: str  # an IP address
    hardware_addr: str  # JSON "hardwareAddr": the neighbor's link-layer address (6, 8 or 20 octets)


@dataclass(frozen=True)
class EthtoolConfig:
    """Offload features and private flags, set by name (checked against the NIC at prepare)."""

    features: dict[str, bool] | None = None
    private_flags: dict[str, bool] | None = None  # JSON "privateFlags"

    @property
    def empty(self) -> bool:
        """Nothing to set: no netlink call is needed for this NIC."""
        return not (self.features or self.private_flags)


@dataclass(frozen=True)
class RdmaConfig:
    """RDMA environment injection into the consuming containers."""

    inject_env: bool | None = None  # JSON "injectEnv"; default True for RDMA NICs


@dataclass(frozen=True)
class NumaConfig:
    """Opt-in NUMA pinning of the consuming containers."""

    pin: bool | None = None  # default False: cpuset.cpus and cpuset.mems of the NICs' NUMA node


@dataclass(frozen=True)
class SriovConfig:
    """An SR-IOV VF's settings that its PF holds (as the SR-IOV CNI sets them): applied through the PF
    while the VF is in the pod, put back as they were when it comes home. None: left as it is."""

    vlan: int | None = None  # 0-4094; 0: untagged
    vlan_qos: int | None = None  # JSON "vlanQoS": 0-7, the 802.1p priority of the VF's VLAN
    vlan_proto: str | None = None  # JSON "vlanProto": "802.1Q" (default) or "802.1ad"
    spoof_chk: bool | None = None  # JSON "spoofChk": the PF drops frames whose source MAC is not the VF's
    trust: bool | None = None  # the VF may change its MAC, go promiscuous, join more multicast groups
    min_tx_rate: int | None = None  # JSON "minTxRate": Mbit/s guaranteed; 0: none
    max_tx_rate: int | None = None  # JSON "maxTxRate": Mbit/s at most; 0: no limit
    link_state: str | None = None  # JSON "linkState": "auto" (the PF's), "enable" or "disable"
    # The VF's MAC as its PF gives it (the PF's filter and spoof check admit it, the VF cannot change
    # it unless trusted); the netdev carries it in the pod. Lower case.
    mac: str | None = None
    # The kernel driver the VF is bound to while the claim holds it: "vfio-pci" hands the VF itself
    # to the pod (DPDK, KubeVirt) through its VFIO group instead of moving its netdev. None: its own.
    driver: str | None = None

    @property
    def vfio(self) -> bool:
        """Whether the VF goes to the pod on vfio-pci (no netdev moves)."""
        return self.driver == VFIO_PCI


@dataclass(frozen=True)
class NetworkConfig:
    """The whole ``opaque.parameters`` object for ``dra.net``."""

    interface: InterfaceConfig | None = None
    routes: tuple[RouteConfig, ...] | None = None
    rules: tuple[RuleConfig, ...] | None = None
    neighbors: tuple[NeighborConfig, ...] | None = None
    ethtool: EthtoolConfig | None = None
    profile: str | None = None  # a named profile from the profile provider (``--profile-provider``)
    rdma: RdmaConfig | None = None
    numa: NumaConfig | None = None
    sriov: SriovConfig | None = None

    @property
    def rdma_env_enabled(self) -> bool:
        """Whether NCCL_IB_HCA / DRANET_RDMA_DEVICES are injected (on unless turned off)."""
        if self.rdma is None or self.rdma.inject_env is None:
            return RDMA_INJECT_ENV_DEFAULT
        return self.rdma.inject_env

    @property
    def pod_mac(self) -> str | None:
        """The MAC the NIC's netdev gets in the pod: ``interface.hardwareAddr``, else ``sriov.mac``
        (the two cannot differ: the decoder refuses it)."""
        if self.interface is not None and self.interface.hardware_addr:
            return self.interface.hardware_addr
        return self.sriov.mac if self.sriov is not None else None

    @property
    def vfio(self) -> bool:
        """Whether the NIC is a VF handed to the pod on vfio-pci (``sriov.driver: vfio-pci``)."""
        return self.sriov is not None and self.sriov.vfio

    @property
    def numa_pin(self) -> bool:
        """Whether containers are pinned to the NICs' NUMA node (off unless turned on)."""
        if self.numa is None or self.numa.pin is None:
            return NUMA_PIN_DEFAULT
        return self.numa.pin

    def merged(self, override: NetworkConfig) -> NetworkConfig:
        """``override`` on top of this config, field by field.

        Scalars and lists (``addresses``, ``routes``) set in ``override`` replace these;
        maps (``ethtool.features``, ``ethtool.privateFlags``) merge key by key.
        """
        result: NetworkConfig = _merge(self, override)
        return result

    def to_parameters(self) -> dict[str, Any]:
        """The canonical JSON form; ``decode_config(c.to_parameters(), p) == c``."""
        out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
        out.update(_to_json(self))
        return out

    @classmethod
    def from_parameters(cls, params: dict[str, Any]) -> NetworkConfig:
        """Read back what :meth:`to_parameters` wrote (the checkpoint's form); no validation.

        Only for JSON this driver wrote itself after :func:`~driver.api.v1alpha1.decode.decode_config`
        accepted it; a wrong shape raises ``KeyError``/``TypeError``/``AttributeError``.
        """
        iface, eth, rdma, numa = (params.get(k) for k in ("interface", "ethtool", "rdma", "numa"))
        sriov = params.get("sriov")
        routes, rules, neighbors = params.get("routes"), params.get("rules"), params.get("neighbors")
        return cls(
            interface=None if iface is None else _interface_from_json(iface),
            routes=None if routes is None else tuple(RouteConfig(**r) for r in routes),
            rules=None if rules is None else tuple(RuleConfig(**r) for r in rules),
            neighbors=None
            if neighbors is None
            else tuple(NeighborConfig(n["destination"], n["hardwareAddr"]) for n in neighbors),
            profile=params.get("profile"),
            ethtool=None
            if eth is None
            else EthtoolConfig(features=eth.get("features"), private_flags=eth.get("privateFlags")),
            rdma=None if rdma is None else RdmaConfig(inject_env=rdma.get("injectEnv")),
            numa=None if numa is None else NumaConfig(pin=numa.get("pin")),
            sriov=None if sriov is None else SriovConfig(**{_PY_NAMES.get(k, k): v for k, v in sriov.items()}),
        )


_JSON_NAMES = {
    "hardware_addr": "hardwareAddr",
    "private_flags": "privateFlags",
    "inject_env": "injectEnv",
    "gso_max_size": "gsoMaxSize",
    "gro_max_size": "groMaxSize",
    "gso_ipv4_max_size": "gsoIPv4MaxSize",
    "gro_ipv4_max_size": "groIPv4MaxSize",
    "disable_ebpf_programs": "disableEbpfPrograms",
    "arp_ignore": "arpIgnore",
    "arp_announce": "arpAnnounce",
    "vlan_qos": "vlanQoS",
    "vlan_proto": "vlanProto",
    "spoof_chk": "spoofChk",
    "min_tx_rate": "minTxRate",
    "max_tx_rate": "maxTxRate",
    "link_state": "linkState",
}
_PY_NAMES = {v: k for k, v in _JSON_NAMES.items()}


def json_name(field_name: str) -> str:
    """The JSON name of a config dataclass field (``hardware_addr`` -> ``hardwareAddr``)."""
    return _JSON_NAMES.get(field_name, field_name)


def _interface_from_json(iface: dict[str, Any]) -> InterfaceConfig:
    """An ``interface`` object of the canonical form (every key an :class:`InterfaceConfig` field)."""
    values = {_PY_NAMES.get(k, k): v for k, v in iface.items()}
    if values.get("addresses") is not None:
        values["addresses"] = tuple(values["addresses"])
    if values.get("vrf") is not None:
        values["vrf"] = VrfConfig(**values["vrf"])
    return InterfaceConfig(**values)


def _to_json(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return [_to_json(o) for o in obj]
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return {
            json_name(f.name): _to_json(getattr(obj, f.name)) for f in fields(obj) if getattr(obj, f.name) is not None
        }
    return obj


def _merge(base: Any, over: Any) -> Any:
    if over is None:
        return base
    if base is None:
        return over
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **over}
    if hasattr(base, "__dataclass_fields__") and type(base) is type(over):
        return replace(base, **{f.name: _merge(getattr(base, f.name), getattr(over, f.name)) for f in fields(base)})
    return over
