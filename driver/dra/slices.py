"""ResourceSlice bodies for one node's pool, and the plan to bring the API in line with them.

One pool per node, named after the node (like the Go reference driver). Devices are sorted by
name and split into chunks of at most 128 (``ResourceSliceMaxDevices``), so the same device set
always gives the same slices. The pool generation is bumped on any change; because the
scheduler ignores slices older than the newest generation of a pool, a bump rewrites every
slice of the pool, while an unchanged pool costs no write at all.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from driver.dra.protocol import SliceDevice

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
"""``ResourceSliceMaxDevices``: the apiserver refuses a slice listing more devices."""
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
"""``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters``: the limit of a slice in which a device
has a taint or consumes counters."""
MAX_COUNTER_SETS_PER_SLICE = 8
"""``ResourceSliceMaxCounterSets``."""


Taints = Mapping[str, list[dict[str, Any]]]
"""device name -> its ``taints`` (:mod:`driver.dra.taints`); devices not named have none."""
CounterSets = Sequence[Mapping[str, Any]]
"""The pool's shared counters (KEP-4815, partitionable devices): v1 ``CounterSet`` entries
(``name``, ``counters``) that devices' ``consumesCounters`` draw from. They are published in slices
of their own: a slice lists devices or counter sets, never both."""
Content = dict[str, list[dict[str, Any]]]
"""What one slice holds: ``{"devices": [...]}`` or ``{"sharedCounters": [...]}``."""


def _chunks(
    devices: Iterable[SliceDevice], size: int, taints: Taints | None = None, counter_sets: CounterSets = ()
) -> list[Content]:
    ordered = sorted(devices, key=lambda d: d.name)
    names = [d.name for d in ordered]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate device names in pool: {dup}")
    taints = taints or {}
    sets = sorted((dict(c) for c in counter_sets), key=lambda c: c["name"])
    known = {c["name"] for c in sets}
    seen: dict[tuple[str, Any], dict[str, Any]] = {}
    api = [
        _drawing_from(_share_equal_values(d.to_api(), seen), known)
        | ({"taints": taints[d.name]} if taints.get(d.name) else {})
        for d in ordered
    ]
    if any("taints" in d or "consumesCounters" in d for d in api):
        size = min(size, MAX_DEVICES_WITH_TAINTS_OR_COUNTERS)
    out: list[Content] = [{"devices": api[i : i + size]} for i in range(0, len(api), size)]
    step = MAX_COUNTER_SETS_PER_SLICE
    out += [{"sharedCounters": sets[i : i + step]} for i in range(0, len(sets), step)]
    # An empty pool still gets one (empty) slice: "empty pool is different from no pool".
    return out or [{"devices": []}]


def _drawing_from(device: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """``device`` consuming only from counter sets the pool publishes: none when the apiserver cannot
    store counters (the driver then passes no sets), and never a set another slice does not hold."""
    consumes = device.get("consumesCounters")
    if consumes is None:
        return device
    kept_ = [c for c in consumes if c.get("counterSet") in known]
    if kept_:
        device["consumesCounters"] = kept_
    else:
        del device["consumesCounters"]
    return device


def _share_equal_values(device: dict[str, Any], seen: dict[tuple[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """``device`` with each attribute value equal to one in ``seen`` replaced by that one object.

    Most devices of a node carry the same vendor, NUMA node, link state and flags: a pool of
    thousands of devices, held whole while it is compared and written, would otherwise hold one
    small dict per attribute per device.
    """
    attributes = device.get("attributes") or {}
    for name, value in attributes.items():
        if len(value) == 1:
            ((kind, inner),) = value.items()
            if not isinstance(inner, list):  # the ints of a list attribute: rare, and not hashable
                attributes[name] = seen.setdefault((kind, inner), value)
    return device


def owner_reference(node_name: str, node_uid: str) -> dict[str, Any]:
    """Controller owner reference to the Node, so the garbage collector removes our slices with it."""
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}


def build_slices(
    devices: Sequence[SliceDevice],
    driver_name: str,
    node_name: str,
    node_uid: str,
    generation: int = 1,
    max_devices: int = MAX_DEVICES_PER_SLICE,
    taints: Taints | None = None,
    counter_sets: CounterSets = (),
) -> list[dict[str, Any]]:
    """resource.k8s.io/v1 ResourceSlice bodies (no names yet: ``generateName``) for the node's pool."""
    chunks = _chunks(devices, max_devices, taints, counter_sets)
    return _bodies(chunks, driver_name, node_name, node_uid, generation)


def _bodies(
    chunks: list[Content], driver_name: str, node_name: str, node_uid: str, generation: int
) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{node_name}-{driver_name}-",
                "ownerReferences": [owner_reference(node_name, node_uid)],
            },
            "spec": {
                "driver": driver_name,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
                **chunk,
            },
        }
        for chunk in chunks
    ]


@dataclass
class SlicePlan:
    """Writes needed to go from the existing slices to the desired ones.

    Apply in order: ``update`` (full objects carrying the existing name and resourceVersion, so a
    concurrent change gives 409), ``create``, then ``delete`` (obsolete slices): the new generation
    is complete before any slice of the old one goes.
    """

    generation: int
    delete: list[dict[str, Any]] = field(default_factory=list)
    update: list[dict[str, Any]] = field(default_factory=list)
    create: list[dict[str, Any]] = field(default_factory=list)

    @property
    def writes(self) -> int:
        """Number of API write calls the plan takes."""
        return len(self.delete) + len(self.update) + len(self.create)

    @property
    def empty(self) -> bool:
        return self.writes == 0


class KeptSlice(dict[str, Any]):
    """A slice as the publisher keeps it between syncs (:func:`kept`): its metadata and spec without
    the devices (or counter sets), whose digest stands in for them (a plan compares them by digest only)."""

    devices_digest: bytes = b""


def kept(obj: dict[str, Any]) -> KeptSlice:
    """``obj`` (a slice as the API returned it) without its devices and ``managedFields`` (an update
    drops them): a node's pool of 10k devices is ~30 MiB of decoded JSON, its digests a few KiB."""
    spec = dict(obj.get("spec") or {})
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    out = KeptSlice(obj, metadata=meta, spec=spec)
    out.devices_digest = _digest_of(_content(spec))
    spec.pop("devices", None)
    spec.pop("sharedCounters", None)
    return out


def _content(spec: dict[str, Any]) -> Content:
    """What a slice's spec holds, as :func:`_chunks` makes it (an empty device list may come back absent)."""
    counters = spec.get("sharedCounters")
    return {"sharedCounters": counters} if counters else {"devices": spec.get("devices") or []}


def _devices_key(s: dict[str, Any]) -> bytes:
    """The digest of a slice's devices or counter sets (kept, or computed from the spec)."""
    if isinstance(s, KeptSlice):
        return s.devices_digest
    return _digest_of(_content(s.get("spec", {})))


def _digest_of(content: Content) -> bytes:
    # Canonical JSON of the slice's content: the API returns what we sent, key order aside.
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _is_current(s: dict[str, Any], generation: int, count: int, owner: dict[str, Any]) -> bool:
    pool = s.get("spec", {}).get("pool", {})
    owners = s.get("metadata", {}).get("ownerReferences") or []
    return (
        pool.get("generation") == generation
        and pool.get("resourceSliceCount") == count
        and any(_same_owner(o, owner) for o in owners)
    )


def _same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("apiVersion", "kind", "name", "uid")) and bool(a.get("controller"))


def plan_slices(
    devices: Sequence[SliceDevice],
    existing: list[dict[str, Any]],
    driver_name: str,
    node_name: str,
    node_uid: str,
    max_devices: int = MAX_DEVICES_PER_SLICE,
    taints: Taints | None = None,
    counter_sets: CounterSets = (),
) -> SlicePlan:
    """Decide which of ``existing`` (our driver's slices for this node) to delete, update, create.

    Unchanged pool (same device chunks, one generation, right count and owner): empty plan.
    Otherwise the generation becomes max(existing) + 1, slices whose devices already match a
    desired chunk are reused for it, the rest are paired in name order, extras are deleted.
    """
    ours = [s for s in existing if s.get("spec", {}).get("pool", {}).get("name") == node_name]
    foreign = [s for s in existing if s.get("spec", {}).get("pool", {}).get("name") != node_name]  # obsolete
    current_gen = max((s["spec"]["pool"].get("generation", 0) for s in ours), default=0)
    owner = owner_reference(node_name, node_uid)
    chunks = _chunks(devices, max_devices, taints, counter_sets)
    wanted_keys = [_digest_of(c) for c in chunks]
    have_keys = [_devices_key(s) for s in ours]
    if (
        not foreign
        and Counter(wanted_keys) == Counter(have_keys)
        and len(ours) == len(chunks)
        and all(_is_current(s, current_gen, len(chunks), owner) for s in ours)
    ):
        return SlicePlan(generation=current_gen)

    generation = current_gen + 1
    bodies = _bodies(chunks, driver_name, node_name, node_uid, generation)
    plan = SlicePlan(generation=generation, delete=list(foreign))
    free = sorted(zip(ours, have_keys, strict=True), key=lambda pair: pair[0]["metadata"]["name"])
    unpaired: list[dict[str, Any]] = []
    for body, key in zip(bodies, wanted_keys, strict=True):
        match = next((i for i, (_, have) in enumerate(free) if have == key), None)
        if match is None:
            unpaired.append(body)
            continue
        plan.update.append(_as_update(free.pop(match)[0], body))
    for body in unpaired:
        if free:
            plan.update.append(_as_update(free.pop(0)[0], body))
        else:
            plan.create.append(body)
    plan.delete.extend(slice_ for slice_, _ in free)
    return plan


def _as_update(existing: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    meta = dict(existing["metadata"])
    meta.pop("managedFields", None)
    meta["ownerReferences"] = body["metadata"]["ownerReferences"]
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": body["spec"]}
