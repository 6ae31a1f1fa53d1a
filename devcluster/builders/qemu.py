"""QEMU 10 from Debian's bookworm-backports for the SR-IOV guests of the stock-kernel tier.

QEMU emulates the ``igb`` NIC (Intel 82576, up to 7 VFs a PF) since 8.0; this machine's Debian 12
QEMU is 7.2. The backport's ``qemu-system-x86`` and ``qemu-system-data`` are downloaded and
unpacked into the cache, never installed: every other guest keeps this machine's QEMU, and the
machine's own packages are left alone. The backport's libraries are Debian 12's (its dependencies
are those of 7.2 but for its own data and common packages), so the unpacked binary runs as it
is; its firmware folder is the unpacked one (``-L``), whose BIOS and option ROMs link to this
machine's SeaBIOS and iPXE. QEMU's loadable modules (display, audio, USB redirection: none of
them used here) would be the installed 7.2's, which a 10 refuses to load, so the guests point
``QEMU_MODULE_DIR`` at an empty folder.

Cached under ``~/.cache/dranet/qemu/<version>``::

    python -m devcluster.builders.qemu   # prints the binary (downloads on first use)
"""

from __future__ import annotations

import fcntl
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.builders.binaries import cache_root
from devcluster.builders.stock_kernel import Progress, StockKernelError, apt_options, apt_unpack, run

SUITE = "bookworm-backports"
PACKAGES = ("qemu-system-x86", "qemu-system-data")
BINARY = "qemu-system-x86_64"


@dataclass(frozen=True)
class Qemu:
    """A QEMU to run: its command's start and the environment it needs."""

    command: tuple[str, ...] = (BINARY,)
    env: dict[str, str] = field(default_factory=dict)
    version: str = "this machine's"


SYSTEM = Qemu()
"""This machine's QEMU, on PATH."""


def _at(root: Path, version: str) -> Qemu:
    return Qemu(
        command=(str(root / "usr" / "bin" / BINARY), "-L", str(root / "usr" / "share" / "qemu")),
        env={"QEMU_MODULE_DIR": str(root / "no-modules")},
        version=version,
    )


def ensure(progress: Progress = lambda msg: print(msg, file=sys.stderr, flush=True)) -> Qemu:
    """The backport's QEMU, unpacked into the cache on first use."""
    options = apt_options(SUITE)
    table = run("apt-cache", *options, "madison", PACKAGES[0])
    rows = [line.split("|") for line in table.splitlines()]
    backport = [cols[1].strip() for cols in rows if len(cols) == 3 and SUITE in cols[2]]
    if not backport:
        raise StockKernelError(f"{PACKAGES[0]} has no {SUITE} version in {table!r}")
    version = backport[0]
    root = cache_root() / "qemu" / version.replace(":", "%")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "version").exists():
            return _at(root, version)
        tmp = root.with_name(root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        progress(f"[qemu] downloading {' '.join(PACKAGES)} {version} from {SUITE} (igb NICs with SR-IOV)")
        apt_unpack([f"{p}={version}" for p in PACKAGES], options, tmp)
        (tmp / "no-modules").mkdir()
        qemu = _at(tmp, version)
        run(*qemu.command[:1], "--version")  # it runs here, with this machine's libraries
        (tmp / "version").write_text(version)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
        return _at(root, version)


def main() -> int:
    try:
        qemu = ensure()
    except StockKernelError as exc:
        print(f"qemu: {exc}", file=sys.stderr)
        return 1
    print(f"qemu {qemu.version}: {qemu.command[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
