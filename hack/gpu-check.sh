#!/usr/bin/env bash
# The example's GPU path and the node commands on a real GPU machine (issue 37).
#
# Run from the repository root on any Linux machine with an NVIDIA GPU and the driver's and the
# example's Python dependencies (torch with CUDA; see docs/gpu-check.md):
#
#     bash hack/gpu-check.sh
#
# It runs, each step under `timeout` and each step's failure not stopping the next:
#   1. a header: the GPU(s) (nvidia-smi -L, nvidia-smi topo -m), the kernel, the NUMA layout, the
#      network and RDMA devices and the PCI functions of GPUs and NICs as this kernel's sysfs shows them;
#   2. `dranet discover` (table and JSON), `dranet topology` (table and JSON) and
#      `dranet templates --gpus 1` against the real /sys;
#   3. the distributed-training benchmark's GPU path: one rank, NCCL, bf16, the seed's model
#      (hidden 8192, 6 layers, 8192 tokens), MFU against the detected GPU's peak (mfu.py's table):
#      synthetic data, then the host DataLoader path (--data host).
#
# Read-only: it changes no link, loads no module, writes only under $OUT (default: a new folder in
# /tmp) and, when a .whl/ folder of wheels is present, /tmp/site. Outputs: header.log, discover.log,
# discover.json, topology.log, templates.log, benchmark.log, summary.txt (7 files).
#
# Environment: OUT (output folder), PYTHON (default python3), STEP_TIMEOUT (seconds per step,
# default 120), BENCH_STEPS / BENCH_WARMUP (timed / untimed steps, default 50 / 10),
# BENCH_HOST=0 to skip the --data host run.

set -u
cd "$(dirname "$0")/.." || exit 2

OUT=${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
BENCH_STEPS=${BENCH_STEPS:-50}
BENCH_WARMUP=${BENCH_WARMUP:-10}
BENCH_HOST=${BENCH_HOST:-1}
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# Wheels carried to a machine that cannot reach a registry (the CEL extension of the default
# --filter, pyroute2): installed into /tmp/site, never into the system's Python.
if compgen -G ".whl/*.whl" >/dev/null; then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; then
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu-check: installing .whl/*.whl failed; going on without them" | tee -a "$SUMMARY"
    fi
fi

# step NAME LOGFILE COMMAND...: runs COMMAND under timeout, its stdout and stderr to the terminal
# and appended to LOGFILE, and records the exit status and the seconds it took in summary.txt.
step() {
    local name=$1 log=$2
    shift 2
    local start end rc ms cmd="$*"
    cmd=${cmd//$'\n'/ }
    {
        echo
        echo "===== $name: $*"
    } | tee -a "$log"
    start=$(date +%s%N)
    timeout --kill-after=10 "$STEP_TIMEOUT" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    end=$(date +%s%N)
    ms=$(((end - start) / 1000000))
    printf '%-30s rc=%-3s %4d.%03ds  %s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) "${cmd:0:100}" |
        tee -a "$SUMMARY"
    echo "===== $name: rc=$rc" | tee -a "$log"
    return 0
}

# The PCI functions of GPUs (class 0x03xx), NICs (0x02xx; 0x0207 InfiniBand) and accelerators
# (0x12xx) with their NUMA node and driver, as the kernel's sysfs shows them: what discover and
# topology read.
pci_functions() {
    local dev class vendor device numa drv
    for dev in /sys/bus/pci/devices/*; do
        [ -e "$dev/class" ] || continue
        class=$(cat "$dev/class")
        case $class in
        0x02* | 0x03* | 0x12*) ;;
        *) continue ;;
        esac
        vendor=$(cat "$dev/vendor" 2>/dev/null)
        device=$(cat "$dev/device" 2>/dev/null)
        numa=$(cat "$dev/numa_node" 2>/dev/null || echo '?')
        drv=$(basename "$(readlink "$dev/driver" 2>/dev/null)" 2>/dev/null)
        echo "$(basename "$dev") class=$class vendor=$vendor device=$device numa_node=$numa driver=${drv:--}" \
            "path=$(readlink -f "$dev")"
    done
}

net_devices() {
    local nic
    for nic in /sys/class/net/*; do
        echo "$(basename "$nic") -> $(readlink "$nic") type=$(cat "$nic/type" 2>/dev/null)" \
            "operstate=$(cat "$nic/operstate" 2>/dev/null) device=$(basename "$(readlink "$nic/device" 2>/dev/null)" 2>/dev/null)"
    done
}

export -f pci_functions net_devices

H="$OUT/header.log"
{
    echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '-') $(git status --porcelain 2>/dev/null | wc -l) changed file(s)"
} | tee "$H"
step "nvidia-smi -L" "$H" nvidia-smi -L
step "nvidia-smi topo -m" "$H" nvidia-smi topo -m
step "nvidia-smi query" "$H" nvidia-smi --query-gpu=name,pci.bus_id,memory.total,driver_version,clocks.max.sm --format=csv
step "uname -a" "$H" uname -a
step "lscpu NUMA" "$H" bash -c 'lscpu | grep -Ei "^(model name|socket|core|thread|cpu\(s\)|numa)"'
step "numa nodes (sysfs)" "$H" bash -c 'for n in /sys/devices/system/node/node*; do echo "$(basename $n): cpus $(cat $n/cpulist)"; done'
step "ls /sys/class/net" "$H" ls -l /sys/class/net
step "net devices" "$H" bash -c net_devices
step "ls /sys/class/infiniband" "$H" ls -l /sys/class/infiniband
step "PCI GPUs and NICs (sysfs)" "$H" bash -c pci_functions
step "python, torch, NCCL" "$H" "$PYTHON" -c 'import sys, torch
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device 0:", torch.cuda.get_device_name(0), "cc", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count,
          "memory GiB", round(p.total_memory / 2**30, 1),
          "pci", getattr(p, "pci_domain_id", None), getattr(p, "pci_bus_id", None), getattr(p, "pci_device_id", None))
    print("nccl", torch.cuda.nccl.version())'

D="$OUT/discover.log"
: >"$D"
step "dranet discover" "$D" "$PYTHON" -m driver discover
step "dranet discover -o json" "$D" bash -c "$PYTHON -m driver discover -o json >'$OUT/discover.json'; rc=\$?; wc -c '$OUT/discover.json'; exit \$rc"
step "dranet discover --filter ''" "$D" "$PYTHON" -m driver discover --filter ''

T="$OUT/topology.log"
: >"$T"
step "dranet topology" "$T" "$PYTHON" -m driver topology
step "dranet topology -o json" "$T" "$PYTHON" -m driver topology -o json

P="$OUT/templates.log"
: >"$P"
step "dranet templates --gpus 1" "$P" "$PYTHON" -m driver templates --gpus 1

B="$OUT/benchmark.log"
: >"$B"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517} RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1
export NCCL_DEBUG=${NCCL_DEBUG:-INFO} NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}
BENCH=(examples/distributed_training/benchmark.py --dtype bf16 --steps "$BENCH_STEPS" --warmup "$BENCH_WARMUP")
step "benchmark GPU (synthetic)" "$B" "$PYTHON" "${BENCH[@]}"
if [ "$BENCH_HOST" != 0 ]; then
    MASTER_PORT=$((MASTER_PORT + 1)) step "benchmark GPU (--data host)" "$B" \
        "$PYTHON" "${BENCH[@]}" --data host --num-workers 4
fi

{
    echo
    grep -h '^MFU_RESULT' "$B" || echo "no MFU_RESULT line"
    echo "outputs: $OUT"
} | tee -a "$SUMMARY"
exit 0
