"""Stable DNS-label device names (same scheme as the Go driver, so names survive a driver swap).

PCI-backed devices are named from their bus address (``0000:8a:00.0`` -> ``pci-0000-8a-00-0``);
other netdevs use the interface name when it is a valid DNS-1123 label, else ``net-`` plus the
lowercase unpadded base32 of the name (``mlx5_6`` -> ``net-nvwhqnk7gy``).
"""

from __future__ import annotations

import base64
import re

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_LABEL = 63


def is_dns_label(name: str) -> bool:
    """Whether ``name`` is a valid DNS-1123 label (lowercase alnum and '-', <= 63 chars)."""
    return len(name) <= MAX_LABEL and bool(_DNS_LABEL.match(name))


def pci_device_name(bdf: str) -> str:
    """The device name of a PCI function: ``pci-`` + the BDF with ``:`` and ``.`` as ``-``."""
    return "pci-" + bdf.lower().replace(":", "-").replace(".", "-")


def netdev_device_name(ifname: str) -> str:
    """The device name of a non-PCI netdev: the ifname itself when it is a DNS label, else encoded."""
    if is_dns_label(ifname):
        return ifname
    encoded = base64.b32encode(ifname.encode()).decode().rstrip("=").lower()
    return "net-" + encoded
