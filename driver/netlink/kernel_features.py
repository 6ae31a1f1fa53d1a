"""The kernel the driver runs on: its release against the supported floor, and each kernel feature
the driver uses, with what it does without it.

Checked once at start (:func:`detect`): logged, exported as metrics (``dranet_kernel_info``,
``dranet_kernel_feature``) and answered on ``/kernel`` of the probe server for ``kubectl dranet
doctor``. Features that a version says (upstream mainline) are judged by the release: a distribution
that backports one (RHEL) gets the fallback, which works, only more narrowly. Link kinds and RDMA
netlink are asked of the kernel itself (a module may be missing whatever the version).

=====================  =========  ================================================================
feature                upstream   without it
=====================  =========  ================================================================
``moveIfindex``        5.17       ``IFLA_NEW_IFINDEX``: a NIC keeps its own ifindex in the pod;
                                  a pod already holding that index is refused, naming it
``ipv4BigTcp``         6.3        ``interface.gsoIPv4MaxSize``/``groIPv4MaxSize`` refused at
                                  prepare, naming the kernel
``tcx``                6.6        nothing to detach: no tcx programs can exist
``macvlan``/``ipvlan``  module    a share (or ``interface.type``) of that kind refused at prepare
``vrf``                module     ``interface.vrf`` refused at RunPodSandbox, naming the kernel
``rdmaNetlink``        module     RDMA netns mode unknown (treated as shared); no RDMA device moves
=====================  =========  ================================================================

The floor, :data:`FLOOR`: the oldest release the driver is tested against; below it the driver
still runs but says so (an ERROR at start, the metric, ``kubectl dranet doctor``).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from driver.netlink.channel import (
    IFINFOMSG,
    IFLA_INFO_KIND,
    IFLA_LINKINFO,
    NLA_F_NESTED,
    NLM_F_CREATE,
    NLM_F_EXCL,
    RTM_NEWLINK,
    attr,
)
from driver.netlink.rtnl import Request, Rtnl

log = logging.getLogger(__name__)

FLOOR = (5, 10)
"""The oldest kernel supported: 5.10 (Amazon Linux 2, Debian 11); RHEL 9's 5.14 and Ubuntu 22.04's
5.15 sit above it, without ``IFLA_NEW_IFINDEX``."""
TESTED = ("5.10", "6.1", "6.12", "6.18", "7.3")
"""The kernels the kernel-dependent tests run on: Debian 11's 5.10 (moves, returns, sub-interfaces),
Debian 12's 6.1 (all of them), Debian 13's 6.12 and trixie-backports' 7.3 (those that differ by
kernel; on 7.3 RDMA between pods too) in the stock-kernel tier, and the project's own 6.18."""
NETLINK_RDMA = 20


@dataclass(frozen=True)
class Feature:
    """One kernel feature: whether this kernel has it, what it needs, what the driver does without."""

    name: str
    available: bool
    needs: str
    without: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "available": self.available, "needs": self.needs, "without": self.without}


MOVE_IFINDEX = "moveIfindex"
BY_VERSION: dict[str, tuple[tuple[int, int], str]] = {
    MOVE_IFINDEX: (
        (5, 17),
        "a NIC keeps its host ifindex in the pod (IFLA_NEW_IFINDEX); a pod already holding it is refused",
    ),
    "ipv4BigTcp": ((6, 3), "interface.gsoIPv4MaxSize and groIPv4MaxSize are refused"),
    "tcx": ((6, 6), "no tcx programs exist to detach"),
}
LINK_KINDS: dict[str, str] = {
    "macvlan": "shares of that kind (and interface.type: macvlan) are refused",
    "ipvlan": "shares of that kind (and interface.type: ipvlan) are refused",
    "vrf": "interface.vrf is refused",
}
RDMA_WITHOUT = "RDMA netns mode unknown (treated as shared): RDMA devices never move with their NIC"


def parse_release(release: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a ``uname -r`` string (``6.1.0-56-amd64`` -> (6, 1, 0)); (0, 0, 0)
    when it has no version."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if not found:
        return (0, 0, 0)
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


@dataclass(frozen=True)
class KernelFeatures:
    """What the running kernel offers the driver."""

    release: str
    features: tuple[Feature, ...] = field(default_factory=tuple)

    @property
    def version(self) -> tuple[int, int, int]:
        return parse_release(self.release)

    @property
    def below_floor(self) -> bool:
        return self.version[:2] < FLOOR

    def has(self, name: str) -> bool:
        """Whether the kernel has feature ``name`` (an unknown name: assumed present)."""
        return next((f.available for f in self.features if f.name == name), True)

    def missing(self) -> list[Feature]:
        return [f for f in self.features if not f.available]

    def without(self, *names: str) -> KernelFeatures:
        """These features made unavailable (what the driver does on an older kernel, shown on this one)."""
        return KernelFeatures(
            self.release,
            tuple(Feature(f.name, False, f.needs, f.without) if f.name in names else f for f in self.features),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "floor": ".".join(map(str, FLOOR)),
            "belowFloor": self.below_floor,
            "features": [f.to_dict() for f in self.features],
        }


NO_KIND = "Operation not supported"
"""The kernel's answer to a link kind it does not have (EOPNOTSUPP: "Unknown device type")."""
PROBED_KINDS = ("macvlan", "ipvlan", "vrf")


def link_kind_supported(rtnl: Rtnl, kind: str) -> tuple[bool, str]:
    """(supported, the kernel's answer): whether this kernel can make ``kind`` links, asked by a
    request that can create nothing: no parent (a sub-interface kind refuses it, EINVAL, once it
    knows the kind) and no table (a VRF refuses that, EINVAL); an unknown kind is refused first,
    EOPNOTSUPP (after the kernel tried to load its module). Only for :data:`PROBED_KINDS`: another
    kind might need neither and be created."""
    if kind not in PROBED_KINDS:
        raise ValueError(f"{kind!r} is not a probed link kind ({', '.join(PROBED_KINDS)})")
    info = attr(IFLA_INFO_KIND, kind.encode())
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr(IFLA_LINKINFO | NLA_F_NESTED, info)
    [err] = rtnl.run_each([Request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, kind, "probe", f"{kind} probe")])
    if err is None:  # cannot happen for PROBED_KINDS
        return True, "accepted"
    return NO_KIND not in err.reason, err.reason


def _has_rdma_netlink(open_socket: Callable[[], socket.socket]) -> bool:
    try:
        open_socket().close()
    except OSError:
        return False
    return True


def _rdma_socket() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_RDMA)


def detect(
    rtnl: Rtnl | None = None,
    release: str | None = None,
    rdma_socket: Callable[[], socket.socket] = _rdma_socket,
) -> KernelFeatures:
    """The running kernel's features; ``rtnl`` (a socket in the host's namespace) asks it for the
    link kinds (:func:`link_kind_supported`, which creates nothing); without one they are not asked."""
    release = release or os.uname().release
    version = parse_release(release)[:2]
    features = [
        Feature(name, version >= needed, f"Linux {needed[0]}.{needed[1]}", without)
        for name, (needed, without) in BY_VERSION.items()
    ]
    if rtnl is not None:
        features += [
            Feature(kind, link_kind_supported(rtnl, kind)[0], f"the {kind} module", w) for kind, w in LINK_KINDS.items()
        ]
    features.append(Feature("rdmaNetlink", _has_rdma_netlink(rdma_socket), "the ib_core module", RDMA_WITHOUT))
    return KernelFeatures(release, tuple(features))


def report(kernel: KernelFeatures) -> None:
    """Say at start what the kernel is and lacks: an ERROR below the floor, one INFO line otherwise."""
    missing = {f.name: f"needs {f.needs}; without it {f.without}" for f in kernel.missing()}
    kv = {"release": kernel.release, "floor": ".".join(map(str, FLOOR)), "missing": missing}
    if kernel.below_floor:
        log.error("kernel below the supported floor: features may fail in ways no test has seen", extra={"kv": kv})
    else:
        log.info("kernel features", extra={"kv": kv})
