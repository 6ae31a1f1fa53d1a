#!/usr/bin/env python3
"""Package charts/dranet as a Helm OCI artifact in an OCI image layout directory (``make chart-oci``).

``helm package`` makes the chart archive; this script lays it out exactly as ``helm push`` sends it to
a registry (media types ``application/vnd.cncf.helm.config.v1+json`` for the config, the chart's
``Chart.yaml`` metadata as JSON, and ``application/vnd.cncf.helm.chart.content.v1.tar+gzip`` for the
archive), in the OCI image layout (``oci-layout``, ``index.json`` tagged with the chart version,
``blobs/sha256/``). Any OCI tool copies the layout to a registry (``oras cp --from-oci-layout``,
``skopeo copy oci:...``, ``crane``), after which ``helm install oci://<registry>/<repo>/dranet``
works; pushing needs a registry and credentials, so it is not done here.

Usage: hack/chart-oci.py CHART_TGZ OUT_DIR
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
CHART_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


def chart_metadata(tgz: bytes) -> dict[str, Any]:
    """The packaged chart's ``Chart.yaml`` (the first ``*/Chart.yaml`` in the archive)."""
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.name.count("/") == 1 and member.name.endswith("/Chart.yaml"):
                f = tar.extractfile(member)
                if f is not None:
                    data: dict[str, Any] = yaml.safe_load(f.read())
                    return data
    raise SystemExit("no Chart.yaml in the chart archive")


def _blob(out: Path, data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = out / "blobs" / "sha256" / digest.split(":", 1)[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": digest, "size": len(data)}


def write_layout(tgz: bytes, out: Path) -> dict[str, Any]:
    """Write the layout; returns the manifest descriptor (digest, size, tag)."""
    meta = chart_metadata(tgz)
    out.mkdir(parents=True, exist_ok=True)
    config = _blob(out, json.dumps(meta, separators=(",", ":"), sort_keys=True).encode())
    layer = _blob(out, tgz)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, **config},
        "layers": [{"mediaType": CHART_MEDIA_TYPE, **layer}],
        "annotations": {
            "org.opencontainers.image.title": meta["name"],
            "org.opencontainers.image.version": str(meta["version"]),
            "org.opencontainers.image.description": str(meta.get("description", "")),
        },
    }
    desc = _blob(out, json.dumps(manifest, separators=(",", ":")).encode())
    tag = str(meta["version"])
    index = {
        "schemaVersion": 2,
        "manifests": [
            {"mediaType": MANIFEST_MEDIA_TYPE, **desc, "annotations": {"org.opencontainers.image.ref.name": tag}}
        ],
    }
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_text(json.dumps(index, indent=2))
    return {**desc, "tag": tag}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    desc = write_layout(Path(argv[0]).read_bytes(), Path(argv[1]))
    print(f"{argv[1]}: dranet:{desc['tag']} {desc['digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
