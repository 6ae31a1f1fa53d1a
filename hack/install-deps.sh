#!/usr/bin/env bash
# Installs everything the driver, the tests and the demo need on a fresh machine.
# Go (>= 1.24) must be present: it builds the upstream Kubernetes components, helm and the
# containerd/nri test harness from the Go module proxy (devcluster/builders/binaries.py caches them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  need=""
  command -v ip >/dev/null || need="$need iproute2"
  # The real node (devcluster up): runc and the CNI plugins run pods; busybox-static makes the
  # workload and pause images, and its udhcpd is the DHCP server of the interface.dhcp tests
  # (tests/support/dhcp_server.py); buildah + mmdebstrap build the driver's image from the
  # Dockerfile without a Docker engine (the base image is made by mmdebstrap from this
  # machine's own apt sources); util-linux gives nsenter/unshare. A CRI-O node (devcluster/builders/crio.py):
  # libseccomp-dev to build CRI-O, conmon to run its containers, skopeo to load its images.
  for pkg in runc containernetworking-plugins busybox-static buildah mmdebstrap uidmap libseccomp-dev conmon skopeo; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need="$need $pkg"
  done
  # The stock-kernel tier (tests/kernels, devcluster/builders/stock_kernel.py): QEMU boots Debian's
  # own kernel over this machine's root (kmod's depmod indexes its modules, cpio packs the
  # initramfs, zstd unpacks Linux 7's image); rdma-core, the verbs providers (rxe), pyverbs,
  # perftest and the rdma_cm tools are what the guest's RDMA tests run, and Open MPI (with UCX) and
  # Debian's mpi4py the allreduce between two pods. Without their recommends (QEMU's would add a GUI
  # and firmware).
  lean=""
  for pkg in qemu-system-x86 kmod cpio zstd rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest python3-pyverbs openmpi-bin python3-mpi4py; do
    dpkg -s "$pkg" >/dev/null 2>&1 || lean="$lean $pkg"
  done
  # The Dockerfile test compares its apt pins with what Debian serves: it needs a package index.
  # One progress line per step; apt's own output goes to a log shown only on failure.
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  if [ -n "$need$lean" ] || [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ]; then
    echo "[apt] updating the package index"
    apt-get update -qq >"$log" 2>&1 || { cat "$log"; exit 1; }
  fi
  if [ -n "$need" ]; then
    echo "[apt] installing$need"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >"$log" 2>&1 || { cat "$log"; exit 1; }
  fi
  if [ -n "$lean" ]; then
    echo "[apt] installing$lean"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $lean >"$log" 2>&1 \
      || { cat "$log"; exit 1; }
  fi
fi
# Not the [example] extra: torch pulls ~5 GB of CUDA wheels and only the GPU benchmark needs it
# (tests that need torch are marked `torch` and deselected by `make test`).
echo "[pip] the project and its test dependencies"
python3 -m pip install -q --root-user-action=ignore -e '.[test]'
