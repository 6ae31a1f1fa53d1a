"""Data models shared by discovery, slices, the kubelet plugin and the NRI hooks.

A :class:`Device` is one allocatable thing this driver publishes: a PCI network
function (with or without a netdev), an RDMA device without a network PCI class,
or a virtual netdev. It carries the attributes exactly as they go into a
``resource.k8s.io/v1`` ResourceSlice plus the host facts (:class:`HostFacts`)
the driver needs later to prepare and move it, which are never published.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from driver.config import DRIVER_NAME

ATTRIBUTE_DOMAIN = DRIVER_NAME
"""The domain of this driver's own attributes (``dra.net/rdma``). Fixed: it does not follow
``--driver-name``, because DeviceClasses, claims, the default filter and the examples all select
``device.attributes["dra.net"]``; renaming a driver instance must not silently break them."""
RDMA_ATTRIBUTE = f"{ATTRIBUTE_DOMAIN}/rdma"
BANDWIDTH_CAPACITY = f"{ATTRIBUTE_DOMAIN}/bandwidth"
"""A shared NIC's bandwidth in bits per second, consumed by each allocation (``capacity.requests``)."""
INTERFACES_CAPACITY = f"{ATTRIBUTE_DOMAIN}/interfaces"
"""How many sub-interfaces a shared NIC carries; each allocation takes one."""
STANDARD_DOMAIN = "resource.kubernetes.io"
MAX_ATTRIBUTES_PER_DEVICE = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of an ``int`` device attribute: the API server refuses a slice with any other."""

AttributeValue = bool | int | str | list[int]
"""A DRA device attribute value: one of bool, int or string, or a list of ints (the list form of
``resource.kubernetes.io/numaNode``, KEP-5491's ``ints``; only with ``--feature-gates
DRAListTypeAttributes=true``). No versions here."""


def attribute_to_api(value: AttributeValue) -> dict[str, Any]:
    """Encode a Python value as a v1 ``DeviceAttribute`` (``{"bool": ...}``, ``{"ints": [...]}`` etc.)."""
    # bool first: bool is a subclass of int.
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, list):
        return {"ints": list(value)}
    return {"string": value}


def attribute_from_api(encoded: dict[str, Any]) -> AttributeValue:
    """Decode a v1 ``DeviceAttribute`` back into a Python value (a list for ``ints``)."""
    for key in ("bool", "int", "string", "version", "ints"):
        if key in encoded:
            value: AttributeValue = encoded[key]
            return value
    raise ValueError(f"device attribute has no value field: {encoded!r}")


def first_int(value: AttributeValue | None) -> int | None:
    """An int attribute, or the first element of an int list (the list form's physical node)."""
    if isinstance(value, list):
        return value[0] if value and isinstance(value[0], int) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def rdma_count(devices: list[Device]) -> int:
    """How many of ``devices`` are RDMA devices (``published_devices_total{feature="rdma"}``)."""
    return sum(1 for d in devices if d.attributes.get(RDMA_ATTRIBUTE) is True)


@dataclass(frozen=True, slots=True)
class CharDevice:
    """A character device node a container needs (e.g. ``/dev/infiniband/uverbs0``)."""

    path: str
    major: int
    minor: int
    type: str = "c"


@dataclass(slots=True)
class HostFacts:
    """Host-side facts about a device, used by prepare and the NRI hooks; never published."""

    pci_address: str | None = None
    ifname: str | None = None
    permanent_mac: str | None = None
    rdma_device: str | None = None
    char_devices: list[CharDevice] = field(default_factory=list)
    numa_node: int | None = None
    sriov_pf: str | None = None  # PCI address of the PF when this is a VF
    virtual: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFacts:
        """Inverse of ``asdict`` (the checkpoint's device snapshots)."""
        return cls(**{**data, "char_devices": [CharDevice(**c) for c in data.get("char_devices", [])]})


SI_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def quantity(value: int) -> str:
    """A non-negative integer as the canonical Kubernetes quantity the apiserver stores (``100G``,
    ``1500M``): what it returns must equal what was written, or every publish would rewrite the slice."""
    exponent = 0
    while value and value % 1000 == 0 and exponent < len(SI_SUFFIXES) - 1:
        value //= 1000
        exponent += 1
    return f"{value}{SI_SUFFIXES[exponent]}"


_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_value(text: str) -> int | None:
    """A Kubernetes quantity that is a whole number (``40G``, ``16``, ``1Gi``, ``1e9``) as an int;
    None for anything else (a fraction, ``500m``, a malformed value)."""
    text = text.strip()
    for suffix, factor in _BINARY_SUFFIXES.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    for exponent, suffix in enumerate(SI_SUFFIXES[1:], start=1):
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * 1000**exponent
    mantissa, e, power = text.partition("e") if "e" in text else text.partition("E")
    if mantissa.isdigit() and (not e or power.isdigit()):
        return int(mantissa) * 10 ** int(power or 0)
    return None


@dataclass(frozen=True)
class ShareCapacity:
    """What a shared NIC offers the scheduler (``allowMultipleAllocations`` and consumable capacity).

    ``bandwidth``: its link rate in bits per second (0: unknown, then not offered); a claim asks for
    a share of it in ``step`` units from ``step`` up (a claim that asks nothing takes it all, so
    claims written for whole NICs never land on a partly used one). ``interfaces``: how many
    sub-interfaces it carries, one per allocation.
    """

    bandwidth: int
    step: int
    interfaces: int

    def to_api(self) -> dict[str, Any]:
        """The device's ``capacity`` map (v1), keys qualified by the driver's attribute domain."""
        out: dict[str, Any] = {
            INTERFACES_CAPACITY: {
                "value": quantity(self.interfaces),
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}},
            }
        }
        if self.bandwidth > 0:
            whole, step = quantity(self.bandwidth), quantity(self.step)
            policy = {"default": whole, "validRange": {"min": step, "max": whole, "step": step}}
            out[BANDWIDTH_CAPACITY] = {"value": whole, "requestPolicy": policy}
        return out


@dataclass(slots=True)
class Device:
    """One published device: its DNS-label name, qualified attributes and host facts.

    ``attributes`` keys are fully qualified (``dra.net/rdma``,
    ``resource.kubernetes.io/pciBusID``); :meth:`to_api` turns them into the
    v1 ``spec.devices[]`` entry. ``share``: set on a NIC the admin shares (``--sharing-filter``).
    """

    name: str
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    host: HostFacts = field(default_factory=HostFacts)
    share: ShareCapacity | None = None
    # What an allocation of it takes from the pool's shared counters: counter set -> counter -> amount
    # (an SR-IOV PF and its VFs, driver.inventory.partitions).
    counters: dict[str, dict[str, int]] | None = None

    def to_api(self) -> dict[str, Any]:
        """The device as it appears in a ResourceSlice's ``spec.devices`` (v1 JSON)."""
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: attribute_to_api(v) for k, v in sorted(self.attributes.items())},
        }
        if self.share is not None:
            out["allowMultipleAllocations"] = True
            out["capacity"] = self.share.to_api()
        if self.counters:
            out["consumesCounters"] = [
                {"counterSet": name, "counters": {c: {"value": str(n)} for c, n in sorted(counters.items())}}
                for name, counters in sorted(self.counters.items())
            ]
        return out

    def to_dict(self) -> dict[str, Any]:
        """Full serialisation (attributes and host facts), for checkpoints."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Device:
        share = data.get("share")
        return cls(
            name=data["name"],
            attributes=dict(data.get("attributes", {})),
            host=HostFacts.from_dict(data.get("host", {})),
            share=ShareCapacity(**share) if share else None,
        )
