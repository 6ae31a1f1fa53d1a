"""CRI-O built from its Go module: the second container runtime with NRI (OpenShift's).

Debian bookworm has no ``cri-o`` package, only ``conmon`` (2.1.6, CRI-O's container monitor),
so ``crio`` is built here like containerd: a wrapper module requiring ``github.com/cri-o/cri-o``
through the module proxy (its go.mod has no ``replace`` or ``exclude``, so a plain require
resolves the same versions), cached under ``~/.cache/dranet/crio/<version>/bin``. Next to it,
``pinns`` (CRI-O's small C helper that pins a pod's namespaces) compiled from the module's own
``pinns/src`` with the system C compiler.

Build tags follow CRI-O's Makefile, minus what needs libraries this machine lacks:
``containers_image_openpgp`` (signature checks in Go, no libgpgme), ``seccomp`` (libseccomp from
Debian's ``libseccomp-dev``), ``exclude_graphdriver_btrfs`` and ``exclude_graphdriver_devicemapper``
(no btrfs or device-mapper headers; overlay and vfs remain). cgo is on: containers/storage's
user-namespace helper and libseccomp need it.

    python -m devcluster.builders.crio      # build or reuse; prints the binaries and the build time

The module proxy serves only some CRI-O tags: ``v1.34.0`` (tagged on CRI-O's main branch when
1.34 opened: Kubernetes 1.33 client libraries, CRI v1, NRI v0.9) is the newest one it has.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders.binaries import GoBuild, Progress, _print_progress, build_go_tool, cache_root

CRIO_VERSION = "v1.34.0"
CRIO_MODULE = "github.com/cri-o/cri-o"
CRIO_TAGS = ("containers_image_openpgp", "seccomp", "exclude_graphdriver_btrfs", "exclude_graphdriver_devicemapper")
DEBIAN_PACKAGES = ("libseccomp-dev", "conmon")
"""What the build (libseccomp headers) and a node running CRI-O (conmon) need from Debian."""


class CrioError(RuntimeError):
    """CRI-O cannot be built here; the message says what is missing."""


def crio_gomod(version: str = CRIO_VERSION) -> str:
    """Wrapper go.mod: ``go`` and ``godebug`` lines as CRI-O's own go.mod (1.24)."""
    return (
        "module example.invalid/criobins\n\ngo 1.24.1\n\ngodebug default=go1.24\n\n"
        f"tool {CRIO_MODULE}/cmd/crio\n\nrequire {CRIO_MODULE} {version}\n"
    )


def _go_env() -> dict[str, str]:
    return dict(os.environ, GOTOOLCHAIN="local")


def crio_module_dir(version: str = CRIO_VERSION) -> Path:
    """CRI-O's module source in the module cache (downloaded, and verified, on first use)."""
    with tempfile.TemporaryDirectory(prefix="dn-crio-") as tmp:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{CRIO_MODULE}@{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env=_go_env(),
        )
    info = json.loads(out.stdout or "{}")
    if out.returncode != 0 or info.get("Error") or not info.get("Dir"):
        raise CrioError(f"go mod download {CRIO_MODULE}@{version}: {info.get('Error') or out.stderr.strip()}")
    return Path(info["Dir"])


def build_pinns(bin_dir: Path, version: str = CRIO_VERSION) -> Path:
    """``pinns`` from the module's C sources (``cc -static``: no runtime library to ship)."""
    out = bin_dir / "pinns"
    if out.is_file():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CrioError("no C compiler for pinns; install gcc")
    sources = sorted(str(p) for p in (crio_module_dir(version) / "pinns" / "src").glob("*.c"))
    if not sources:
        raise CrioError(f"no pinns/src/*.c in {CRIO_MODULE}@{version}")
    tmp = out.with_suffix(".tmp")
    subprocess.run([cc, "-O2", "-static", "-o", str(tmp), *sources], check=True, capture_output=True, text=True)
    tmp.rename(out)
    return out


def crio_go_sum(version: str = CRIO_VERSION) -> str:
    """CRI-O's own go.sum (from its module, which the checksum database verifies).

    The wrapper module starts from it because the checksum database reached through the proxy
    does not answer for every module CRI-O pins (pseudo-versions such as containerd/nri's, and
    github.com/CloudNativeAI/model-spec): with CRI-O's recorded hashes, ``go`` checks those
    downloads against them instead of asking the database.
    """
    return (crio_module_dir(version) / "go.sum").read_text()


def build_crio(version: str = CRIO_VERSION, progress: Progress = _print_progress) -> Path:
    """Build (or reuse) ``crio`` and ``pinns``; returns their ``bin`` directory."""
    missing = [p for p in ("/usr/include/seccomp.h",) if not Path(p).is_file()]
    if missing:
        raise CrioError(f"{', '.join(missing)} missing: apt-get install {' '.join(DEBIAN_PACKAGES)}")
    bin_dir = cache_root() / "crio" / version / "bin"
    if (bin_dir / "crio").is_file() and (bin_dir / "pinns").is_file():
        return bin_dir
    bin_dir = build_go_tool(
        "crio",
        version,
        crio_gomod(version),
        [GoBuild(packages=(f"{CRIO_MODULE}/cmd/crio",), output="crio", tags=CRIO_TAGS, cgo=True)],
        expect=("crio",),
        progress=progress,
        extra_files={"go.sum": crio_go_sum(version)},
    )
    build_pinns(bin_dir, version)
    return bin_dir


@dataclass
class CrioPaths:
    """Where one CRI-O instance keeps everything (all under ``base``)."""

    base: Path

    @property
    def socket(self) -> Path:
        """The CRI socket (the kubelet's ``--container-runtime-endpoint``)."""
        return self.base / "crio.sock"

    @property
    def nri_socket(self) -> Path:
        """The NRI socket the driver connects to (``dranet run --nri-socket``)."""
        return self.base / "nri.sock"


def crio_command(bin_dir: Path, paths: CrioPaths, cni_plugin_dir: str = "/usr/lib/cni") -> list[str]:
    """``crio`` for this machine: everything under ``paths.base``, cgroupfs (PID 1 is not systemd),
    vfs storage (no overlay inside overlay), Debian's runc and conmon, NRI on at its own socket."""
    b = paths.base
    conmon = shutil.which("conmon") or "/usr/bin/conmon"
    runc = shutil.which("runc") or "/usr/bin/runc"
    return [
        str(bin_dir / "crio"),
        "--config", str(b / "crio.conf"),
        "--config-dir", str(b / "crio.conf.d"),
        "--root", str(b / "root"),
        "--runroot", str(b / "run"),
        "--listen", str(paths.socket),
        "--conmon", conmon,
        "--cgroup-manager", "cgroupfs",
        "--conmon-cgroup", "pod",
        "--pinns-path", str(bin_dir / "pinns"),
        "--default-runtime", "runc",
        "--runtimes", f"runc:{runc}:{b / 'run' / 'runc'}:oci:",
        "--enable-nri",
        "--nri-listen", str(paths.nri_socket),
        "--cni-config-dir", str(b / "cni"),
        "--cni-plugin-dir", cni_plugin_dir,
        "--storage-driver", "vfs",
        "--log-dir", str(b / "pod-logs"),
        "--version-file", str(b / "version"),
        "--version-file-persist", str(b / "version-persist"),
        "--clean-shutdown-file", str(b / "clean.shutdown"),
        "--container-exits-dir", str(b / "exits"),
        "--container-attach-socket-dir", str(b / "attach"),
        "--namespaces-dir", str(b / "ns"),
        "--signature-policy", str(b / "policy.json"),
        "--cdi-spec-dirs", str(b / "cdi"),
    ]  # fmt: skip


def prepare_dirs(paths: CrioPaths) -> None:
    """The directories and files :func:`crio_command` points at (an empty config: flags say all)."""
    for d in ("root", "run", "cni", "pod-logs", "exits", "attach", "ns", "cdi", "crio.conf.d"):
        (paths.base / d).mkdir(parents=True, exist_ok=True)
    (paths.base / "crio.conf").write_text("[crio]\n")
    # Images are local here (no registry): accept any, as the containerd node does.
    (paths.base / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')


def main() -> int:
    """CLI: build or find CRI-O and print where it is and how long it took."""
    started = time.monotonic()
    try:
        bin_dir = build_crio()
    except (CrioError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    conmon = shutil.which("conmon")
    print(f"crio {bin_dir / 'crio'}\npinns {bin_dir / 'pinns'}\nconmon {conmon or 'missing: apt-get install conmon'}")
    print(f"({time.monotonic() - started:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
