"""A VF's kernel driver while a claim holds it on vfio-pci (``sriov.driver: vfio-pci``), and back.

A DPDK process or a KubeVirt VM drives the VF itself: the VF leaves its kernel driver (``igbvf``,
``iavf``, ``mlx5_core``) for ``vfio-pci``, and the pod gets the VF's VFIO group
(``/dev/vfio/<group>``) and the VFIO container (``/dev/vfio/vfio``) instead of a netdev. The kernel
hands a group out only whole, so the VF must be alone in its IOMMU group (bridges aside), or the
claim must hold every other function of the group too (:meth:`VfioBinder.problems`).

The bind uses the PCI core's ``driver_override``: written with ``vfio-pci``, it makes that the only
driver the function may get; the function is unbound from its driver and ``drivers_probe`` is asked
for it. The way back clears the override, unbinds from vfio-pci and binds the recorded driver
through its ``bind`` file. Both are idempotent: a function already where it should be is left as it
is, so a retried prepare or unprepare, or a restarted driver finishing one, does the rest only.

Everything is read and written through sysfs (``sysfs_root``), on the host: a VFIO group's
character device is in sysfs (``class/vfio/<group>``) as soon as its node is in devtmpfs. The
writes go through ``write`` (the driver's container mounts ``/sys`` read-only unless privileged:
the daemon passes a thread of its own with a writable one).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from driver.api.v1alpha1.network_config import VFIO_PCI
from driver.inventory.attributes import D
from driver.inventory.device_builder import PCI_BRIDGE_CLASS
from driver.model.device import ATTRIBUTE_DOMAIN, Device

log = logging.getLogger(__name__)

BIND_TIMEOUT_S = 5.0
"""How long a bind or a return waits for the kernel to show the function on its new driver."""
VFIO_CONTAINER = "/dev/vfio/vfio"
"""The VFIO container device (the legacy VFIO API every DPDK and QEMU release still opens)."""
IOMMUFD = "/dev/iommu"
"""The iommufd device: a group or a VF's cdev is attached to it instead of a VFIO container on
kernels built without the container API (``CONFIG_VFIO_CONTAINER=n``)."""
VFIO_TAINT_KEY = f"{ATTRIBUTE_DOMAIN}/vfio-pci"
"""The taint on a published VF that is on vfio-pci: only a claim that tolerates it (and asks for
``sriov.driver: vfio-pci``) gets it, never one that wants a netdev."""


class VfioError(Exception):
    """A VF could not go to vfio-pci or back; the message says which step and the kernel's answer."""


@dataclass(frozen=True)
class VfioDevices:
    """What a container needs to drive a VF on vfio-pci: its group's node and the container's."""

    group: int
    group_path: str  # /dev/vfio/<group>
    container_path: str | None  # /dev/vfio/vfio when the kernel has the container API
    iommufd_path: str | None = None  # /dev/iommu when the kernel has iommufd

    @property
    def paths(self) -> tuple[str, ...]:
        """Every node a container needs, those this kernel lacks left out."""
        return tuple(p for p in (self.group_path, self.container_path, self.iommufd_path) if p)


class VfioBinder:
    """Binds VFs to vfio-pci and back, through one sysfs tree."""

    def __init__(
        self,
        sysfs_root: str = "/sys",
        timeout_s: float = BIND_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        write: Callable[[str, str], None] | None = None,
    ) -> None:
        """``write(path, value)`` writes one sysfs file (default: here, in this thread)."""
        self.root = Path(sysfs_root)
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._write_file = write or write_file

    def _function(self, bdf: str) -> Path:
        return self.root / "bus/pci/devices" / bdf

    def driver_of(self, bdf: str) -> str | None:
        """The kernel driver the function is bound to now (None: unbound, or no such function)."""
        link = self._function(bdf) / "driver"
        try:
            return os.path.basename(os.readlink(link))
        except OSError:
            return None

    def group_of(self, bdf: str) -> int | None:
        """The function's IOMMU group (None: no IOMMU translates for it)."""
        try:
            name = os.path.basename(os.readlink(self._function(bdf) / "iommu_group"))
        except OSError:
            return None
        return int(name) if name.isdigit() else None

    def group_members(self, group: int) -> list[str]:
        """The functions of an IOMMU group that would have to leave their driver with it (bridges
        excepted), sorted."""
        base = self.root / "kernel/iommu_groups" / str(group) / "devices"
        try:
            names = sorted(p.name for p in base.iterdir())
        except OSError:
            return []
        return [n for n in names if not _read(self._function(n) / "class").startswith(PCI_BRIDGE_CLASS)]

    def vfio_loaded(self) -> bool:
        """Whether the vfio-pci driver is registered on the PCI bus."""
        return (self.root / "bus/pci/drivers" / VFIO_PCI).is_dir()

    def problems(self, bdf: str, held: Collection[str]) -> list[str]:
        """Why the function cannot go to vfio-pci for a claim that holds the functions ``held``
        (its own included): no IOMMU group, another function in its group, vfio-pci not loaded."""
        if not self._function(bdf).exists():
            return [f"PCI function {bdf} is not on this node"]
        out = []
        group = self.group_of(bdf)
        if group is None:
            out.append(
                f"PCI function {bdf} has no IOMMU group: this node's IOMMU is off (intel_iommu=on or "
                "amd_iommu=on on the kernel command line), and vfio-pci needs it"
            )
        else:
            others = [f for f in self.group_members(group) if f != bdf and f not in held]
            if others:
                out.append(
                    f"IOMMU group {group} of {bdf} also holds {', '.join(others)}, which the claim did not get "
                    "(the kernel hands a group to user space only whole)"
                )
        if not self.vfio_loaded() and self.driver_of(bdf) != VFIO_PCI:
            out.append(f"the {VFIO_PCI} driver is not loaded on this node (modprobe {VFIO_PCI})")
        return out

    def devices(self, bdf: str) -> VfioDevices:
        """The device nodes of the function's VFIO group (the group read now)."""
        group = self.group_of(bdf)
        if group is None:
            raise VfioError(f"PCI function {bdf} has no IOMMU group")
        container = VFIO_CONTAINER if (self.root / "class/misc/vfio").exists() else None
        iommufd = IOMMUFD if (self.root / "class/misc/iommu").exists() else None
        return VfioDevices(group, f"/dev/vfio/{group}", container, iommufd)

    def bind(self, bdf: str) -> VfioDevices:
        """Put the function on vfio-pci (nothing to do when it is there) and wait for its VFIO group's
        device; its devices. Raises :class:`VfioError` naming the step that failed."""
        current = self.driver_of(bdf)
        if current != VFIO_PCI:
            started = time.monotonic()
            self._write(self._function(bdf) / "driver_override", VFIO_PCI, bdf, "driver_override")
            if current is not None:
                self._write(self._function(bdf) / "driver/unbind", bdf, bdf, f"unbind from {current}")
            self._write(self.root / "bus/pci/drivers_probe", bdf, bdf, "drivers_probe")
            self._wait(bdf, lambda: self.driver_of(bdf) == VFIO_PCI, f"to be bound to {VFIO_PCI}")
            log.info(
                "VF bound to vfio-pci",
                extra={"kv": {"pci": bdf, "from": current, "ms": round((time.monotonic() - started) * 1000, 1)}},
            )
        group = self.group_of(bdf)
        if group is None:
            raise VfioError(f"PCI function {bdf} on {VFIO_PCI} has no IOMMU group")
        self._wait(
            bdf, lambda: (self.root / "class/vfio" / str(group)).exists(), f"a VFIO group device (class/vfio/{group})"
        )
        return self.devices(bdf)

    def give_back(self, bdf: str, driver: str) -> bool:
        """Put the function back on ``driver`` (its override cleared); False when the function is gone
        (a VF whose PF's count was lowered: nothing to give back). Raises :class:`VfioError`."""
        fn = self._function(bdf)
        if not fn.exists():
            return False
        current = self.driver_of(bdf)
        if _read(fn / "driver_override") not in ("", "(null)"):
            self._write(fn / "driver_override", "\n", bdf, "clearing driver_override")
        if current == driver:
            return True
        started = time.monotonic()
        if current is not None:
            self._write(fn / "driver/unbind", bdf, bdf, f"unbind from {current}")
        bind = self.root / "bus/pci/drivers" / driver / "bind"
        if bind.exists():
            self._write(bind, bdf, bdf, f"bind to {driver}")
        else:
            self._write(self.root / "bus/pci/drivers_probe", bdf, bdf, "drivers_probe")
        self._wait(bdf, lambda: self.driver_of(bdf) == driver, f"to be bound to {driver} again")
        log.info(
            "VF given back to its driver",
            extra={"kv": {"pci": bdf, "driver": driver, "ms": round((time.monotonic() - started) * 1000, 1)}},
        )
        return True

    def _write(self, path: Path, value: str, bdf: str, step: str) -> None:
        try:
            self._write_file(str(path), value)
        except OSError as exc:
            raise VfioError(f"PCI function {bdf}: {step} ({path}) failed: {exc.strerror or exc}") from None

    def _wait(self, bdf: str, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not done():
            if time.monotonic() >= deadline:
                now = self.driver_of(bdf) or "no driver"
                raise VfioError(f"PCI function {bdf} did not get {what} within {self.timeout_s:g} s (it has {now})")
            self._sleep(0.01)


def write_file(path: str, value: str) -> None:
    """Write ``value`` to a sysfs file in one ``write(2)`` (a sysfs store sees the whole value)."""
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class VfioTaints:
    """Each published VF on vfio-pci (``dra.net/pciDriver``) tainted ``dra.net/vfio-pci:NoSchedule``:
    the scheduler gives it only to a claim that tolerates the taint. ``timeAdded`` is when the
    driver first saw it there, the same while it lasts (an unchanged taint costs no slice write)."""

    def __init__(self) -> None:
        self._since: dict[str, str] = {}

    def of(self, devices: Sequence[Device], now: float | None = None) -> dict[str, list[dict[str, str]]]:
        """device -> its taint, for the devices on vfio-pci."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
        bound = [d.name for d in devices if d.attributes.get(D + "pciDriver") == VFIO_PCI]
        self._since = {name: self._since.get(name, stamp) for name in bound}
        return {
            name: [{"key": VFIO_TAINT_KEY, "value": VFIO_PCI, "effect": "NoSchedule", "timeAdded": added}]
            for name, added in self._since.items()
        }
