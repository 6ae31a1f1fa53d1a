"""Build (or reuse) upstream Go binaries the tests and the demo run: etcd and the Kubernetes
control plane, plus a generic `build_go_tool` other harnesses reuse (containerd, NRI, helm).

Binaries live under ``~/.cache/dranet/<tool>/<version>/bin`` (never in the work tree). Builds use
a small wrapper Go module (see docs in /work/shared/reference/real-cluster.md §1, §2.3) with the
default GOMODCACHE/GOCACHE so a rebuild after a cache wipe of ``bin/`` is warm.

Usage: ``python -m devcluster.builders.binaries --all``
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.builders import versions

log = logging.getLogger(__name__)

ETCD_VERSION = "v3.6.16"  # latest etcd 3.6.x
# The release this process runs (DRANET_K8S_VERSION, default the newest; devcluster/builders/versions.py).
K8S_RELEASE = versions.selected()
K8S_VERSION = K8S_RELEASE.version
K8S_MINOR = K8S_RELEASE.minor
K8S_COMPONENTS = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
# The real node's binaries, built from the same wrapper module in the same `go build` (shared
# packages compile once; one cache entry per Kubernetes version).
K8S_NODE_COMPONENTS = ("kubelet", "kubectl")
K8S_ALL = K8S_COMPONENTS + K8S_NODE_COMPONENTS

Progress = Callable[[str], None]


def cache_root() -> Path:
    """Root of every built artifact: ``$DRANET_CACHE_DIR`` or ``~/.cache/dranet``."""
    return Path(os.environ.get("DRANET_CACHE_DIR", Path.home() / ".cache" / "dranet"))


def tool_bin_dir(name: str, version: str) -> Path:
    """Where `build_go_tool(name, version, ...)` puts its binaries."""
    return cache_root() / name / version / "bin"


def _print_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class GoBuild:
    """One ``go build`` invocation inside the wrapper module.

    ``packages`` are built together into ``bin/`` (named after the last path element) unless
    ``output`` renames a single package's binary (etcd's main package is called ``server``).
    """

    packages: tuple[str, ...]
    output: str | None = None
    tags: tuple[str, ...] = ()
    ldflags: str = "-s -w"
    cgo: bool = False


@dataclass
class _Watch:
    """What go is currently doing, fed from ``go build -v`` stderr (one package per line)."""

    last: str = ""
    count: int = 0
    lines: list[str] = field(default_factory=list)


def _run_go(
    args: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    label: str,
    progress: Progress,
    started: float,
    interval: float = 30.0,
) -> None:
    """Run go, echoing a progress line every ``interval`` s; raise with the tail of output."""
    proc = subprocess.Popen(
        list(args), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watch = _Watch()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            watch.last, watch.count = line, watch.count + 1
            watch.lines.append(line)
            del watch.lines[:-40]

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    next_report = time.monotonic() + interval
    while proc.poll() is None:
        time.sleep(0.5)
        if time.monotonic() >= next_report:
            next_report += interval
            progress(
                f"[{label}] {time.monotonic() - started:6.0f}s elapsed, "
                f"{watch.count} packages done, now: {watch.last[:100]}"
            )
    t.join(timeout=5)
    if proc.returncode != 0:
        tail = "\n".join(watch.lines[-25:])
        raise RuntimeError(f"{label}: {' '.join(args[:3])} failed (rc={proc.returncode}):\n{tail}")


def build_go_tool(
    name: str,
    version: str,
    gomod_text: str,
    builds: Iterable[GoBuild] | Sequence[str],
    *,
    expect: Sequence[str] = (),
    progress: Progress = _print_progress,
    extra_env: Mapping[str, str] | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> Path:
    """Build Go binaries from a wrapper module via the module proxy; cached and reused.

    ``builds`` is a list of `GoBuild` (or plain package paths, built CGO_ENABLED=0). ``expect``
    names the binaries that must exist afterwards (default: last element of every package, or
    the ``output`` name). Returns the ``bin`` directory. Concurrent callers serialize on a lock
    file; the build goes into ``bin.tmp`` and is renamed, so a killed build never looks done.
    """
    spec = [b if isinstance(b, GoBuild) else GoBuild(packages=(b,)) for b in builds]
    if not expect:
        expect = [b.output or p.rsplit("/", 1)[-1] for b in spec for p in (b.packages[:1] if b.output else b.packages)]
    base = cache_root() / name / version
    bin_dir = base / "bin"
    if all((bin_dir / e).is_file() for e in expect):
        return bin_dir
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((bin_dir / e).is_file() for e in expect):  # another process built it meanwhile
            return bin_dir
        src = base / "src"
        src.mkdir(exist_ok=True)
        (src / "go.mod").write_text(gomod_text)
        for rel, text in (extra_files or {}).items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        tmp = base / "bin.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        env = dict(os.environ)
        # GOTOOLCHAIN=local: a dependency bump must never trigger a toolchain download.
        env.update({"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"})
        env.update(extra_env or {})
        started = time.monotonic()
        label = f"{name} {version}"
        progress(f"[{label}] building in {src} (go mod tidy, then go build; first build is slow)")
        _run_go(["go", "mod", "tidy"], src, env, label, progress, started)
        for b in spec:
            benv = dict(env, CGO_ENABLED="1" if b.cgo else "0")
            out = str(tmp / b.output) if b.output else str(tmp) + "/"
            args = ["go", "build", "-v", "-trimpath", "-o", out]
            if b.tags:
                args += ["-tags", ",".join(b.tags)]
            args += ["-ldflags", b.ldflags, *b.packages]
            _run_go(args, src, benv, label, progress, started)
        missing = [e for e in expect if not (tmp / e).is_file()]
        if missing:
            raise RuntimeError(f"{label}: build finished but {missing} missing in {tmp}")
        shutil.rmtree(bin_dir, ignore_errors=True)
        tmp.rename(bin_dir)
        elapsed = time.monotonic() - started
        (base / "build-seconds").write_text(f"{elapsed:.1f}\n")
        progress(f"[{label}] built {', '.join(expect)} in {elapsed:.0f}s -> {bin_dir}")
        return bin_dir


def k8s_gomod(release: versions.K8sRelease = K8S_RELEASE) -> str:
    """Wrapper go.mod for the Kubernetes binaries (real-cluster.md §1.4): upstream's go and
    godebug lines, and every staging module pinned to the release's staging tag."""
    replaces = "\n".join(f"\tk8s.io/{m} => k8s.io/{m} {release.staging_version}" for m in release.staging)
    tools = "\n".join(f"\tk8s.io/kubernetes/cmd/{c}" for c in K8S_ALL)
    return (
        f"module example.invalid/k8sbins\n\ngo {release.go_line}\n\n"
        f"// upstream's own GODEBUG defaults, not those of our newer toolchain\n"
        f"godebug default={release.godebug}\n\ntool (\n{tools}\n)\n\n"
        f"require k8s.io/kubernetes {release.version}\n\nreplace (\n{replaces}\n)\n"
    )


def k8s_ldflags(version: str = K8S_VERSION) -> str:
    """Version ldflags as upstream's hack/lib/version.sh sets them (so --version is real)."""
    major, minor = version[1:].split(".")[:2]
    parts = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        parts += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(parts)


def etcd_gomod(version: str = ETCD_VERSION) -> str:
    """Wrapper go.mod for etcd (its own module so MVS doesn't touch k8s' dependency versions)."""
    return (
        f"module example.invalid/etcdbin\n\ngo 1.24.0\n\n"
        f"tool go.etcd.io/etcd/server/v3\n\nrequire go.etcd.io/etcd/server/v3 {version}\n"
    )


def build_k8s(release: versions.K8sRelease = K8S_RELEASE, progress: Progress = _print_progress) -> Path:
    """Build (or reuse cached) the control plane binaries plus kubelet and kubectl."""
    b = GoBuild(
        packages=tuple(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_ALL),
        tags=("selinux", "notest", "grpcnotrace"),
        ldflags=k8s_ldflags(release.version),
    )
    return build_go_tool("k8s", release.version, k8s_gomod(release), [b], expect=K8S_ALL, progress=progress)


def build_etcd(version: str = ETCD_VERSION, progress: Progress = _print_progress) -> Path:
    """Build (or reuse cached) etcd 3.6 (binary name ``etcd``, not ``server``)."""
    ld = f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={version}"
    b = GoBuild(packages=("go.etcd.io/etcd/server/v3",), output="etcd", ldflags=ld)
    return build_go_tool("etcd", version, etcd_gomod(version), [b], expect=("etcd",), progress=progress)


def _version_ok(binary: Path, minor: str) -> bool:
    """True if ``binary --version`` reports the wanted minor (e.g. "1.34" or etcd "3.6")."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(rf"\bv?{re.escape(minor)}\.\d+", out.stdout + out.stderr) is not None


@dataclass(frozen=True)
class ControlPlaneBinaries:
    """Paths of the four binaries the control plane runs."""

    etcd: Path
    kube_apiserver: Path
    kube_scheduler: Path
    kube_controller_manager: Path


def _candidate_dirs() -> list[Path]:
    dirs = [os.environ.get("DRANET_K8S_BIN_DIR"), os.environ.get("KUBEBUILDER_ASSETS")]
    out = [Path(d) for d in dirs if d]
    out += [tool_bin_dir("k8s", K8S_VERSION), tool_bin_dir("etcd", ETCD_VERSION)]
    return out


def find_binary(name: str, minor: str) -> Path | None:
    """An existing binary: env dirs, then the cache, then PATH; version-checked."""
    for d in _candidate_dirs():
        p = d / name
        if p.is_file() and os.access(p, os.X_OK) and _version_ok(p, minor):
            return p
    w = shutil.which(name)
    if w and _version_ok(Path(w), minor):
        return Path(w)
    return None


def find_control_plane() -> ControlPlaneBinaries | None:
    """The control plane binaries if all are present already (never builds)."""
    found = {n: find_binary(n, K8S_MINOR) for n in K8S_COMPONENTS}
    found["etcd"] = find_binary("etcd", "3.6") or find_binary("etcd", "3.5")
    if any(v is None for v in found.values()):
        return None
    return ControlPlaneBinaries(
        etcd=found["etcd"],
        kube_apiserver=found["kube-apiserver"],
        kube_scheduler=found["kube-scheduler"],
        kube_controller_manager=found["kube-controller-manager"],
    )


def ensure_control_plane(progress: Progress = _print_progress) -> ControlPlaneBinaries:
    """Find or build all four binaries."""
    found = find_control_plane()
    if found:
        return found
    etcd = find_binary("etcd", "3.6") or build_etcd(progress=progress) / "etcd"
    kdir = None
    names = {}
    for n in K8S_COMPONENTS:
        p = find_binary(n, K8S_MINOR)
        if p is None:
            kdir = kdir or build_k8s(progress=progress)
            p = kdir / n
        names[n] = p
    return ControlPlaneBinaries(
        etcd=etcd,
        kube_apiserver=names["kube-apiserver"],
        kube_scheduler=names["kube-scheduler"],
        kube_controller_manager=names["kube-controller-manager"],
    )


def go_available() -> bool:
    """True if a Go toolchain is on PATH (needed to build anything)."""
    return shutil.which("go") is not None


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``--all`` (control plane), ``--etcd``, ``--k8s``; prints the resulting paths."""
    ap = argparse.ArgumentParser(prog="python -m devcluster.builders.binaries", description=__doc__)
    ap.add_argument("--all", action="store_true", help="etcd + kube-apiserver/scheduler/controller-manager")
    ap.add_argument("--etcd", action="store_true")
    ap.add_argument("--k8s", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    if a.all:
        b = ensure_control_plane()
        for k, v in vars(b).items():
            print(f"{k}: {v}")
    else:
        if a.etcd:
            print(build_etcd())
        if a.k8s:
            print(build_k8s())
    print(f"binaries ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
