"""Registry-free images for the real node: pause and the workload image, as docker archives.

Both are one layer holding Debian's static busybox (``busybox-static``) and a symlink per
applet (``sh``, ``ip``, ``sleep``, ``cat``, ...), written by Python's ``tarfile`` with fixed
timestamps and owners, so the same busybox gives byte-identical archives. They are cached under
``<cache>/images/`` keyed by the content hash of their inputs and imported into containerd's
``k8s.io`` namespace (the one the CRI plugin reads) with ``ctr images import``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders.binaries import cache_root

BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "localhost/dranet/pause:dev"
WORKLOAD_IMAGE = "localhost/dranet/workload:dev"
CONTAINERD_NAMESPACE = "k8s.io"
# A pod sandbox only has to stay alive; SIGKILL ends it (containerd stops sandboxes that way).
PAUSE_CMD = ["/bin/sleep", "2147483647"]
# Exits at once on SIGTERM, so pod deletion does not wait for the grace period.
WORKLOAD_CMD = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"]


class ImageError(RuntimeError):
    """An image could not be built or imported; the message names the step."""


def images_dir() -> Path:
    """Where built image archives are cached (``<cache>/images``)."""
    return cache_root() / "images"


@dataclass(frozen=True)
class ImageArchive:
    """A docker-archive tarball on disk and the reference it carries."""

    ref: str
    path: Path


def _tarinfo(
    name: str, *, size: int = 0, mode: int = 0o755, kind: bytes = tarfile.REGTYPE, linkname: str = ""
) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.type, ti.linkname = size, mode, kind, linkname
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "root", "root"
    return ti


def busybox_applets(busybox: Path = BUSYBOX) -> list[str]:
    """The applet names this busybox binary provides (``busybox --list``)."""
    if not busybox.is_file():
        raise ImageError(f"{busybox} not found; run `make deps` (Debian package busybox-static)")
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    return sorted({a for a in out.split() if a and "/" not in a and a != "busybox"})


def busybox_layer(busybox: Path = BUSYBOX) -> bytes:
    """An uncompressed layer tar: /bin/busybox, one /bin symlink per applet, /tmp, /dev, /proc..."""
    buf = io.BytesIO()
    data = busybox.read_bytes()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run"):
            tar.addfile(_tarinfo(d + "/", mode=0o1777 if d == "tmp" else 0o755, kind=tarfile.DIRTYPE))
        tar.addfile(_tarinfo("bin/busybox", size=len(data)), io.BytesIO(data))
        for applet in busybox_applets(busybox):
            tar.addfile(_tarinfo(f"bin/{applet}", kind=tarfile.SYMTYPE, linkname="busybox", mode=0o777))
        passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        tar.addfile(_tarinfo("etc/passwd", size=len(passwd), mode=0o644), io.BytesIO(passwd))
    return buf.getvalue()


def docker_archive(layer: bytes, ref: str, cmd: Sequence[str], out: Path) -> ImageArchive:
    """Write a one-layer docker-archive (``manifest.json`` + config + ``layer.tar``) to ``out``."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": list(cmd), "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "devcluster.builders.images"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:") :] + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]).encode()
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, payload in ((config_name, config_bytes), (layer_name, layer), ("manifest.json", manifest)):
            tar.addfile(_tarinfo(name, size=len(payload), mode=0o644), io.BytesIO(payload))
    os.replace(tmp, out)
    return ImageArchive(ref, out)


def busybox_image(ref: str, cmd: Sequence[str], busybox: Path = BUSYBOX) -> ImageArchive:
    """Build (or reuse from the cache) a busybox image named ``ref`` running ``cmd``."""
    layer = busybox_layer(busybox)
    key = hashlib.sha256(layer + json.dumps([ref, list(cmd)]).encode()).hexdigest()[:16]
    safe = ref.rsplit("/", 1)[-1].replace(":", "-")
    out = images_dir() / f"{safe}-{key}.tar"
    if out.is_file():
        return ImageArchive(ref, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return docker_archive(layer, ref, cmd, out)


def pause_image() -> ImageArchive:
    """The pod sandbox image containerd is configured with (``pinned_images.sandbox``)."""
    return busybox_image(PAUSE_IMAGE, PAUSE_CMD)


def workload_image() -> ImageArchive:
    """``localhost/dranet/workload:dev``: a shell, ``ip`` and friends, idles until SIGTERM."""
    return busybox_image(WORKLOAD_IMAGE, WORKLOAD_CMD)


def import_image(ctr: Path, address: str, archive: ImageArchive) -> None:
    """``ctr -n k8s.io images import`` the archive into the containerd at ``address``."""
    out = subprocess.run(
        [str(ctr), "--address", address, "-n", CONTAINERD_NAMESPACE, "images", "import", str(archive.path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise ImageError(f"importing {archive.ref} from {archive.path} failed: {out.stderr.strip()[-500:]}")


def tag_image(ctr: Path, address: str, source: str, target: str) -> str:
    """``ctr -n k8s.io images tag --force``: a second name for an image already imported."""
    out = subprocess.run(
        [str(ctr), "--address", address, "-n", CONTAINERD_NAMESPACE, "images", "tag", "--force", source, target],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise ImageError(f"ctr images tag {source} {target}: {out.stderr.strip()}")
    return target


def image_list(ctr: Path, address: str) -> list[str]:
    """Every image name in containerd's ``k8s.io`` namespace (empty if containerd does not answer)."""
    out = subprocess.run(
        [str(ctr), "--address", address, "-n", CONTAINERD_NAMESPACE, "images", "ls", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.split() if out.returncode == 0 else []


def image_present(ctr: Path, address: str, ref: str) -> bool:
    """True if containerd's ``k8s.io`` namespace has an image named ``ref``."""
    return ref in image_list(ctr, address)


def main() -> int:
    """CLI: build (or reuse) the pause and workload images; print their archives."""
    for img in (pause_image(), workload_image()):
        print(f"{img.ref} {img.path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
