"""RDMA devices from sysfs: their PCI function or netdev, port 1 facts and the char devices a container needs.

Sysfs is the primary source (``class/infiniband``, ``class/infiniband_verbs``,
``class/infiniband_mad``, ``class/misc/rdma_cm``). pyverbs, when importable and reading the
host's own ``/sys``, only refines port facts (link layer, rate); it is never required.

A hardware RDMA device hangs from its PCI function (``device``). A soft one (Soft-RoCE ``rxe``,
soft-iWARP ``siw``) has no bus device (``/sys/devices/virtual/infiniband/``): it is tied to a
netdev instead, which the kernel names in port 1's GID table (``ports/1/gid_attrs/ndevs/0``) and,
for rxe, in ``parent``. A soft device lives and dies with that netdev in its namespace: it cannot
change namespace, and moving the netdev away destroys it (:attr:`RdmaDevice.soft`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal

from driver.inventory.scan_report import ScanReport
from driver.inventory.sysfs import (
    IdentityCache,
    IdentityKey,
    ImmutableFacts,
    SysfsReader,
    name_bytes,
    name_problem,
    pci_address_of,
)
from driver.model.device import CharDevice

log = logging.getLogger(__name__)

try:  # optional: rdma-core's Python bindings
    import pyverbs.device as _pyverbs_device  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - any import failure (missing libibverbs too) means "not available"
    _pyverbs_device = None

CHAR_DEVICE_IDENTITY = ImmutableFacts(("dev",))
"""A uverbs/umad char device's numbers: fixed while it exists."""
RDMA_IDENTITY = ImmutableFacts(("ports/1/link_layer",), ("", "/device"))
"""An RDMA device's port 1 link layer and its parent device (not its name: it can be renamed)."""
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_ACTIVE_WIDTH = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
_ACTIVE_SPEED_GBPS = {1: 2.5, 2: 5.0, 4: 10.0, 8: 10.0, 16: 14.0, 32: 25.0, 64: 50.0, 128: 100.0, 256: 200.0}


@dataclass(slots=True)
class RdmaDevice:
    """One RDMA device (``mlx5_0``) as discovery needs it."""

    name: str
    pci_address: str | None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE), from port 1
    rate_gbps: int | None = None
    char_devices: list[CharDevice] = field(default_factory=list)
    netdev: str | None = None  # the netdev the kernel ties it to (port 1's GID table, rxe's parent)
    soft: bool = False  # no bus device: it exists only with its netdev, in its namespace (rxe, siw)


def parse_rate(text: str | None) -> int | None:
    """Gb/s from a port ``rate`` file (``400 Gb/sec (4X NDR)`` -> 400); None when unknown."""
    if not text:
        return None
    match = _RATE.match(text)
    if not match:
        return None
    # Decimal, not float: a corrupt value of hundreds of digits stays a (huge) int instead of
    # overflowing to inf, and attributes.finalize drops it with a warning.
    value = round(Decimal(match.group(1)))
    return value if value > 0 else None


def rdma_has_pyverbs() -> bool:
    """Whether rdma-core's Python bindings are importable here."""
    return _pyverbs_device is not None


def _char_device(sysfs: SysfsReader, dev_file: str, path: str) -> CharDevice | None:
    text = sysfs.read(dev_file)
    if not text or ":" not in text:
        return None
    major, _, minor = text.partition(":")
    try:
        return CharDevice(path=path, major=int(major), minor=int(minor))
    except ValueError:
        log.warning("bad char device number", extra={"kv": {"file": dev_file, "value": text}})
        return None


def _by_ibdev(sysfs: SysfsReader, cls: str, identity: IdentityCache | None = None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for entry in sysfs.listdir(cls):
        anchor = f"{cls}/{entry}"
        key = identity.prime(sysfs, anchor, CHAR_DEVICE_IDENTITY) if identity else None
        ibdev = sysfs.read(f"{anchor}/ibdev")  # not cached: an RDMA device can be renamed
        if ibdev:
            out.setdefault(ibdev, []).append(entry)
        if identity:
            sysfs.read(f"{anchor}/dev")  # the char device's numbers, fixed while it exists
            identity.remember(sysfs, anchor, key, CHAR_DEVICE_IDENTITY)
    return out


def _pyverbs_port(name: str) -> tuple[str | None, int | None]:
    """Port 1 link layer and rate through pyverbs; (None, None) on any failure."""
    try:
        with _pyverbs_device.Context(name=name) as ctx:  # type: ignore[union-attr]
            attr = ctx.query_port(1)
        layer = {1: "InfiniBand", 2: "Ethernet"}.get(attr.link_layer)
        rate = _ACTIVE_WIDTH.get(attr.active_width, 0) * _ACTIVE_SPEED_GBPS.get(attr.active_speed, 0)
        return layer, (round(rate) or None)
    except Exception as err:  # noqa: BLE001 - fall back to sysfs
        log.debug("pyverbs port query failed", extra={"kv": {"rdma": name, "error": str(err)}})
        return None, None


def _port_facts(sysfs: SysfsReader, name: str, use_pyverbs: bool) -> tuple[str | None, int | None]:
    """Port 1's link layer (fixed per device: identity-cached by scans) and rate (read every time)."""
    base = f"class/infiniband/{name}"
    layer = sysfs.read(f"{base}/ports/1/link_layer") or None
    rate = parse_rate(sysfs.read(f"{base}/ports/1/rate"))
    if use_pyverbs and _pyverbs_device is not None:
        pv_layer, pv_rate = _pyverbs_port(name)
        layer, rate = pv_layer or layer, pv_rate or rate
    return layer, rate


def refresh_ports(sysfs: SysfsReader, device: RdmaDevice, use_pyverbs: bool = False) -> RdmaDevice:
    """``device`` with its port facts read again (a link event on its netdev: rate and state move)."""
    layer, rate = _port_facts(sysfs, device.name, use_pyverbs)
    return replace(device, link_layer=layer, rate_gbps=rate)


def scan_rdma(
    sysfs: SysfsReader,
    use_pyverbs: bool = False,
    identity: IdentityCache | None = None,
    report: ScanReport | None = None,
) -> dict[str, RdmaDevice]:
    """All RDMA devices under ``class/infiniband`` keyed by name.

    ``identity`` (kept across scans by the caller) spares rescans the links and char device
    numbers that cannot change while their object exists. An entry that is not a device (a
    dangling or looping link) or whose facts cannot be read is skipped into ``report``.
    """
    names = sysfs.listdir("class/infiniband")
    if not names:
        return {}
    report = report if report is not None else ScanReport()
    verbs = _by_ibdev(sysfs, "class/infiniband_verbs", identity)
    mads = _by_ibdev(sysfs, "class/infiniband_mad", identity)
    rdma_cm = _char_device(sysfs, "class/misc/rdma_cm/dev", "/dev/infiniband/rdma_cm")
    devices: dict[str, RdmaDevice] = {}
    for name in names:
        what = f"RDMA device {name_bytes(name)}"
        base = f"class/infiniband/{name}"
        problem = name_problem(name)
        # Primed before the directory check reads the device's own link, a fact the cache vouches for.
        key = identity.prime(sysfs, base, RDMA_IDENTITY) if identity and problem is None else None
        if problem is None and not sysfs.is_dir(base):
            problem = "class/infiniband entry is a dangling or looping link"
        if problem is not None:
            report.skip(what, problem)
            continue
        try:
            devices[name] = _rdma_device(sysfs, name, use_pyverbs, (identity, key), verbs, mads, rdma_cm)
        except Exception as exc:  # noqa: BLE001 - one bad device must not hide the others
            report.skip(what, f"{type(exc).__name__}: {exc}")
    return devices


def _rdma_device(
    sysfs: SysfsReader,
    name: str,
    use_pyverbs: bool,
    primed: tuple[IdentityCache | None, IdentityKey | None],
    verbs: dict[str, list[str]],
    mads: dict[str, list[str]],
    rdma_cm: CharDevice | None,
) -> RdmaDevice:
    """One RDMA device's facts: its PCI function, port 1 link layer and rate, char devices.
    ``primed``: the identity cache (if any) and the key its :meth:`~IdentityCache.prime` gave."""
    base = f"class/infiniband/{name}"
    identity, key = primed
    real = sysfs.resolve(f"{base}/device")  # the parent device: fixed at registration
    if identity:
        sysfs.read(f"{base}/ports/1/link_layer")  # fixed while the device exists (rate is not)
        identity.remember(sysfs, base, key, RDMA_IDENTITY)
    pci = pci_address_of(real) if real else None
    netdev = sysfs.read(f"{base}/ports/1/gid_attrs/ndevs/0") or sysfs.read(f"{base}/parent") or None
    layer, rate = _port_facts(sysfs, name, use_pyverbs)
    chars: list[CharDevice] = []
    for entry in verbs.get(name, []):
        char = _char_device(sysfs, f"class/infiniband_verbs/{entry}/dev", f"/dev/infiniband/{entry}")
        if char:
            chars.append(char)
    for entry in mads.get(name, []):  # umadN and issmN
        char = _char_device(sysfs, f"class/infiniband_mad/{entry}/dev", f"/dev/infiniband/{entry}")
        if char:
            chars.append(char)
    if rdma_cm:
        chars.append(rdma_cm)
    return RdmaDevice(name, pci, layer, rate, chars, netdev, soft=real is None)


def soft_device_problem(sysfs: SysfsReader, name: str) -> str | None:
    """Why RDMA device ``name`` cannot follow its netdev into a pod (None: it can, or it is gone):
    a soft device (no bus device) is destroyed when its netdev leaves its namespace."""
    base = f"class/infiniband/{name}"
    if not sysfs.exists(base) or sysfs.resolve(f"{base}/device") is not None:
        return None
    kind = "soft-iWARP (siw)" if (sysfs.read(f"{base}/node_type") or "").startswith("4") else "Soft-RoCE (rxe)"
    return f"{name} is a {kind} device: the kernel destroys it when its netdev leaves the host's network namespace"
