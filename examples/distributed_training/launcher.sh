#!/bin/bash
# MPIJob launcher: wait until every worker's sshd answers, then start one rank per GPU with mpirun.
# Arguments are passed to benchmark.py (e.g. --steps 100 --data host).
set -euo pipefail

SLOTS="${SLOTS_PER_WORKER:-4}"
HOSTFILE="${HOSTFILE:-/etc/mpi/hostfile}"
mapfile -t HOSTS < <(awk 'NF {print $1}' "$HOSTFILE")
NP=$(( ${#HOSTS[@]} * SLOTS ))
# Rank 0 runs on the first worker; torch.distributed rendezvous there.
MASTER_ADDR="${HOSTS[0]}"

# WaitForWorkersReady starts us once the worker pods are Ready, but sshd may still be coming up.
for host in "${HOSTS[@]}"; do
  until ssh -o ConnectTimeout=5 -o StrictHostKeyChecking=no "$host" true 2>/dev/null; do
    echo "waiting for $host"; sleep 2
  done
done

# Optional variables are forwarded only when set (mpirun -x of an unset name is an error).
FORWARD=()
for name in PEAK_TFLOPS NCCL_DEBUG NCCL_DEBUG_SUBSYS; do
  if [[ -n "${!name:-}" ]]; then FORWARD+=(-x "$name"); fi
done

echo "launching $NP ranks on ${#HOSTS[@]} workers (${SLOTS} per worker), master $MASTER_ADDR"
# --bind-to none: each rank binds itself to its own GPU's NUMA node (benchmark.py); mpirun's
# --bind-to numa would bind by rank order without knowing which GPU a rank drives.
# MPI and NCCL bootstrap stay on the pod network (eth0); the RDMA NICs carry NCCL data only.
exec mpirun --allow-run-as-root \
  -np "$NP" --hostfile "$HOSTFILE" --map-by "ppr:${SLOTS}:node" --bind-to none \
  --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
  -x MASTER_ADDR="$MASTER_ADDR" -x MASTER_PORT="${MASTER_PORT:-29500}" \
  -x NCCL_SOCKET_IFNAME=eth0 "${FORWARD[@]}" \
  /bin/bash /scripts/rank.sh python3 /scripts/benchmark.py "$@"
