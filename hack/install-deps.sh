#!/usr/bin/env bash
# Installs everything the driver, the tests and the demo need on a fresh machine.
# Go (>= 1.24) must be present: it builds the upstream Kubernetes components, helm and the
# containerd/nri test harness from the Go module proxy (devcluster/binaries.py caches them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v ip >/dev/null || need="$need iproute2"
  # The Dockerfile test compares its apt pins with what Debian serves: it needs a package index.
  if [ -n "$need" ] || [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ]; then
    apt-get update -qq
  fi
  if [ -n "$need" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
  fi
fi
python3 -m pip install -q --root-user-action=ignore -e '.[test,example]'
