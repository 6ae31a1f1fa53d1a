"""Building a device's published attributes within the DRA API limits.

Two limits make the apiserver reject a whole ResourceSlice (Go driver bugs #198/#300/#313):
a string value longer than 64 bytes and more than 32 attributes on one device. :func:`finalize`
enforces both so no device can ever make its slice invalid:

- strings longer than 64 bytes are shortened: comma-joined lists (``ipv4``, ``ipv6``) are cut at an
  element boundary so every remaining CIDR is whole; other strings are cut at a UTF-8 character
  boundary;
- an integer outside the int64 range (a corrupt ``numa_node`` or port rate) is dropped with a
  warning;
- past 32 attributes, the lowest-priority ones are dropped. Priority is the order of
  :data:`PRIORITY` (first = most important): identity and topology first, then the cloud
  providers' topology attributes (what multi-node claims select on: placement groups, blocks,
  islands, EFA device groups), then descriptive netdev and PCI attributes. Attributes not listed
  rank after all listed ones, in sorted name order, so the choice is deterministic.
"""

from __future__ import annotations

import logging
import sys

from driver.model.device import (
    ATTRIBUTE_DOMAIN,
    INT64_MAX,
    INT64_MIN,
    MAX_ATTRIBUTE_VALUE_LENGTH,
    MAX_ATTRIBUTES_PER_DEVICE,
    STANDARD_DOMAIN,
    AttributeValue,
)

log = logging.getLogger(__name__)

D = ATTRIBUTE_DOMAIN + "/"  # our attributes' domain: dra.net, whatever --driver-name is
S = STANDARD_DOMAIN + "/"

CLOUD_PRIORITY: tuple[str, ...] = (
    "azure.dra.net/placementGroupId",
    "azure.dra.net/interconnectGroupId",
    "azure.dra.net/interconnectSubgroupId",
    "azure.dra.net/vmSize",
    "azure.dra.net/subnet",
    "gce.dra.net/block",
    "gce.dra.net/subBlock",
    "gce.dra.net/host",
    "gce.dra.net/machineType",
    "gce.dra.net/networkName",
    "gce.dra.net/networkProjectNumber",
    "gce.dra.net/ipAliases",
    "oke.dra.net/hpcIslandId",
    "oke.dra.net/networkBlockId",
    "oke.dra.net/localBlockId",
    "oke.dra.net/rackId",
    "oke.dra.net/gpuMemoryFabricId",
    "alibaba.dra.net/instanceType",
    "alibaba.dra.net/erdma",
    "resource.aws.com/devicegroup1_id",
    "resource.aws.com/devicegroup4_id",
    "resource.aws.com/devicegroup8_id",
    "resource.aws.com/devicegroup16_id",
)
"""Cloud provider attributes (driver.inventory.cloud), in keep-order; at most 7 apply to one device."""

PRIORITY: tuple[str, ...] = (
    # Identity and what claims select on most (the training example's templates: rdma, numaNode, pciBusID).
    D + "rdma",
    D + "numaNode",
    S + "numaNode",
    S + "pciBusID",
    S + "pcieRoot",
    D + "pciAddress",
    D + "dataDirectPciAddress",
    D + "rdmaDevice",
    D + "ifName",
    D + "linkLayer",
    D + "type",
    D + "virtual",
    D + "isSriovVf",
    D + "sriov",
    D + "sriovVfs",
    D + "pfPciAddress",
    D + "vfIndex",
    D + "pfName",
    D + "pfDeviceID",
    D + "iommuGroup",
    D + "vfioUnsafe",
    D + "pciDriver",
    D + "rateGbps",
    *CLOUD_PRIORITY,
    D + "mac",
    D + "mtu",
    D + "state",
    D + "encapsulation",
    D + "pciVendor",
    D + "pciDevice",
    D + "pciSubsystem",
    D + "ipv4",
    D + "ipv6",
    D + "ebpf",
    D + "tcFilterNames",
    D + "tcxProgramNames",
    D + "alias",
    D + "vfioUnsafeReason",
)
"""Attribute keep-order when a device has more than 32 attributes (first = kept longest)."""

LIST_ATTRIBUTES = frozenset(
    {D + "ipv4", D + "ipv6", D + "tcFilterNames", D + "tcxProgramNames", "gce.dra.net/ipAliases"}
)
"""Comma-joined list attributes: shortened at an element boundary."""

_RANK = {name: i for i, name in enumerate(PRIORITY)}


def attribute_rank(name: str) -> int:
    """``name``'s keep-rank when a device has too many attributes (lower is kept longer)."""
    return _RANK.get(name, len(PRIORITY))


def shorten(name: str, value: str, limit: int = MAX_ATTRIBUTE_VALUE_LENGTH) -> str:
    """``value`` cut to at most ``limit`` UTF-8 bytes (the apiserver counts bytes), safely."""
    # isascii() is O(1) in CPython: the common short ASCII value skips the encode.
    if len(value) <= limit and (value.isascii() or len(value.encode()) <= limit):
        return value
    if name in LIST_ATTRIBUTES:
        kept: list[str] = []
        size = 0
        for item in value.split(","):
            extra = len(item.encode()) + (1 if kept else 0)
            if size + extra > limit:
                break
            kept.append(item)
            size += extra
        return ",".join(kept)
    return value.encode()[:limit].decode("utf-8", "ignore")


def _past_int64(value: AttributeValue) -> bool:
    """An integer (or a list holding one) the API server would refuse: outside the int64 range."""
    ints = value if isinstance(value, list) else [value]
    return any(isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX for v in ints)


def finalize(attributes: dict[str, AttributeValue], device: str = "") -> dict[str, AttributeValue]:
    """The attributes shortened and capped so the device is always valid in a slice."""
    out: dict[str, AttributeValue] = {}
    out_of_range: list[str] = []
    for name, value in attributes.items():
        # Non-empty short ASCII strings (nearly all values) fit as they are: skip shorten().
        # Empty ones take the slow path, which omits an empty list attribute.
        if isinstance(value, str) and not (value and len(value) <= MAX_ATTRIBUTE_VALUE_LENGTH and value.isascii()):
            short = shorten(name, value)
            if short != value:
                log.debug(
                    "attribute value shortened",
                    extra={"kv": {"device": device, "attribute": name, "length": len(value.encode())}},
                )
            if name in LIST_ATTRIBUTES and not short:
                continue  # not even one element fits: omit rather than publish an empty list
            value = short
        elif _past_int64(value):
            out_of_range.append(name)
            continue
        # Interned: every device carries the same few names (built per device by concatenation),
        # a node of 10k devices keeps each once.
        out[sys.intern(name)] = value
    if out_of_range:
        log.warning(
            "integer attributes out of the int64 range (a corrupt sysfs value), not published",
            extra={"kv": {"device": device, "attributes": out_of_range}},
        )
    return capped(out, MAX_ATTRIBUTES_PER_DEVICE, device)


def capped(attributes: dict[str, AttributeValue], limit: int, device: str = "") -> dict[str, AttributeValue]:
    """At most ``limit`` of ``attributes``: the lowest-priority ones dropped (and logged)."""
    if len(attributes) <= limit:
        return attributes
    out = dict(attributes)
    ranked = sorted(out, key=lambda n: (attribute_rank(n), n))
    dropped = ranked[limit:]
    log.warning(
        "too many attributes, dropping lowest-priority ones", extra={"kv": {"device": device, "dropped": dropped}}
    )
    for name in dropped:
        del out[name]
    return out
