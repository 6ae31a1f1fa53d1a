"""VFs made at the driver's start from the chart's ``sriov.vfs`` (opt-in; default: none, the VFs
are the admin's, as the Go driver and the SR-IOV DRA driver leave them).

Each entry is the SR-IOV operator's node policy in small: a ``nicSelector`` (``pfNames``,
``rootDevices`` as PCI addresses, ``vendor``, ``deviceID``; every field given must match, a list
matches when any of its items does) and ``numVfs``. At start every SR-IOV PF of the node
(``sriov_totalvfs`` under its PCI function) that an entry selects gets that count written to its
``sriov_numvfs``, once: a PF already at its count is left alone, so a restart changes nothing.

The kernel changes a PF's count only through 0 (a write of N over M > 0 is refused with EBUSY), and
going through 0 removes every VF: a PF any of whose VFs a prepared claim holds is refused, saying
which VFs and that the count stays. A count above the PF's ``sriov_totalvfs``, two entries selecting
one PF with different counts, or the kernel's refusal are reported for that PF alone (one bad PF
never keeps the others from their counts), each naming the entry (``sriov.vfs[0].numVfs``). A PF
is named by its PCI address, never by its netdev's name alone, which selects it but can be changed.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

FLAG = "--sriov-vfs"
"""The daemon flag (and ``DRANET_SRIOV_VFS``) the chart's ``sriov.vfs`` becomes, as JSON."""
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
HEX_ID = re.compile(r"^[0-9a-f]{4}$")
SELECTOR_FIELDS = ("pfNames", "rootDevices", "vendor", "deviceID")


class VfCountError(ValueError):
    """A ``sriov.vfs`` entry that cannot be used; the message names the field and the reason."""


@dataclass(frozen=True)
class NicSelector:
    pf_names: tuple[str, ...] = ()
    root_devices: tuple[str, ...] = ()
    vendor: str = ""
    device_id: str = ""

    def selects(self, pf: Pf) -> bool:
        return (
            (not self.pf_names or bool(set(self.pf_names) & set(pf.names)))
            and (not self.root_devices or pf.pci in self.root_devices)
            and (not self.vendor or self.vendor == pf.vendor)
            and (not self.device_id or self.device_id == pf.device_id)
        )


@dataclass(frozen=True)
class VfCount:
    """One ``sriov.vfs`` entry, decoded."""

    where: str  # "sriov.vfs[0]": what errors name
    selector: NicSelector
    num_vfs: int


def decode(text: str) -> list[VfCount]:
    """``--sriov-vfs`` (a JSON list; empty: none) -> its entries; :class:`VfCountError` naming the
    field of the first mistake."""
    if not text.strip():
        return []
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VfCountError(f"sriov.vfs: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(raw, list):
        raise VfCountError(f"sriov.vfs: must be a list of {{nicSelector, numVfs}}, not {type(raw).__name__}")
    return [_entry(f"sriov.vfs[{i}]", item) for i, item in enumerate(raw)]


def _entry(where: str, item: object) -> VfCount:
    if not isinstance(item, dict):
        raise VfCountError(f"{where}: must be an object with nicSelector and numVfs")
    unknown = sorted(set(item) - {"nicSelector", "numVfs"})
    if unknown:
        raise VfCountError(f"{where}: unknown field {unknown[0]!r} (nicSelector, numVfs)")
    count = item.get("numVfs")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise VfCountError(f"{where}.numVfs: must be a whole number of VFs, 0 or more (got {count!r})")
    raw = item.get("nicSelector")
    if not isinstance(raw, dict) or not any(raw.get(k) for k in SELECTOR_FIELDS):
        raise VfCountError(
            f"{where}.nicSelector: must name at least one of {', '.join(SELECTOR_FIELDS)} "
            "(a count for every PF of the node is never implied)"
        )
    unknown = sorted(set(raw) - set(SELECTOR_FIELDS))
    if unknown:
        raise VfCountError(f"{where}.nicSelector: unknown field {unknown[0]!r} ({', '.join(SELECTOR_FIELDS)})")
    names = _strings(f"{where}.nicSelector.pfNames", raw.get("pfNames", []))
    roots = tuple(r.lower() for r in _strings(f"{where}.nicSelector.rootDevices", raw.get("rootDevices", [])))
    for root in roots:
        if not PCI_ADDRESS.match(root):
            raise VfCountError(f"{where}.nicSelector.rootDevices: {root!r} is not a PCI address (0000:3b:00.0)")
    ids = {}
    for key in ("vendor", "deviceID"):
        value = str(raw.get(key, "")).lower().removeprefix("0x")
        if value and not HEX_ID.match(value):
            raise VfCountError(f"{where}.nicSelector.{key}: {raw[key]!r} is not a 4-digit hex ID (8086)")
        ids[key] = value
    return VfCount(where, NicSelector(names, roots, ids["vendor"], ids["deviceID"]), count)


def _strings(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise VfCountError(f"{where}: must be a list of non-empty strings")
    return tuple(value)


@dataclass(frozen=True)
class Pf:
    """An SR-IOV PF as sysfs shows it."""

    pci: str  # its PCI address: what identifies it
    names: tuple[str, ...]  # its netdevs' names (what pfNames selects)
    vendor: str
    device_id: str
    total: int  # sriov_totalvfs
    current: int  # sriov_numvfs
    vfs: tuple[str, ...]  # its VFs' PCI addresses


def scan_pfs(sysfs_root: str) -> list[Pf]:
    """Every PCI function with SR-IOV (``sriov_totalvfs`` above 0), by PCI address."""
    base = f"{sysfs_root}/bus/pci/devices"
    try:
        entries = sorted(os.listdir(base))
    except FileNotFoundError:
        return []
    out = []
    for pci in entries:
        path = f"{base}/{pci}"
        try:
            total = int(_read(f"{path}/sriov_totalvfs"))
            current = int(_read(f"{path}/sriov_numvfs"))
        except (OSError, ValueError):
            continue
        if total <= 0:
            continue
        try:
            names = tuple(sorted(os.listdir(f"{path}/net")))
        except OSError:
            names = ()
        vfs = tuple(
            os.path.basename(os.path.realpath(f"{path}/{e}"))
            for e in sorted(os.listdir(path))
            if e.startswith("virtfn") and e[6:].isdigit()
        )
        ids = (
            _read(f"{path}/vendor", "").lower().removeprefix("0x"),
            _read(f"{path}/device", "").lower().removeprefix("0x"),
        )
        out.append(Pf(pci, names, ids[0], ids[1], total, current, vfs))
    return out


def _read(path: str, default: str | None = None) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        if default is None:
            raise
        return default


@dataclass(frozen=True)
class VfOutcome:
    """What start did to one selected PF."""

    pf: str  # PCI address
    names: tuple[str, ...]
    where: str  # the entry that selected it
    before: int
    after: int  # its count now
    refused: str = ""  # why its count is not the entry's ("" when it is)


def apply(
    counts: Sequence[VfCount],
    sysfs_root: str,
    prepared: Collection[str],
    write: Callable[[str, str], None] | None = None,
) -> list[VfOutcome]:
    """Give every PF the entries select its count; ``prepared``: the PCI addresses prepared claims
    hold; ``write(path, value)`` writes a sysfs file (default: in this thread; the daemon's container
    mounts ``/sys`` read-only unless privileged). One outcome per selected PF, logged; nothing
    raised for one PF's trouble."""
    out = []
    for pf in scan_pfs(sysfs_root) if counts else []:
        chosen = [c for c in counts if c.selector.selects(pf)]
        if not chosen:
            continue
        entry = chosen[0]
        path = f"{sysfs_root}/bus/pci/devices/{pf.pci}/sriov_numvfs"
        outcome = _apply_one(pf, entry, chosen, path, prepared, write or _write)
        level = logging.WARNING if outcome.refused else logging.INFO
        log.log(level, "SR-IOV VF count", extra={"kv": {k: v for k, v in vars(outcome).items() if v != ""}})
        out.append(outcome)
    return out


def _apply_one(
    pf: Pf,
    entry: VfCount,
    chosen: Sequence[VfCount],
    path: str,
    prepared: Collection[str],
    write: Callable[[str, str], None],
) -> VfOutcome:
    def refused(why: str) -> VfOutcome:
        return VfOutcome(pf.pci, pf.names, entry.where, pf.current, pf.current, why)

    others = [c for c in chosen[1:] if c.num_vfs != entry.num_vfs]
    if others:
        return refused(f"{entry.where} and {others[0].where} both select PF {pf.pci} with different numVfs")
    if entry.num_vfs > pf.total:
        return refused(f"{entry.where}.numVfs: {entry.num_vfs} is above PF {pf.pci}'s sriov_totalvfs ({pf.total})")
    if entry.num_vfs == pf.current:
        return VfOutcome(pf.pci, pf.names, entry.where, pf.current, pf.current)
    held = [vf for vf in pf.vfs if vf in prepared]
    if held:
        return refused(
            f"{entry.where}.numVfs: PF {pf.pci} keeps {pf.current} VFs: {', '.join(held)} prepared for claims "
            "(the kernel changes a count only through 0, which removes every VF)"
        )
    try:
        if pf.current:
            write(path, "0")
        write(path, str(entry.num_vfs))
    except OSError as exc:
        now = int(_read(path, "-1") or -1)
        why = f"{entry.where}.numVfs: PF {pf.pci} refused {entry.num_vfs} VFs: {exc.strerror or exc} (it has {now})"
        return VfOutcome(pf.pci, pf.names, entry.where, pf.current, now, why)
    return VfOutcome(pf.pci, pf.names, entry.where, pf.current, entry.num_vfs)


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)
