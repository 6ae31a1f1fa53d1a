"""Debian's stock kernel for the stock-kernel test tier: the package, its modules, a boot image.

The tier (``tests/kernels``) runs this machine's own userland and the project under the kernel GPU
clusters run (Debian 12, COS and Amazon Linux 2023 run 6.1), booted by QEMU
(:mod:`harness.guest`). Everything comes from Debian's packages:

- ``apt-get download`` of the image package ``linux-image-amd64`` depends on (the current 6.1 ABI
  package; ``DRANET_STOCK_KERNEL`` names another image package, or another Debian suite whose
  index is read into the cache: ``bullseye`` gives 5.10, below ``IFLA_NEW_IFINDEX``), unpacked,
  never installed: this machine's own kernel and ``/lib/modules`` are left alone;
- ``depmod`` over the unpacked modules, so the guest's ``modprobe`` (and the kernel's own module
  requests: a VRF, an ipvlan, a veth) find them once they are mounted at ``/lib/modules``;
- the kernel uncompressed (``vmlinux``): QEMU boots it directly (PVH), which spares the guest a
  decompression that costs seconds under emulation;
- an initramfs of ``busybox`` and the modules that mount the root: virtio PCI, 9p, overlayfs.

Cached per package version under ``~/.cache/dranet/stock-kernel/<package>_<version>`` (about
400 MB unpacked, the 70 MB package is not kept)::

    python -m devcluster.builders.stock_kernel [bullseye ...]   # prints each release (builds on first use)
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders.binaries import cache_root

ENV = "DRANET_STOCK_KERNEL"
METAPACKAGE = "linux-image-amd64"
MIRROR = "http://deb.debian.org/debian"  # another suite's index (DRANET_STOCK_KERNEL=bullseye) comes from here
BUSYBOX = Path("/usr/bin/busybox")  # busybox-static (make deps)
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
"""What the initramfs loads, with their dependencies, to mount this machine's root (9p) under a
writable overlay."""
ROOT_TAG, OUT_TAG = "hostroot", "guestout"
"""The 9p mount tags of this machine's root (read-only) and of the run's own folder (writable)."""
GUEST_DIR = "/run/guest"
"""Where the guest mounts the run's folder: the script it runs, what it writes back."""
TOOLS = ("apt-get", "apt-cache", "dpkg-deb", "depmod", "cpio", "zstd", "qemu-system-x86_64")

Progress = Callable[[str], None]


class StockKernelError(RuntimeError):
    """The stock kernel cannot be had here; says what is missing."""


@dataclass(frozen=True)
class StockKernel:
    """An unpacked Debian kernel package, ready to boot."""

    package: str  # "linux-image-6.1.0-56-amd64"
    version: str  # the Debian version, "6.1.192-2"
    release: str  # ``uname -r`` in the guest, "6.1.0-56-amd64"
    root: Path

    @property
    def vmlinux(self) -> Path:
        return self.root / "vmlinux"

    @property
    def modules(self) -> Path:
        """The folder the guest mounts at ``/lib/modules``."""
        return self.root / "lib" / "modules"

    @property
    def initramfs(self) -> Path:
        return self.root / "initramfs.img"


def run(*args: str, cwd: Path | None = None) -> str:
    """``args`` run to the end; its stdout, or :class:`StockKernelError` naming the command and its words."""
    out = subprocess.run(args, capture_output=True, text=True, cwd=cwd)
    if out.returncode != 0:
        raise StockKernelError(f"{' '.join(args)} failed ({out.returncode}): {(out.stderr or out.stdout).strip()}")
    return out.stdout


def missing_tools() -> list[str]:
    """The commands the tier needs that this machine lacks (``make deps`` installs them)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None] + ([] if BUSYBOX.exists() else [str(BUSYBOX)])


def apt_options(suite: str) -> list[str]:
    """apt options that read another Debian suite's index from a private folder of the cache (this
    machine's own sources and lists are left alone), fetched once."""
    state = cache_root() / "stock-kernel" / f"apt-{suite}"
    lists = state / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text(f"deb {MIRROR} {suite} main\n")
    options = [
        f"-oDir::Etc::sourcelist={sources}",
        "-oDir::Etc::sourceparts=-",
        f"-oDir::State::Lists={lists}",
        "-oAPT::Get::List-Cleanup=0",
    ]
    if not any(lists.glob("*Packages*")):
        run("apt-get", *options, "-qq", "update")
    return options


def apt_unpack(specs: Iterable[str], options: list[str], into: Path) -> None:
    """``apt-get download`` of the ``package=version`` ``specs`` (with ``options``: another suite's
    index), each unpacked into ``into`` with ``dpkg-deb -x`` and its ``.deb`` removed: never installed."""
    run("apt-get", *options, "download", "-q", *specs, cwd=into)
    for deb in into.glob("*.deb"):
        run("dpkg-deb", "-x", str(deb), str(into))
        deb.unlink()


def image_package(wanted: str = "") -> tuple[str, str, list[str]]:
    """(package, candidate version, apt options) of the kernel image to boot. ``wanted`` names an
    image package, or a Debian suite (``bullseye``: its ``linux-image-amd64``, 5.10); empty: the
    one this machine's ``linux-image-amd64`` depends on today."""
    options = apt_options(wanted) if wanted and not wanted.startswith("linux-image-") else []
    package = wanted if wanted.startswith("linux-image-") else ""
    if not package:
        deps = run("apt-cache", *options, "depends", METAPACKAGE)
        found = re.search(r"Depends:\s*(linux-image-\S+)", deps)
        if not found:
            raise StockKernelError(f"apt-cache depends {METAPACKAGE}: no linux-image package in {deps!r}")
        package = found.group(1)
    policy = run("apt-cache", *options, "policy", package)
    candidate = re.search(r"Candidate:\s*(\S+)", policy)
    if not candidate or candidate.group(1) == "(none)":
        raise StockKernelError(f"{package} is not in this machine's package index (apt-get update?)")
    return package, candidate.group(1), options


def split_parts(package: str, depends: str) -> list[str]:
    """The packages an image package is split into (Linux 7 on: the image is a small package that
    depends on ``linux-binary-<abi>``, the kernel, ``linux-modules-<abi>``, the modules, and
    ``linux-base-<abi>``, their ``modules.builtin`` and config), from ``apt-cache depends``; none
    for an image package that holds everything itself (6.12 and older)."""
    abi = package.removeprefix("linux-image-")
    wanted = re.compile(rf"linux-(?:base|binary|modules)-{re.escape(abi)}")
    return sorted({d for d in re.findall(r"Depends:\s*(\S+)", depends) if wanted.fullmatch(d)})


def _cache_dir(package: str, version: str) -> Path:
    return cache_root() / "stock-kernel" / f"{package}_{version.replace(':', '%')}"


def _module_name(path: str) -> str:
    return Path(path).name.split(".ko")[0].replace("-", "_")


def boot_order(modules_dep: str, wanted: Iterable[str], builtin: str = "") -> list[str]:
    """The module files (relative to the release folder) to load for ``wanted``, each after what it
    needs, from ``modules.dep``'s ``path: dependency...`` lines; those in ``builtin`` (the kernel's
    ``modules.builtin``: Linux 7 builds virtio PCI in) need no file."""
    inside = {_module_name(line) for line in builtin.split()}
    wanted = [name for name in wanted if name not in inside]
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in modules_dep.splitlines():
        path, _, rest = line.partition(":")
        if not path:
            continue
        deps[path] = rest.split()
        by_name[_module_name(path)] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps.get(path, []):
            visit(dep)
        order.append(path)

    for name in wanted:
        if name not in by_name:
            raise StockKernelError(f"module {name} is not in this kernel's modules.dep")
        visit(by_name[name])
    return order


INIT = """#!/bin/busybox sh
# The stock-kernel tier's first process: this machine's root (9p, read-only) under a tmpfs overlay
# (so /tmp, where a checkout may live, stays visible and writable), a tmpfs /run (the guest's own
# network namespaces), the run's folder at {guest_dir}, then the run's own script.
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
for m in {modules}; do $B insmod /modules/$m || $B echo "initramfs: insmod $m failed"; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=1048576,cache=loose {root_tag} /lower
$B mount -t tmpfs -o mode=0755 upper /upper
$B mkdir -p /upper/rw /upper/work
$B mount -t overlay -o lowerdir=/lower,upperdir=/upper/rw,workdir=/upper/work overlay /newroot
$B mount -t tmpfs -o mode=0755 run /newroot/run
$B mkdir -p /newroot{guest_dir} /newroot/lib/modules
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 {out_tag} /newroot{guest_dir}
$B mount --bind /newroot{modules_dir} /newroot/lib/modules
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount --move /dev /newroot/dev
exec $B switch_root /newroot /bin/sh {guest_dir}/boot.sh
"""


def _cpio(src: Path, dest: Path) -> None:
    """``src`` as a newc cpio archive (the kernel's initramfs format)."""
    names = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    with open(dest, "wb") as out:
        subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"],
            input="\n".join([".", *names]).encode(),
            cwd=src,
            stdout=out,
            check=True,
        )


def _uncompressed(module: Path, folder: Path) -> str:
    """``module`` copied into ``folder`` as a plain ``.ko`` (busybox's insmod reads no ``.ko.xz``,
    what Debian 13's modules are); its new name."""
    name = module.name.split(".ko")[0] + ".ko"
    data = module.read_bytes()
    if module.name.endswith(".xz"):
        data = lzma.decompress(data)
    elif module.name.endswith(".zst"):
        data = _unzstd(data)
    elif module.name.endswith(".gz"):
        data = gzip.decompress(data)
    (folder / name).write_bytes(data)
    return name


def _initramfs(kernel: StockKernel, modules_dir: Path) -> None:
    """The initramfs of ``kernel``, whose modules the guest finds at ``modules_dir`` (their final place)."""
    release_dir = kernel.modules / kernel.release
    order = boot_order((release_dir / "modules.dep").read_text(), BOOT_MODULES, _read(release_dir / "modules.builtin"))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for sub in ("bin", "modules", "proc", "sys", "dev", "lower", "upper", "newroot"):
            (root / sub).mkdir()
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        names = [_uncompressed(release_dir / path, root / "modules") for path in order]
        init = root / "init"
        init.write_text(
            INIT.format(
                modules=" ".join(names),
                root_tag=ROOT_TAG,
                out_tag=OUT_TAG,
                guest_dir=GUEST_DIR,
                modules_dir=str(modules_dir),
            )
        )
        init.chmod(0o755)
        _cpio(root, kernel.initramfs)
    (kernel.root / INITRAMFS_KEY).write_text(initramfs_key())


INITRAMFS_KEY = "initramfs.key"


def initramfs_key() -> str:
    """What the initramfs is made of (its init and modules): a cached one of another make is remade."""
    return hashlib.sha256((INIT + " ".join(BOOT_MODULES) + str(BUSYBOX)).encode()).hexdigest()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


XZ_MAGIC = b"\xfd7zXZ\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _unzstd(data: bytes) -> bytes:
    """The first zstd frame of ``data`` decompressed (``zstd``: the standard library has none before 3.14);
    empty when it is not one."""
    out = subprocess.run(["zstd", "-dcq"], input=data, capture_output=True, check=False)
    return out.stdout  # trailing data after the frame makes zstd complain, after writing the frame


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The ELF kernel inside a ``bzImage`` compressed with xz (Debian up to 6.12) or zstd (Linux 7's
    packages), as the kernel's own ``scripts/extract-vmlinux`` finds it; :class:`StockKernelError`
    when there is none."""
    decoders: tuple[tuple[bytes, Callable[[bytes], bytes]], ...] = (
        (XZ_MAGIC, lambda d: lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d)),
        (ZSTD_MAGIC, _unzstd),
    )
    for magic, decode in decoders:
        start = bzimage.find(magic)
        while start != -1:
            try:
                elf = decode(bzimage[start:])
            except lzma.LZMAError:
                elf = b""
            if elf.startswith(b"\x7fELF"):
                return elf
            start = bzimage.find(magic, start + 1)
    raise StockKernelError("no xz- or zstd-compressed ELF kernel in the image")


def _unpack(package: str, version: str, options: list[str], dest: Path, progress: Progress) -> StockKernel:
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    parts = [package, *split_parts(package, run("apt-cache", *options, "depends", f"{package}={version}"))]
    progress(f"[stock kernel] downloading {' '.join(parts)} {version} from Debian")
    apt_unpack([f"{p}={version}" for p in parts], options, tmp)
    usr_modules = tmp / "usr" / "lib" / "modules"
    if usr_modules.is_dir() and not (tmp / "lib" / "modules").exists():  # a merged-/usr package (Debian 13 on)
        (tmp / "lib").mkdir(exist_ok=True)
        usr_modules.rename(tmp / "lib" / "modules")
    releases = [p.name for p in (tmp / "lib" / "modules").iterdir()]
    if len(releases) != 1:
        raise StockKernelError(f"{package}: expected one kernel release in lib/modules, found {releases}")
    release = releases[0]
    progress(f"[stock kernel] {release}: module index, boot image, initramfs")
    run("depmod", "-b", str(tmp), release)
    kernel = StockKernel(package, version, release, tmp)
    # Linux 7's packages keep the image beside the modules, older ones under /boot.
    images = [tmp / "boot" / f"vmlinuz-{release}", tmp / "lib" / "modules" / release / "vmlinuz"]
    image = next((p for p in images if p.is_file()), None)
    if image is None:
        raise StockKernelError(f"{package}: no kernel image at {' or '.join(str(p.relative_to(tmp)) for p in images)}")
    kernel.vmlinux.write_bytes(extract_vmlinux(image.read_bytes()))
    _initramfs(kernel, StockKernel(package, version, release, dest).modules)
    (tmp / "release").write_text(release)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return StockKernel(package, version, release, dest)


def ensure(
    wanted: str | None = None, progress: Progress = lambda msg: print(msg, file=sys.stderr, flush=True)
) -> StockKernel:
    """The stock kernel, unpacked and ready to boot (downloaded and prepared on first use): ``wanted``
    (see :func:`image_package`), else ``DRANET_STOCK_KERNEL``, else this suite's."""
    missing = missing_tools()
    if missing:
        raise StockKernelError(f"missing {', '.join(missing)}: run `make deps`")
    (cache_root() / "stock-kernel").mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "stock-kernel" / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        package, version, options = image_package(os.environ.get(ENV, "").strip() if wanted is None else wanted)
        dest = _cache_dir(package, version)
        marker = dest / "release"
        if not marker.exists():
            return _unpack(package, version, options, dest, progress)
        kernel = StockKernel(package, version, marker.read_text().strip(), dest)
        if _read(dest / INITRAMFS_KEY) != initramfs_key():  # the init changed since: make it again
            _initramfs(kernel, kernel.modules)
        return kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "kernels",
        nargs="*",
        default=[None],
        help=f"image packages or Debian suites (default: ${ENV}, else this suite's)",
    )
    for wanted in parser.parse_args(argv).kernels:
        try:
            kernel = ensure(wanted or None)
        except StockKernelError as exc:
            print(f"stock kernel: {exc}", file=sys.stderr)
            return 1
        print(f"stock kernel: {kernel.release} ({kernel.package} {kernel.version}) in {kernel.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
