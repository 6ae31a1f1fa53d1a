"""The driver's image, built from the project's ``Dockerfile`` without a Docker engine.

1. Base image: ``mmdebstrap`` makes a minimal Debian bookworm root filesystem (the ``slim``
   equivalent of the Dockerfile's ``debian:12.12-slim``: minbase, no docs/man/locales) from
   THIS machine's apt sources, then strips those sources again, so the image never carries
   them; ``buildah`` turns the tarball into ``localhost/dranet/debian:bookworm-slim-<hash>``.
2. ``buildah bud --isolation chroot`` builds the Dockerfile with ``DEBIAN_IMAGE`` set to that
   base. The machine's package sources and its pip configuration (index, CA bundle) are handed
   to every ``RUN`` as read-only bind mounts at build time; none of them is written into the
   repository or left in a layer.
3. ``buildah push`` writes a docker archive into ``<cache>/images/``; the tag and file name
   carry the content hash of every build input (Dockerfile, .dockerignore, pyproject.toml,
   README.md, driver/, the base image's key), so a warm run reuses it and any change rebuilds.

buildah's storage lives under ``<cache>/images/buildah`` (not /var/lib/containers).

    python -m devcluster.builders.driver_image     # build (or reuse) and print the archive path
    python -m devcluster.builders.driver_image --oci-layout build/image-oci --tag 0.1.0
                                          # also an OCI image layout to push (`make image`)
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from devcluster.builders.binaries import Progress, _print_progress
from devcluster.builders.images import ImageArchive, ImageError, images_dir

REPO = Path(__file__).resolve().parents[2]
DRIVER_REPO = "localhost/dranet/dranet"
BASE_REPO = "localhost/dranet/debian"
SUITE = "bookworm"
APT_SOURCE_DIRS = (Path("/etc/apt/sources.list.d"),)
APT_SOURCE_FILE = Path("/etc/apt/sources.list")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the build sees the machine's CA bundle: not /etc/ssl/certs, which the image's own
# ca-certificates package writes during the build.
BUILD_CA_PATH = "/run/dranet-build/ca-certificates.crt"
# What debian:*-slim leaves out (its dpkg excludes), so the base is the same shape.
SLIM_EXCLUDES = (
    "/usr/share/man/*",
    "/usr/share/doc/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/groff/*",
    "/usr/share/lintian/*",
    "/usr/share/linda/*",
)
# The Dockerfile's build context (must match .dockerignore's allow-list).
CONTEXT_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")


def buildah_dir() -> Path:
    """buildah's private storage (root and runroot) under the image cache."""
    return images_dir() / "buildah"


def _buildah(
    *args: str, check: bool = True, timeout: float = 3600, progress: Progress | None = None, label: str = "buildah"
) -> subprocess.CompletedProcess[str]:
    base = buildah_dir()
    cmd = [
        "buildah",
        "--root",
        str(base / "root"),
        "--runroot",
        str(base / "run"),
        "--storage-driver",
        "overlay",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-30:])
        raise ImageError(f"{label}: `buildah {' '.join(args[:2])}` failed (rc={out.returncode}):\n{tail}")
    return out


def apt_source_files() -> list[Path]:
    """This machine's apt source files (one-line and deb822)."""
    files = [
        p
        for d in APT_SOURCE_DIRS
        if d.is_dir()
        for p in sorted(d.iterdir())
        if p.suffix in (".list", ".sources") and p.is_file()
    ]
    if APT_SOURCE_FILE.is_file() and APT_SOURCE_FILE.read_text().strip():
        files.append(APT_SOURCE_FILE)
    if not files:
        raise ImageError("no apt sources on this machine (/etc/apt/sources.list[.d]): cannot make the base image")
    return files


def _digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def base_key() -> str:
    """Content hash of what the base image is made from (sources, suite, excludes)."""
    return _digest([SUITE.encode(), "\n".join(SLIM_EXCLUDES).encode(), *(p.read_bytes() for p in apt_source_files())])


def context_key(repo: Path = REPO) -> str:
    """Content hash of the Dockerfile's build context (paths and bytes of every input file)."""
    files = [repo / n for n in CONTEXT_INPUTS]
    files += sorted(
        p for p in (repo / "driver").rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return _digest(str(p.relative_to(repo)).encode() + b"\0" + p.read_bytes() for p in files)


def _image_exists(ref: str) -> bool:
    return _buildah("images", "--quiet", ref, check=False).returncode == 0


def build_base(progress: Progress = _print_progress) -> str:
    """The base image reference, made by mmdebstrap + buildah on first use."""
    ref = f"{BASE_REPO}:{SUITE}-slim-{base_key()}"
    if _image_exists(ref):
        return ref
    if not shutil.which("mmdebstrap"):
        raise ImageError("mmdebstrap not found; run `make deps`")
    t0 = time.monotonic()
    progress(f"[driver image] base: mmdebstrap {SUITE} (minbase, slim) from this machine's apt sources")
    with tempfile.TemporaryDirectory(prefix="dn-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        sources = Path(tmp) / "sources"
        sources.write_text("".join(_one_line_sources(apt_source_files())))
        cmd = [
            "mmdebstrap",
            "--quiet",
            "--variant=minbase",
            "--format=tar",
            "--mode=root",
            *(f"--dpkgopt=path-exclude={x}" for x in SLIM_EXCLUDES),
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            # The image must not carry this machine's sources (handed in again at build time).
            '--customize-hook=rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*',
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
            SUITE,
            str(rootfs),
            str(sources),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if out.returncode != 0:
            raise ImageError(f"mmdebstrap failed (rc={out.returncode}):\n{out.stderr[-3000:]}")
        ctr = _buildah("from", "scratch").stdout.strip()
        try:
            _buildah("add", ctr, str(rootfs), "/")
            _buildah(
                "config",
                "--cmd",
                "/bin/bash",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ctr,
            )
            _buildah("commit", "--quiet", ctr, ref)
        finally:
            _buildah("rm", ctr, check=False)
    progress(f"[driver image] base {ref} in {time.monotonic() - t0:.0f}s")
    return ref


def _one_line_sources(files: Sequence[Path]) -> list[str]:
    """The sources as one-line ``deb`` entries for mmdebstrap (it reads that format on its argument).

    deb822 ``.sources`` stanzas are flattened (Types/URIs/Suites/Components/Signed-By); comment
    lines are dropped.
    """
    lines: list[str] = []
    for f in files:
        text = f.read_text()
        if f.suffix != ".sources":
            lines += [ln + "\n" for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            continue
        for stanza in text.split("\n\n"):
            fields: dict[str, str] = {}
            for ln in stanza.splitlines():
                if ln.lstrip().startswith("#") or ":" not in ln:
                    continue
                k, _, v = ln.partition(":")
                fields[k.strip().lower()] = v.strip()
            if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
                continue
            opts = f" [signed-by={fields['signed-by']}]" if fields.get("signed-by", "").startswith("/") else ""
            for typ in fields.get("types", "deb").split():
                for uri in fields["uris"].split():
                    for suite in fields.get("suites", SUITE).split():
                        lines.append(f"{typ}{opts} {uri} {suite} {fields.get('components', 'main')}\n")
    return lines


def pip_conf_text(env: dict[str, str] | None = None) -> str:
    """A pip.conf with how THIS machine reaches PyPI (``pip config list`` + ``PIP_*`` env).

    Only the keys that say where and how to download (index URLs, trusted hosts, CA bundle,
    timeout); the CA bundle path is the one mounted into the build.
    """
    env = dict(os.environ if env is None else env)
    wanted = ("index-url", "extra-index-url", "trusted-host", "cert", "timeout", "default-timeout", "retries")
    values: dict[str, str] = {}
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        key, _, val = line.partition("=")
        name = key.split(".", 1)[-1]
        if name in wanted:
            values[name] = val.strip().strip("'\"")
    for name in wanted:
        v = env.get("PIP_" + name.upper().replace("-", "_"))
        if v:
            values[name] = v
    if "default-timeout" in values:
        values["timeout"] = values.pop("default-timeout")
    if "cert" in values:
        values["cert"] = BUILD_CA_PATH
    cp = configparser.ConfigParser()
    cp["global"] = values
    with tempfile.TemporaryFile("w+") as f:
        cp.write(f)
        f.seek(0)
        return f.read()


def build_driver_image(progress: Progress = _print_progress, repo: Path = REPO) -> ImageArchive:
    """Build (or reuse) the driver image; returns its cached docker archive.

    Builds take a lock file (concurrent callers wait, then reuse), and afterwards leave one
    archive and one tagged image in the cache: older ones are removed, as are a failed
    build's working containers, and buildah's storage is unmounted.
    """
    key = _digest([base_key().encode(), context_key(repo).encode()])
    ref = f"{DRIVER_REPO}:dev-{key}"
    out = images_dir() / f"dranet-{key}.tar"
    return build_once(ref, out, lambda: _build(ref, out, progress, repo), DRIVER_REPO, "dranet-*.tar")


def build_once(ref: str, out: Path, build: Callable[[], ImageArchive], repo: str, archives: str) -> ImageArchive:
    """The cached archive ``out``, else ``build()`` under the one build lock (buildah's storage is
    shared by every image made here; concurrent callers wait, then reuse), then `tidy`."""
    if out.is_file():
        return ImageArchive(ref, out)
    if not shutil.which("buildah"):
        raise ImageError("buildah not found; run `make deps`")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(images_dir() / ".driver-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():  # another process built it meanwhile
            return ImageArchive(ref, out)
        try:
            return build()
        finally:
            tidy(repo, ref, archives, out)


def tidy(repo: str, keep_ref: str, archives: str, keep_archive: Path) -> None:
    """Drop other images of ``repo`` and other archives matching ``archives``, leftover
    containers, and buildah's mounts."""
    _buildah("rm", "--all", check=False)
    for line in _buildah("images", "--format", "{{.Name}}:{{.Tag}}", check=False).stdout.split():
        if line.startswith(repo + ":") and line != keep_ref:
            _buildah("rmi", line, check=False)
    _buildah("rmi", "--prune", check=False)
    for old in images_dir().glob(archives):
        if old != keep_archive:
            old.unlink(missing_ok=True)
    # containers/storage keeps its overlay home bind-mounted: not needed between builds.
    home = buildah_dir() / "root" / "overlay"
    with contextlib.suppress(OSError):
        if any(line.split()[4] == str(home) for line in Path("/proc/self/mountinfo").read_text().splitlines()):
            subprocess.run(["umount", str(home)], capture_output=True)


def bud(
    dockerfile: Path, context: Path, ref: str, out: Path, progress: Progress, label: str, build_args: dict[str, str]
) -> ImageArchive:
    """``buildah bud`` with this machine's apt sources and pip config mounted into every ``RUN``
    (never into a layer), then the image as a docker archive at ``out``."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dn-bud-") as tmp:
        pip_conf = Path(tmp) / "pip.conf"
        pip_conf.write_text(pip_conf_text())
        sources_dir = Path(tmp) / "sources.list.d"
        sources_dir.mkdir()
        for i, f in enumerate(apt_source_files()):
            shutil.copyfile(f, sources_dir / f"{i:02d}-{f.name}")
        vols = [f"{sources_dir}:/etc/apt/sources.list.d:ro", f"{pip_conf}:/etc/pip.conf:ro"]
        if CA_BUNDLE.is_file():
            vols.append(f"{CA_BUNDLE}:{BUILD_CA_PATH}:ro")
        args = [
            "bud",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--pull=never",
            "--layers",
            "--force-rm",  # also remove the working container of a failed step
        ]
        for k, v in build_args.items():
            args += ["--build-arg", f"{k}={v}"]
        args += ["-t", ref, "-f", str(dockerfile)]
        for v in vols:
            args += ["-v", v]
        _buildah(*args, str(context), label=label)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.unlink(missing_ok=True)
    _buildah("push", "--quiet", ref, f"docker-archive:{tmp_out}:{ref}", label=f"{label} push")
    os.replace(tmp_out, out)
    progress(f"[{label}] built {ref} in {time.monotonic() - t0:.0f}s -> {out}")
    return ImageArchive(ref, out)


def _build(ref: str, out: Path, progress: Progress, repo: Path) -> ImageArchive:
    base = build_base(progress)
    progress(f"[driver image] buildah bud {repo / 'Dockerfile'} -> {ref} (apt + pip inside; a few minutes)")
    return bud(repo / "Dockerfile", repo, ref, out, progress, "driver image", {"DEBIAN_IMAGE": base})


def write_oci_layout(img: ImageArchive, layout: Path, tag: str) -> Path:
    """The built image as an OCI image layout at ``layout`` under ``tag`` (replacing an older
    layout there): what ``skopeo copy oci:<layout>:<tag> docker://<registry>/...`` pushes."""
    if layout.exists():
        shutil.rmtree(layout)
    layout.parent.mkdir(parents=True, exist_ok=True)
    _buildah("pull", "--quiet", f"docker-archive:{img.path}", label="driver image load", check=False)
    _buildah("push", "--quiet", img.ref, f"oci:{layout}:{tag}", label="driver image oci")
    return layout


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: build (or reuse) the driver image and print its reference and archive; with
    ``--oci-layout`` also write it as an OCI image layout."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devcluster.builders.driver_image", description=main.__doc__)
    parser.add_argument("--oci-layout", type=Path, help="also write the image as an OCI image layout here")
    parser.add_argument("--tag", default="dev", help="the tag inside the OCI layout (default: dev)")
    args = parser.parse_args(argv)
    try:
        img = build_driver_image()
        if args.oci_layout:
            layout = write_oci_layout(img, args.oci_layout, args.tag)
            print(
                f"OCI image layout {layout}:{args.tag} (push: skopeo copy oci:{layout}:{args.tag} docker://REGISTRY/REPO:TAG)"
            )
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{img.ref} {img.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
