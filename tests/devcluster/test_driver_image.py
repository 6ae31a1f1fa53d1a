"""The driver image built from the Dockerfile without a Docker engine (buildah + mmdebstrap).

Read from its docker archive (what containerd imports): the machine's package sources and pip
configuration, handed to the build as read-only mounts, must not be in any layer; the venv,
Debian's python3 and pyverbs must be. Plus the pure parts: apt sources flattening, the pip
configuration passed to the build, and the cache key following the build inputs.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from devcluster.builders import driver_image

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _layer_members(archive: Path) -> dict[str, int]:
    """path -> size of every file in every layer (later layers win)."""
    members: dict[str, int] = {}
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer)) as inner:
                for m in inner.getmembers():
                    members[m.name.lstrip("./")] = m.size
    return members


@pytest.fixture(scope="module")
def image() -> driver_image.ImageArchive:
    # `make binaries` built it already; otherwise this builds it (a few minutes).
    return driver_image.build_driver_image()


def test_image_has_no_machine_sources_or_pip_config(image: driver_image.ImageArchive) -> None:
    members = _layer_members(image.path)
    names = set(members)
    # No source file at all (the base image's were removed; the machine's were a mount).
    assert not [n for n in names if n.startswith("etc/apt/sources.list.d/") or n == "etc/apt/sources.list"]
    # buildah leaves an empty mount point where a bind-mounted file did not exist: allowed,
    # but never a byte of what was mounted there.
    mounted = {"etc/pip.conf", driver_image.BUILD_CA_PATH.lstrip("/")}
    assert {n: members[n] for n in mounted & names} == dict.fromkeys(mounted & names, 0)
    # What the Dockerfile puts there is there.
    assert "opt/dranet/bin/dranet" in names
    assert "usr/bin/python3.11" in names
    assert any(n.startswith("usr/lib/python3/dist-packages/pyverbs/") for n in names)


def test_oci_layout_to_push(image: driver_image.ImageArchive, tmp_path: Path) -> None:
    """``make image``: the same image as an OCI image layout under the release tag, the layers
    the docker archive has (what a registry push copies)."""
    layout = driver_image.write_oci_layout(image, tmp_path / "image-oci", "0.1.0")
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    manifest = json.loads((layout / "blobs" / Path(*entry["digest"].split(":"))).read_text())
    with tarfile.open(image.path) as outer:
        docker_layers = json.load(outer.extractfile("manifest.json"))[0]["Layers"]  # type: ignore[arg-type]
    assert len(manifest["layers"]) == len(docker_layers) > 0
    for layer in manifest["layers"]:
        assert (layout / "blobs" / Path(*layer["digest"].split(":"))).is_file()


def test_tag_is_the_content_hash(image: driver_image.ImageArchive) -> None:
    key = image.ref.rsplit(":dev-", 1)[1]
    assert image.path.name == f"dranet-{key}.tar"
    assert driver_image._digest([driver_image.base_key().encode(), driver_image.context_key().encode()]) == key


def test_context_key_follows_the_inputs(tmp_path: Path) -> None:
    for name in driver_image.CONTEXT_INPUTS:
        (tmp_path / name).write_text(name)
    (tmp_path / "driver").mkdir()
    (tmp_path / "driver" / "x.py").write_text("a = 1\n")
    first = driver_image.context_key(tmp_path)
    (tmp_path / "driver" / "__pycache__").mkdir()
    (tmp_path / "driver" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert driver_image.context_key(tmp_path) == first, "bytecode is not a build input"
    (tmp_path / "driver" / "x.py").write_text("a = 2\n")
    assert driver_image.context_key(tmp_path) != first


def test_deb822_sources_flattened(tmp_path: Path) -> None:
    f = tmp_path / "debian.sources"
    f.write_text(
        "Types: deb\n# a comment\nURIs: http://deb.example.org/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/k.gpg\n\nTypes: deb\nURIs: http://x\n"
        "Suites: s\nComponents: main\nEnabled: no\n"
    )
    assert driver_image._one_line_sources([f]) == [
        "deb [signed-by=/usr/share/keyrings/k.gpg] http://deb.example.org/debian bookworm main\n",
        "deb [signed-by=/usr/share/keyrings/k.gpg] http://deb.example.org/debian bookworm-updates main\n",
    ]


def test_pip_conf_points_at_the_mounted_ca_bundle() -> None:
    text = driver_image.pip_conf_text({"PIP_INDEX_URL": "https://pypi.example/simple", "PIP_CERT": "/x/ca.pem"})
    assert "index-url = https://pypi.example/simple" in text
    assert f"cert = {driver_image.BUILD_CA_PATH}" in text
