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

# RDMA check: where every worker's containers were given RDMA devices that the verbs library can
# open (DRANET_RDMA_DEVICES, saved by worker.sh, each in /sys/class/infiniband, and the
# /dev/infiniband char devices), an MPI allreduce over those devices only (UCX verbs, no TCP) shows
# they carry traffic and which transport did; NCCL then picks them by NCCL_IB_HCA.
ENV_FILE="${DRANET_ENV_FILE:-/tmp/dranet-env.sh}"
rdma_on_every_worker() {
  local host
  for host in "${HOSTS[@]}"; do
    ssh -o StrictHostKeyChecking=no "$host" ". $ENV_FILE 2>/dev/null; test -n \"\${DRANET_RDMA_DEVICES:-}\" &&
      for d in \${DRANET_RDMA_DEVICES//,/ }; do test -e /sys/class/infiniband/\$d || exit 1; done &&
      ls /dev/infiniband/uverbs* >/dev/null 2>&1" || return 1
  done
}
if rdma_on_every_worker; then
  echo "RDMA check: every worker has RDMA devices; an MPI allreduce over them, UCX verbs transports only"
  if ! mpirun --allow-run-as-root -np "${#HOSTS[@]}" --hostfile "$HOSTFILE" --map-by ppr:1:node --bind-to none \
      --mca oob_tcp_if_include eth0 -x UCX_LOG_LEVEL=info \
      /bin/bash /scripts/rank.sh python3 /scripts/rdma_allreduce.py 2>&1 | grep -E '^rank |tag\(' | sed 's/^/  /'; then
    echo "RDMA check: the allreduce over the claimed RDMA devices failed; the benchmark runs anyway"
  fi
else
  echo "RDMA check: no usable RDMA device in every worker (DRANET_RDMA_DEVICES unset, not in /sys/class/infiniband, or no /dev/infiniband/uverbs*): the benchmark's traffic goes over TCP on the claimed NICs (gloo), or NCCL's own choice on GPUs"
fi

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
