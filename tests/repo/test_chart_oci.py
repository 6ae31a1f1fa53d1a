"""``make chart-oci``'s layout read back by helm itself: served read-only as an OCI registry on
127.0.0.1 (the distribution API's GET paths, straight from the layout's index and blobs), then
``helm pull oci://...`` and ``helm template oci://...``, exactly what a user runs after the push."""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.hack_scripts import load

ROOT = Path(__file__).resolve().parents[2]
chart_oci = load("chart-oci.py", "chart_oci")


def layout_registry(layout: Path, repo: str) -> ThreadingHTTPServer:
    """A read-only OCI distribution registry serving ``layout`` as repository ``repo``."""
    index = json.loads((layout / "index.json").read_text())
    tags = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in index["manifests"]}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/v2/":
                return self._send(200, b"{}", {"Content-Type": "application/json"})
            prefix = f"/v2/{repo}/"
            if not path.startswith(prefix):
                return self._send(404)
            kind, _, ref = path[len(prefix) :].partition("/")
            if kind == "manifests":
                desc = tags.get(ref) or next((m for m in tags.values() if m["digest"] == ref), None)
                if desc is None:
                    return self._send(404)
                body = (layout / "blobs" / "sha256" / desc["digest"].split(":")[1]).read_bytes()
                return self._send(
                    200, body, {"Content-Type": desc["mediaType"], "Docker-Content-Digest": desc["digest"]}
                )
            if kind == "blobs":
                blob = layout / "blobs" / "sha256" / ref.split(":", 1)[-1]
                if not blob.is_file():
                    return self._send(404)
                return self._send(200, blob.read_bytes(), {"Docker-Content-Digest": ref})
            if kind == "tags":
                return self._send(200, json.dumps({"name": repo, "tags": sorted(tags)}).encode())
            return self._send(404)

        do_HEAD = do_GET  # noqa: N815 - http.server's naming

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def layout(helm: str, tmp_path: Path) -> Iterator[Path]:
    subprocess.run(
        [helm, "package", str(ROOT / "charts" / "dranet"), "-d", str(tmp_path)], check=True, capture_output=True
    )
    (tgz,) = tmp_path.glob("dranet-*.tgz")
    out = tmp_path / "oci"
    chart_oci.write_layout(tgz.read_bytes(), out)
    yield out


def test_layout_is_valid_oci(layout: Path) -> None:
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    (desc,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest_bytes = (layout / "blobs/sha256" / desc["digest"].split(":")[1]).read_bytes()
    assert (
        "sha256:" + hashlib.sha256(manifest_bytes).hexdigest() == desc["digest"] and len(manifest_bytes) == desc["size"]
    )
    manifest = json.loads(manifest_bytes)
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert [layer["mediaType"] for layer in manifest["layers"]] == [
        "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    ]
    for blob in (manifest["config"], *manifest["layers"]):
        data = (layout / "blobs/sha256" / blob["digest"].split(":")[1]).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"] and len(data) == blob["size"]
    config = json.loads((layout / "blobs/sha256" / manifest["config"]["digest"].split(":")[1]).read_bytes())
    assert config["name"] == "dranet" and desc["annotations"]["org.opencontainers.image.ref.name"] == config["version"]


def test_helm_pulls_and_renders_the_layout_from_a_registry(helm: str, layout: Path, tmp_path: Path) -> None:
    server = layout_registry(layout, "charts/dranet")
    try:
        host, port = server.server_address[:2]
        version = json.loads((layout / "index.json").read_text())["manifests"][0]["annotations"][
            "org.opencontainers.image.ref.name"
        ]
        ref = f"oci://{host}:{port}/charts/dranet"
        (tmp_path / "pulled").mkdir()
        pulled = subprocess.run(
            [helm, "pull", ref, "--version", version, "--plain-http", "-d", str(tmp_path / "pulled")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert pulled.returncode == 0, pulled.stderr
        rendered = subprocess.run(
            [helm, "template", "dranet", ref, "--version", version, "--plain-http", "--kube-version", "1.34.0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert rendered.returncode == 0, rendered.stderr
        assert "kind: DaemonSet" in rendered.stdout
    finally:
        server.shutdown()
    (tgz,) = (tmp_path / "pulled").glob("dranet-*.tgz")
    manifest = json.loads(
        (
            layout / "blobs/sha256" / json.loads((layout / "index.json").read_text())["manifests"][0]["digest"][7:]
        ).read_bytes()
    )
    assert "sha256:" + hashlib.sha256(tgz.read_bytes()).hexdigest() == manifest["layers"][0]["digest"]
