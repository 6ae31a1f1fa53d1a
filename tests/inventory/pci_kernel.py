"""A PCI bus in a temporary sysfs tree that answers driver writes as the kernel's PCI core does.

For the vfio-pci unit tests (the real bind runs in the SR-IOV guest, tests/inventory/test_sriov_vfs.py):
functions with a ``driver`` link, an ``iommu_group`` link and a ``driver_override`` file; writing
``unbind`` drops the link, ``drivers_probe`` binds the override (or the function's own driver when
none is set), a driver's ``bind`` binds that driver, and vfio-pci makes the group's ``class/vfio``
entry. ``refuse`` names writes that fail as the kernel's would (``EBUSY``, ``ENODEV``).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PciKernel:
    root: Path
    own: dict[str, str] = field(default_factory=dict)  # function -> the driver a probe gives it without an override
    refuse: dict[str, int] = field(default_factory=dict)  # a write's path suffix -> the errno it fails with
    writes: list[tuple[str, str]] = field(default_factory=list)
    drivers: tuple[str, ...] = ("igbvf", "igb", "vfio-pci")

    def __post_init__(self) -> None:
        for d in self.drivers:
            (self.root / "bus/pci/drivers" / d).mkdir(parents=True, exist_ok=True)
            (self.root / "bus/pci/drivers" / d / "bind").write_text("")
        (self.root / "bus/pci/drivers_probe").write_text("")
        (self.root / "class/misc/vfio").mkdir(parents=True, exist_ok=True)

    def function(self, bdf: str, driver: str | None, group: int | None, cls: str = "0x020000") -> None:
        """A function on ``driver`` in IOMMU ``group`` (None: no IOMMU)."""
        fn = self.root / "bus/pci/devices" / bdf
        fn.mkdir(parents=True)
        (fn / "class").write_text(cls + "\n")
        (fn / "driver_override").write_text("(null)\n")
        if driver:
            self.own.setdefault(bdf, driver)
            self._link(bdf, driver)
        if group is not None:
            members = self.root / "kernel/iommu_groups" / str(group) / "devices"
            members.mkdir(parents=True, exist_ok=True)
            (members / bdf).symlink_to(fn)
            (fn / "iommu_group").symlink_to(members.parent)

    def driver(self, bdf: str) -> str | None:
        link = self.root / "bus/pci/devices" / bdf / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def _link(self, bdf: str, driver: str) -> None:
        fn = self.root / "bus/pci/devices" / bdf
        (fn / "driver").symlink_to(self.root / "bus/pci/drivers" / driver)
        group = fn / "iommu_group"
        if driver == "vfio-pci" and group.is_symlink():
            (self.root / "class/vfio" / os.path.basename(os.readlink(group))).mkdir(parents=True, exist_ok=True)

    def _unlink(self, bdf: str) -> None:
        fn = self.root / "bus/pci/devices" / bdf
        if self.driver(bdf) == "vfio-pci" and (fn / "iommu_group").is_symlink():
            (self.root / "class/vfio" / os.path.basename(os.readlink(fn / "iommu_group"))).rmdir()
        (fn / "driver").unlink()

    def write(self, path: str, value: str) -> None:
        """What a ``write(2)`` of ``value`` to ``path`` does."""
        self.writes.append((path, value))
        for suffix, err in self.refuse.items():
            if path.endswith(suffix):
                raise OSError(err, os.strerror(err))
        rel = Path(path).relative_to(self.root)
        parts = rel.parts
        if rel == Path("bus/pci/drivers_probe"):
            bdf = value.strip()
            override = (self.root / "bus/pci/devices" / bdf / "driver_override").read_text().strip()
            if self.driver(bdf) is None:
                self._link(bdf, self.own[bdf] if override == "(null)" else override)
        elif parts[:3] == ("bus", "pci", "devices") and parts[-1] == "driver_override":
            Path(path).write_text((value.strip() or "(null)") + "\n")
        elif parts[:3] == ("bus", "pci", "devices") and parts[-2:] == ("driver", "unbind"):
            self._unlink(parts[3])
        elif parts[:3] == ("bus", "pci", "drivers") and parts[-1] == "bind":
            bdf, driver = value.strip(), parts[3]
            override = (self.root / "bus/pci/devices" / bdf / "driver_override").read_text().strip()
            if self.driver(bdf) is not None:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
            if override not in ("(null)", driver):
                raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
            self._link(bdf, driver)
        else:
            Path(path).write_text(value)
