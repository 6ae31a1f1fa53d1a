"""GSO/GRO maximum sizes of a NIC in the pod (``ip link set dev X gso_max_size N ...``, BIG TCP).

A claim's ``interface.gsoMaxSize``, ``groMaxSize``, ``gsoIPv4MaxSize`` and ``groIPv4MaxSize`` are
checked against what the NIC and kernel allow (``IFLA_TSO_MAX_SIZE`` for the GSO sizes, the
kernel's ``GRO_MAX_SIZE`` for the GRO ones) at prepare and again before the NIC moves, travel in
the request that sets the NIC's MTU and MAC in the pod (no extra round trip), and the host values
recorded before the move are set back in the host's restore batch when the NIC returns.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Sequence

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.state import MovedDevice
from driver.model.device import Device
from driver.netlink.channel import IFINFOMSG, NLM_F_REQUEST, RTM_GETLINK, attr, netlink_socket, pick_attrs
from driver.netlink.rtnl import SKIP_STATS, Request, Rtnl, newlink
from driver.nic_settings.setting import HostNetns, Nic, NicSetting, PodNetns, SettingRefused

IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_TSO_MAX_SIZE = 41, 58, 59
IFLA_GSO_IPV4_MAX_SIZE, IFLA_GRO_IPV4_MAX_SIZE = 63, 64
GRO_MAX_SIZE = 8 * 65535  # include/linux/netdevice.h: the largest GRO size any NIC takes
ATTRS = {
    "gsoMaxSize": IFLA_GSO_MAX_SIZE,
    "groMaxSize": IFLA_GRO_MAX_SIZE,
    "gsoIPv4MaxSize": IFLA_GSO_IPV4_MAX_SIZE,
    "groIPv4MaxSize": IFLA_GRO_IPV4_MAX_SIZE,
}
"""Claim field name -> link attribute (the claim's names key everything here)."""
_WANTED = frozenset({*ATTRS.values(), IFLA_TSO_MAX_SIZE})


class OffloadSizeError(Exception):
    """A NIC cannot take a configured size; the message names the field, the value and the limit."""


def read(rtnl: Rtnl, index: int) -> tuple[dict[str, int], int | None]:
    """The NIC's current sizes (claim field names; a kernel without a field has none) and its
    TSO maximum (None: the kernel does not say)."""
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + SKIP_STATS
    (reply,) = rtnl.exchange([(RTM_GETLINK, NLM_F_REQUEST, body)])
    if reply.error:
        raise OSError(reply.error, f"RTM_GETLINK {index}")
    attrs = pick_attrs(reply.payloads[0], IFINFOMSG.size, _WANTED)
    values = {name: struct.unpack("=I", attrs[a])[0] for name, a in ATTRS.items() if a in attrs}
    tso = attrs.get(IFLA_TSO_MAX_SIZE)
    return values, None if tso is None else struct.unpack("=I", tso)[0]


def problems(wanted: dict[str, int], current: dict[str, int], tso_max: int | None) -> list[str]:
    """Why ``wanted`` cannot be set (empty: it can); ``current``/``tso_max`` as :func:`read` gives them."""
    out = []
    for name, value in wanted.items():
        if name not in current:
            release = os.uname().release
            out.append(f"interface.{name}: kernel {release} has no {name} setting (IPv4 sizes need Linux 6.3)")
        elif name.startswith("gso") and tso_max is not None and value > tso_max:
            out.append(f"interface.{name}: {value} is above the NIC's maximum TSO size {tso_max}")
        elif name.startswith("gro") and value > GRO_MAX_SIZE:
            out.append(f"interface.{name}: {value} is above the kernel's maximum GRO size {GRO_MAX_SIZE}")
    return out


def check(rtnl: Rtnl, index: int, wanted: dict[str, int]) -> dict[str, int]:
    """The NIC's current sizes, all of them (setting one may change another: a GSO size of at most
    64k sets the IPv4 one too), to restore later; :class:`OffloadSizeError` with every problem when
    the NIC cannot take ``wanted``."""
    current, tso_max = read(rtnl, index)
    found = problems(wanted, current, tso_max)
    if found:
        raise OffloadSizeError("; ".join(found))
    return current


def check_host_nic(ifname: str, wanted: dict[str, int]) -> list[str]:
    """Prepare-time check (the driver's own netns): why ``ifname`` cannot take ``wanted`` (empty: it can)."""
    rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE))
    try:
        link = rtnl.link(ifname)
        if link is None:
            return [f"device {ifname}: not found in the host namespace"]
        return [f"device {ifname}: {p}" for p in problems(wanted, *read(rtnl, link.index))]
    except OSError as exc:
        return [f"device {ifname}: cannot read its offload sizes: {exc}"]
    finally:
        rtnl.close()


def encode(values: dict[str, int]) -> bytes:
    """The link attributes that set ``values`` (claim field names), for an RTM_NEWLINK."""
    # The IPv6/generic sizes first: setting gso_max_size at or below 64k also sets the IPv4 one.
    return b"".join(attr(ATTRS[name], struct.pack("=I", values[name])) for name in ATTRS if name in values)


def restore(device: str, index: int, values: dict[str, int]) -> Request:
    """The RTM_NEWLINK that sets the recorded host ``values`` back."""
    return newlink(device, index, extra=encode(values), step="restore offload sizes")


class OffloadSizes(NicSetting):
    """``interface.gsoMaxSize``, ``groMaxSize``, ``gsoIPv4MaxSize`` and ``groIPv4MaxSize``."""

    name = "offload_sizes"

    def prepare_problems(self, device: Device, config: NetworkConfig) -> list[str]:
        sizes = config.interface.offload_sizes if config.interface else {}
        return check_host_nic(device.host.ifname, sizes) if sizes and device.host.ifname else []

    def plan(self, nics: Sequence[Nic], host: HostNetns, pod: PodNetns) -> None:
        """Check each NIC that sets sizes can take them and record all its current ones."""
        for nic in nics:
            sizes = nic.interface.offload_sizes
            if sizes:
                try:
                    nic.records[self.name] = check(host.rtnl(), nic.host.index or 0, sizes)
                except (OffloadSizeError, OSError) as exc:
                    raise SettingRefused(nic.name, "offload sizes", str(exc)) from exc

    def link_attrs(self, nic: Nic) -> bytes:
        sizes = nic.interface.offload_sizes
        return encode(sizes) if sizes else b""

    def restore_requests(self, nic: MovedDevice, index: int) -> list[Request]:
        values = nic.records.get(self.name)
        return [restore(nic.device, index, values)] if values else []
