"""The Go driver (kubernetes-sigs/dranet, the reference implementation), built from a source the user
points at and run as a real daemon beside this one (for ``bench.bench_vs_go``).

No Go source is in this repository. ``DRANET_GO_SOURCE`` names one of:

- a checkout (a directory with ``go.mod``): copied as it is (uncommitted changes included), or
- a git directory without a work tree (a bare clone, a fetched snapshot such as
  ``/work/.mirror/kubernetes-sigs+dranet/repo``, or a checkout's ``.git``): its ``HEAD`` exported
  with ``git archive HEAD | tar -x``.

The binary is built with upstream's own command (``CGO_ENABLED=0 go build -o dranet ./cmd/dranet``,
``GOTOOLCHAIN=local``, ``GOFLAGS=-mod=mod``) into ``<cache_root()>/dranet-go/<key>/bin/dranet``,
outside the work tree; the key is the source's commit (plus a content hash when a checkout has
changes; a content hash alone for a tree without git) and the Go version, so a new commit or
toolchain never reuses a stale binary.

:class:`GoDriver` runs it the way a node runs it, with every path private: its kubelet root
(``--kubelet-root-dir``: registration and DRA sockets), its database (``--db-path``, on tmpfs
like the deployment's ``/var/run/dranet``), its node name (``--hostname-override``), its filter,
no cloud metadata (``--cloud-provider-hint=NONE``: nothing leaves the machine). The Go driver has
no flag for the NRI socket (``/var/run/nri/nri.sock`` is compiled in), so it gets the NRI
runtime's private socket pre-connected: the containerd/nri stub takes a connected socket's fd
from ``NRI_PLUGIN_SOCKET``, as for plugins the runtime launches itself.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.builders.binaries import cache_root
from devcluster.cluster.controlplane import free_port
from harness.driver_process import log_tail, read_log, stop_group
from harness.kubelet_client import KubeletClient

SOURCE_ENV = "DRANET_GO_SOURCE"
TOOL = "dranet-go"
DRIVER_NAME = "dra.net"


class SourceError(Exception):
    """The Go source is not given, or is not something the Go driver can be built from."""


def missing_source_message() -> str:
    """What to set when no source is given."""
    return (
        f"bench_vs_go needs the Go driver's source (kubernetes-sigs/dranet); none is in this repository.\n"
        f"Set {SOURCE_ENV} to a checkout (a directory with go.mod), e.g.\n"
        f"  git clone https://github.com/kubernetes-sigs/dranet /tmp/dranet && {SOURCE_ENV}=/tmp/dranet\n"
        f"or to a git directory without a work tree (a bare clone or fetched snapshot; its HEAD is built), e.g.\n"
        f"  {SOURCE_ENV}=/work/.mirror/kubernetes-sigs+dranet/repo\n"
        f"(or pass --go-source PATH). The binary is built once into {cache_root() / TOOL}/<commit>/."
    )


@dataclass(frozen=True)
class GoSource:
    """Where the Go driver's source is and what identifies it."""

    path: Path
    kind: str  # "tree" (a directory with go.mod) or "git-dir" (a repository without a work tree)
    commit: str  # HEAD's commit, "" when the tree is not in git
    digest: str = ""  # content hash of a tree with changes (or without git), "" otherwise

    @property
    def key(self) -> str:
        return cache_key(self.commit, self.digest, go_version())

    def describe(self) -> str:
        what = f"commit {self.commit[:12]}" if self.commit else "no git"
        if self.digest:
            what += f", content {self.digest[:12]}" + (" (uncommitted changes)" if self.commit else "")
        return f"{self.path} ({self.kind}, {what})"


def cache_key(commit: str, digest: str, go: str) -> str:
    """The cache directory's name: the commit, a content hash when there is no commit or the tree
    differs from it, and the Go version (a new toolchain builds a new binary)."""
    go = "".join(c if c.isalnum() or c in ".-" else "_" for c in go) or "go"
    if commit and not digest:
        return f"{commit[:12]}-{go}"
    if commit:
        return f"{commit[:12]}-dirty-{digest[:12]}-{go}"
    if digest:
        return f"tree-{digest[:12]}-{go}"
    raise ValueError("a source needs a commit or a content digest")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    # safe.directory: a snapshot or checkout owned by another user is still only read.
    return subprocess.run(["git", "-c", "safe.directory=*", *args], capture_output=True, text=True)


def tree_digest(root: Path) -> str:
    """sha256 over every file's path and bytes below ``root`` (``.git`` left out), in path order."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def locate(value: str | None) -> GoSource:
    """The source ``value`` names (a checkout or a git directory); :class:`SourceError` if none."""
    if not value:
        raise SourceError(missing_source_message())
    path = Path(value).expanduser().resolve()
    if not path.is_dir():
        raise SourceError(f"{SOURCE_ENV}={value}: no such directory.\n\n{missing_source_message()}")
    if (path / "go.mod").is_file():
        head = _git("-C", str(path), "rev-parse", "HEAD")
        commit = head.stdout.strip() if head.returncode == 0 else ""
        dirty = commit and _git("-C", str(path), "status", "--porcelain").stdout.strip()
        digest = tree_digest(path) if (not commit or dirty) else ""
        return GoSource(path, "tree", commit, digest)
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        head = _git("--git-dir", str(path), "rev-parse", "HEAD")
        if head.returncode != 0:
            raise SourceError(f"{SOURCE_ENV}={value}: a git directory without a HEAD commit: {head.stderr.strip()}")
        if _git("--git-dir", str(path), "cat-file", "-e", "HEAD:cmd/dranet").returncode != 0:
            raise SourceError(f"{SOURCE_ENV}={value}: HEAD has no cmd/dranet (not kubernetes-sigs/dranet?)")
        return GoSource(path, "git-dir", head.stdout.strip())
    raise SourceError(
        f"{SOURCE_ENV}={value}: neither a checkout (no go.mod) nor a git directory (no HEAD and objects/).\n\n"
        + missing_source_message()
    )


_GO_VERSION: list[str] = []


def go_version() -> str:
    """``go env GOVERSION`` (the local toolchain: builds run with GOTOOLCHAIN=local)."""
    if not _GO_VERSION:
        out = subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, env=dict(os.environ, GOTOOLCHAIN="local")
        )
        if out.returncode != 0:
            raise RuntimeError(f"go is needed to build the Go driver: {out.stderr.strip()}")
        _GO_VERSION.append(out.stdout.strip())
    return _GO_VERSION[0]


def missing_blobs(git_dir: Path) -> list[str]:
    """Paths of HEAD whose file content the repository lacks (a snapshot may leave its largest
    files out); submodules are not files and are not listed."""
    listing = _git("--git-dir", str(git_dir), "ls-tree", "-r", "-z", "HEAD")
    entries = []  # (object, path) of every blob
    for item in listing.stdout.split("\0"):
        meta, _, path = item.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            entries.append((parts[2], path))
    check = subprocess.run(
        ["git", "-c", "safe.directory=*", "--git-dir", str(git_dir), "cat-file", "--batch-check"],
        input="".join(f"{obj}\n" for obj, _ in entries),
        capture_output=True,
        text=True,
    )
    absent = {line.split()[0] for line in check.stdout.splitlines() if line.endswith(" missing")}
    return [path for obj, path in entries if obj in absent]


def _export(source: GoSource, dest: Path, progress: Callable[[str], None] = print) -> None:
    """The source's files into ``dest`` (a git directory's HEAD, or the checkout as it is)."""
    if source.kind == "git-dir":
        dest.mkdir(parents=True)
        missing = missing_blobs(source.path)
        needed = [p for p in missing if p in ("go.mod", "go.sum") or p.startswith(("cmd/", "pkg/", "internal/"))]
        needed += [p for p in missing if p.startswith("third_party/")]
        if needed:
            raise RuntimeError(f"{source.path} lacks files the build needs: {', '.join(needed[:10])}")
        if missing:
            progress(f"[dranet-go] left out, absent from {source.path}: {', '.join(missing)}")
        # git still names an excluded absent file on stderr ("invalid object"): kept for a failure only.
        with tempfile.TemporaryFile() as errors:
            archive = subprocess.Popen(
                ["git", "-c", "safe.directory=*", "--git-dir", str(source.path), "archive", "HEAD", "--", "."]
                + [f":(exclude,literal){p}" for p in missing],
                stdout=subprocess.PIPE,
                stderr=errors,
            )
            untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True)
            assert archive.stdout is not None
            archive.stdout.close()
            if archive.wait() != 0 or untar.returncode != 0:
                errors.seek(0)
                why = errors.read().decode(errors="replace") + untar.stderr.decode(errors="replace")
                raise RuntimeError(f"git archive HEAD of {source.path} failed: {why[-800:]}")
    else:
        shutil.copytree(source.path, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))


def build(source: GoSource, progress: Callable[[str], None] = print) -> Path:
    """The Go driver's binary for ``source``: cached, or built (upstream's ``go build ./cmd/dranet``)."""
    base = cache_root() / TOOL / source.key
    binary = base / "bin" / "dranet"
    if binary.is_file():
        return binary
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent runs build once
        if binary.is_file():
            return binary
        src, tmp = base / "src", base / "bin.tmp"
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _export(source, src, progress)
        tmp.mkdir()
        env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod", CGO_ENABLED="0")
        started = time.monotonic()
        progress(f"[dranet-go] building {source.describe()} with {go_version()} in {src} (first build: minutes)")
        log_path = base / "build.log"
        with open(log_path, "w") as log:
            rc = subprocess.run(
                ["go", "build", "-o", str(tmp / "dranet"), "./cmd/dranet"],
                cwd=src,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            ).returncode
        if rc != 0 or not (tmp / "dranet").is_file():
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
            raise RuntimeError(f"go build ./cmd/dranet failed (rc={rc}), log {log_path}:\n{tail}")
        (base / "source").write_text(f"{source.describe()}\n{go_version()}\n")
        tmp.rename(base / "bin")
        progress(f"[dranet-go] built in {time.monotonic() - started:.0f}s -> {binary}")
        return binary


def go_filter(prefix: str) -> str:
    """The Go driver's ``--filter`` (CEL over ``attributes``) publishing only interfaces named ``prefix*``."""
    key = '"dra.net/ifName"'
    return f'{key} in attributes && attributes[{key}].StringValue.startsWith("{prefix}")'


@dataclass
class GoDriver:
    """The Go driver as a daemon: private kubelet root, database, NRI connection and metrics port."""

    binary: Path
    kubeconfig: Path
    node_name: str
    workdir: Path  # short (unix socket paths are limited to 108 bytes)
    runtime_dir: Path  # tmpfs: its database, as /var/run/dranet on a node
    nri_socket: str
    filter: str
    verbosity: int = 0  # klog --v (its install.yaml runs --v=4)
    popen: subprocess.Popen[bytes] | None = None
    port: int = 0
    dra_socket: str = ""
    nri_fd: int = field(default=-1, repr=False)

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def registration_socket(self) -> str:
        return str(self.kubelet_root / "plugins_registry" / f"{DRIVER_NAME}-reg.sock")

    @property
    def db_path(self) -> Path:
        return self.runtime_dir / "dranet.db"

    @property
    def log_path(self) -> Path:
        return self.workdir / "driver.log"

    def command(self) -> list[str]:
        """Its command line (``--bind-address`` once :attr:`port` is chosen)."""
        return [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--hostname-override={self.node_name}",
            f"--bind-address=127.0.0.1:{self.port}",
            f"--kubelet-root-dir={self.kubelet_root}",
            f"--db-path={self.db_path}",
            f"--filter={self.filter}",
            "--cloud-provider-hint=NONE",
            "--profile-provider=none",
            f"--v={self.verbosity}",
        ]

    def environment(self) -> dict[str, str]:
        """Its environment: the pre-connected NRI socket's fd, a private TMPDIR (its PCI database copy)."""
        return dict(os.environ, NRI_PLUGIN_SOCKET=str(self.nri_fd), TMPDIR=str(self.workdir / "tmp"))

    def start(self, timeout: float = 60.0) -> GoDriver:
        """Start it, register it as the kubelet's plugin watcher does, wait for /healthz."""
        for d in (self.kubelet_root / "plugins_registry", self.workdir / "tmp", self.runtime_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        nri = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            nri.connect(self.nri_socket)
            self.nri_fd = nri.fileno()
            with open(self.log_path, "ab") as out:
                self.popen = subprocess.Popen(
                    self.command(),
                    env=self.environment(),
                    pass_fds=(self.nri_fd,),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        finally:
            nri.close()  # the child holds its copy: the runtime sees EOF when the driver goes
        deadline = time.monotonic() + timeout
        try:
            self._wait(lambda: os.path.exists(self.registration_socket), deadline, "its registration socket")
            self.dra_socket = asyncio.run(self._register(deadline - time.monotonic()))
            self._wait(self._healthy, deadline, "/healthz")
        except BaseException:
            self.stop()
            raise
        return self

    async def _register(self, timeout: float) -> str:
        async with KubeletClient(self.registration_socket, None, timeout=max(1.0, timeout)) as kubelet:
            await kubelet.wait_serving(timeout=max(1.0, timeout))
            info = await kubelet.register()
            return str(info.endpoint)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _wait(self, predicate: Callable[[], bool], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"the Go driver exited with {self.popen.returncode}:\n{self.log_tail()}")
            if predicate():
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Go driver: no {what} in time:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM to its process group (it waits for pods in their NRI grace period), SIGKILL after ``timeout``."""
        p, self.popen = self.popen, None
        return stop_group(p, signal.SIGTERM, timeout)

    def log(self) -> str:
        """Everything it logged so far."""
        return read_log(self.log_path)

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)
