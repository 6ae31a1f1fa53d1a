"""``dranet discover``: print the devices this node would publish.

``--output json`` prints exactly a ResourceSlice's ``spec.devices`` (v1 JSON); ``table`` prints one
line per device for people. With a sysfs root other than the host's ``/sys``, netlink facts are
skipped and no netlink call touches the host.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TextIO

from driver.inventory.attributes import D
from driver.inventory.cloud.detection import NONE, effective_provider
from driver.inventory.cloud.metadata import MetadataClient
from driver.inventory.cloud.service import CloudMetadata
from driver.inventory.device_filter import DeviceFilter, FilterError
from driver.inventory.discovery import Scanner
from driver.model.device import STANDARD_DOMAIN, Device, first_int

log = logging.getLogger(__name__)

DISCOVER_CLOUD_WAIT = 5.0
"""Seconds ``dranet discover`` waits for cloud metadata before printing without it."""

COLUMNS = ("NAME", "IFNAME", "PCIADDRESS", "RDMADEVICE", "NUMANODE", "LINKLAYER", "STATE")


def _row(device: Device) -> tuple[str, ...]:
    a = device.attributes

    def get(key: str) -> str:
        value = a.get(key)
        return "-" if value is None else str(value)

    numa = first_int(a.get(f"{STANDARD_DOMAIN}/numaNode"))
    return (
        device.name,
        get(D + "ifName"),
        get(D + "pciAddress"),
        get(D + "rdmaDevice"),
        "-" if numa is None else str(numa),
        get(D + "linkLayer"),
        get(D + "state"),
    )


def format_table(devices: list[Device]) -> str:
    """The devices as aligned columns (one line each, ``-`` for unknown)."""
    rows = [COLUMNS] + [_row(d) for d in devices]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows) + "\n"


def _is_host(root: str) -> bool:
    return os.path.realpath(root) == "/sys"


def sysfs_root_error(root: str) -> str | None:
    """Why ``root`` cannot be a sysfs tree (a typo would otherwise publish nothing, silently)."""
    if not os.path.isdir(root):
        return f"--sysfs-root {root}: no such directory"
    if not any(os.path.isdir(os.path.join(root, d)) for d in ("class", "bus", "devices")):
        return f"--sysfs-root {root}: not a sysfs tree (no class/, bus/ or devices/ directory)"
    return None


def cli_discover(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one scan with the filter and print it; 2 on a bad filter expression."""
    out = out or sys.stdout
    problem = sysfs_root_error(args.sysfs_root)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        device_filter = DeviceFilter(getattr(args, "filter", "") or "")
    except FilterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    excluded = [i.strip() for i in (getattr(args, "exclude_interfaces", "") or "").split(",") if i.strip()]
    gates = getattr(args, "feature_gates", None) or {}
    scanner = Scanner(
        sysfs_root=args.sysfs_root,
        exclude_interfaces=excluded,
        numa_list=gates.get("DRAListTypeAttributes", False),
        replay=False,  # one scan: nothing to replay
    )
    url = getattr(args, "cloud_metadata_url", None)
    provider = effective_provider(getattr(args, "cloud_provider", NONE), _is_host(args.sysfs_root), url)
    cloud = CloudMetadata(provider, MetadataClient(url), args.sysfs_root)
    cloud.start()
    cloud.wait(DISCOVER_CLOUD_WAIT)  # one attempt's worth: a CLI does not retry in the background
    cloud.stop()
    devices = device_filter.apply(cloud.annotate(scanner.scan()))
    if args.output == "json":
        json.dump([d.to_api() for d in devices], out, indent=2)
        out.write("\n")
    else:
        out.write(format_table(devices))
    return 0
