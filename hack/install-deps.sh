#!/usr/bin/env bash
# Installs everything the driver, the tests and the demo need on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v ip >/dev/null || need="$need iproute2"
  if [ -n "$need" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
  fi
fi
python3 -m pip install -q -e '.[test]'
