"""Find or build the `helm` binary the chart tests use.

No release downloads on these machines: helm v3's go.mod has no replace directives, so the
ordinary `go install helm.sh/helm/v3/cmd/helm@<version>` through the module proxy builds it.
The binary is cached outside the work tree (~/.cache/dranet/helm/<version>/helm) and never
committed. An existing `helm` v3 on PATH (or $HELM) is used as is.

    python -m devcluster.builders.helm            # prints the path (builds on first use, ~3-6 min)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HELM_VERSION = "v3.22.0"  # latest v3.x on the Go module proxy (Nov 2026); pinned for reproducibility
HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
# Kubernetes minor of the client-go that helm version links (its Makefile derives it from go.mod);
# without it `helm template` assumes Kubernetes v1.20 and `lint` checks deprecations for 1.20.
HELM_K8S_MINOR = {"v3.22.0": "37"}


def cache_dir(version: str = HELM_VERSION) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "dranet" / "helm" / version


def _is_helm3(path: str) -> bool:
    try:
        out = subprocess.run([path, "version", "--short"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip().startswith("v3.")


def existing() -> str | None:
    """A usable helm v3 without building: $HELM, the cache, then PATH."""
    candidates = [os.environ.get("HELM"), str(cache_dir() / "helm"), shutil.which("helm")]
    for path in candidates:
        if path and os.access(path, os.X_OK) and _is_helm3(path):
            return path
    return None


def build(version: str = HELM_VERSION) -> str:
    """Build helm `version` with the local Go toolchain into the cache; returns the binary path."""
    go = shutil.which("go")
    if not go:
        raise RuntimeError("no helm v3 on PATH and no `go` to build it (set $HELM)")
    dest = cache_dir(version)
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0", GOBIN=str(dest))
    # Version ldflags so `helm version` reports the real tag (otherwise "v3.x+unreleased").
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
    minor = HELM_K8S_MINOR.get(version)
    if minor:
        for pkg in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
            ldflags += f" -X {pkg}.k8sVersionMajor=1 -X {pkg}.k8sVersionMinor={minor}"
    subprocess.run([go, "install", "-trimpath", f"-ldflags={ldflags}", f"{HELM_MODULE}@{version}"], check=True, env=env)
    return str(dest / "helm")


def ensure() -> str:
    """Path of a helm v3 binary, building it on first use."""
    return existing() or build()


if __name__ == "__main__":
    print(ensure())
    sys.exit(0)
