#!/bin/bash
# MPIJob worker entrypoint: save the environment the DRA drivers injected into this container
# (NCCL_IB_HCA, DRANET_*, NVIDIA_*/CUDA_*), then run sshd for the launcher's mpirun.
# Ranks arrive over ssh, and ssh sessions do not inherit the container's environment:
# without this file they would not see the HCAs of this pod's claim. rank.sh reads it.
set -euo pipefail

ENV_FILE="${DRANET_ENV_FILE:-/tmp/dranet-env.sh}"
export -p | grep -E '^declare -x (NCCL_|DRANET_|NVIDIA_|CUDA_|LD_LIBRARY_PATH=|PATH=|PYTHONPATH=)' \
  > "$ENV_FILE" || true
echo "saved $(wc -l < "$ENV_FILE") variables to $ENV_FILE:"
grep -E 'NCCL_IB_HCA|DRANET_' "$ENV_FILE" || echo "  (no NCCL_IB_HCA / DRANET_* injected)"

mkdir -p /run/sshd
exec /usr/sbin/sshd -De
