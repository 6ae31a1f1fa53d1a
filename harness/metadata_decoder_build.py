"""The upstream device-metadata reader as a test tool: ``harness/metadata_decoder`` (Go, over
k8s.io/dynamic-resource-allocation's ``devicemetadata``), built once through the module proxy and
cached under ``~/.cache/dranet/metadata-decoder/<source hash>/``."""

from __future__ import annotations

import hashlib
from pathlib import Path

from devcluster.builders.binaries import GoBuild, build_go_tool

SRC = Path(__file__).resolve().parent / "metadata_decoder"


def decoder_binary() -> Path:
    """The built ``metadata-decoder`` (raises when Go or the module proxy is unavailable)."""
    gomod, main = (SRC / "go.mod").read_text(), (SRC / "main.go").read_text()
    version = hashlib.sha256((gomod + main).encode()).hexdigest()[:10]
    bin_dir = build_go_tool(
        "metadata-decoder",
        version,
        gomod,
        [GoBuild(packages=(".",), output="metadata-decoder")],
        extra_files={"main.go": main},
    )
    return bin_dir / "metadata-decoder"
