"""DDP MFU benchmark: a dense bf16 model trained data-parallel, one ``MFU_RESULT`` line at the end.

GPU mode (the MPIJob): one process per GPU, launched by ``mpirun`` through ``rank.sh``; NCCL.
Each rank binds itself to its GPU's NUMA node before the process group starts, tells NCCL the
exact HCAs of the pod's claim, and (``--data host``) feeds batches from a DataLoader whose
workers are re-pinned to the same node.

CPU mode (CI): ``python benchmark.py --cpu --nprocs 2 --hidden 64 --layers 2 --batch-tokens 64``
spawns the ranks itself and uses gloo; the MFU is against ``PEAK_TFLOPS`` or a nominal CPU peak.
Without a visible GPU the benchmark switches to CPU mode by itself and says so (an MPIJob on
CPU-only nodes runs unchanged): gloo, fp32 (gloo on CPU reduces no bf16 in PyTorch 1.13), and a
CPU-sized model unless ``--hidden``/``--layers``/``--batch-tokens`` are given; gloo then sends over
the claim's NICs (``GLOO_SOCKET_IFNAME`` from the driver's ``DRANET_INTERFACES``).

The model is ``L`` x (``Linear(H, H, bias=False)`` + GELU); each rank pushes ``B`` token rows
per step (``--batch-tokens``), so FLOPs per step per GPU = 6*B*H^2*L (see ``mfu.py``). The
defaults (B = H = 8192, L = 6) are the seed's size: 1.979e13 FLOPs per step, which at the
seed's 55.496 ms per step is its 356.62 TFLOP/s per H100.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - PyTorch's own idiom

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # mfu.py, placement.py beside us

import device_metadata
import mfu
import placement

log = logging.getLogger("benchmark")


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the job, from torchrun or Open MPI variables."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RankEnv:
        """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, falling back to ``OMPI_COMM_WORLD_*``."""

        def pick(*names: str, default: str = "0") -> int:
            for name in names:
                if env.get(name):
                    return int(env[name])
            return int(default)

        return cls(
            rank=pick("RANK", "OMPI_COMM_WORLD_RANK"),
            world_size=pick("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", default="1"),
            local_rank=pick("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=None, help="H: model width (8192; 128 on CPU)")
    p.add_argument("--layers", type=int, default=None, help="L: number of Linear(H, H) layers (6; 2 on CPU)")
    p.add_argument("--batch-tokens", type=int, default=None, help="B: token rows per rank per step (8192; 256 on CPU)")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument(
        "--data",
        choices=["synthetic", "host"],
        default="synthetic",
        help="synthetic: one resident batch; host: a DataLoader on CPU (input pipeline matters)",
    )
    p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers (--data host)")
    p.add_argument(
        "--host-work",
        type=int,
        default=2,
        help="per-batch CPU passes in the DataLoader (--data host): how heavy the input pipeline is",
    )
    p.add_argument("--numa-bind", choices=["auto", "off"], default="auto")
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument(
        "--device-bus-id",
        default="",
        help="PCI bus ID whose NUMA node the rank binds to, instead of its GPU's "
        "(CPU mode has no GPU; also for GPUs whose bus ID torch does not report)",
    )
    p.add_argument("--cpu", action="store_true", help="gloo on CPU (CI), no GPU needed")
    p.add_argument("--nprocs", type=int, default=0, help="CPU mode: spawn this many local ranks")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="bf16 (fp32 on CPU)")
    return p.parse_args(argv)


# The seed's model on GPUs; on a CPU the same shape a few hundred times smaller, so a CI run of
# 8 ranks on 2 cores takes seconds per 100 steps.
GPU_SIZE = {"hidden": 8192, "layers": 6, "batch_tokens": 8192}
CPU_SIZE = {"hidden": 128, "layers": 2, "batch_tokens": 256}


def resolve_mode(args: argparse.Namespace, gpu_visible: bool) -> list[str]:
    """Fill in device, dtype and model size; returns what was chosen for the user (to print)."""
    notes = []
    if not args.cpu and not gpu_visible:
        args.cpu = True
        notes.append("no GPU visible (torch.cuda.is_available() is False): running on the CPU, gloo backend")
    size = CPU_SIZE if args.cpu else GPU_SIZE
    defaulted = [k for k in size if getattr(args, k) is None]
    for k in defaulted:
        setattr(args, k, size[k])
    if args.cpu and defaulted:
        notes.append(
            f"CPU-sized model: hidden={args.hidden} layers={args.layers} batch_tokens={args.batch_tokens} "
            f"(the GPU default is hidden={GPU_SIZE['hidden']} layers={GPU_SIZE['layers']} "
            f"batch_tokens={GPU_SIZE['batch_tokens']})"
        )
    if args.dtype is None:
        args.dtype = "fp32" if args.cpu else "bf16"
        if args.cpu:
            notes.append("dtype fp32: gloo on CPU does not reduce bf16 tensors in every PyTorch")
    return notes


def local_world_size(env: Mapping[str, str], default: int = 1) -> int:
    """How many ranks share this host (Open MPI's or torchrun's variable)."""
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return default


class HostBatches(torch.utils.data.IterableDataset):
    """Iterable dataset of random ``[B, H]`` batches built on the CPU, with tunable CPU work.

    Stands in for decoding/augmentation (seed 001): the heavier ``host_work``, the more the
    workers' NUMA placement shows in the step time.
    """

    def __init__(self, batch_tokens: int, hidden: int, host_work: int, seed: int) -> None:
        super().__init__()
        self.batch_tokens, self.hidden, self.host_work, self.seed = batch_tokens, hidden, host_work, seed

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        gen = torch.Generator().manual_seed(self.seed + (info.id if info else 0))
        while True:
            x = torch.randn(self.batch_tokens, self.hidden, generator=gen)
            for _ in range(self.host_work):
                x = torch.tanh(x * 1.01)  # memory-bound CPU passes, like a decode/augment chain
            yield x


def _pci_bus_id(index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    domain, bus, dev = (getattr(props, n, None) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if None in (domain, bus, dev):
        return None
    return f"{domain:04x}:{bus:02x}:{dev:02x}.0"


def run_rank(args: argparse.Namespace, rank_env: RankEnv) -> str | None:
    """Train on this rank; returns the ``MFU_RESULT`` line on rank 0 (None elsewhere)."""
    if args.cpu:
        device, backend, device_name, bus_id = torch.device("cpu"), "gloo", "cpu", None
    else:
        torch.cuda.set_device(rank_env.local_rank)
        device, backend = torch.device("cuda", rank_env.local_rank), "nccl"
        device_name = torch.cuda.get_device_name(rank_env.local_rank)
        bus_id = _pci_bus_id(rank_env.local_rank)

    # Fail before training, not after it, when no peak is known for this device.
    peak, peak_source = mfu.peak_tflops_for(device_name)

    # Bind before the process group and the model exist, so their threads and memory start local.
    # The pod's NICs from the DRA device metadata files (none: the driver's DRANET_* variables).
    nics = device_metadata.read_nics()
    binding = placement.Binding(None, (), "-", "disabled (--numa-bind off)")
    if args.numa_bind == "auto":
        binding = placement.bind_rank(
            args.device_bus_id or bus_id, args.sysfs_root, device_metadata.common_numa_node(nics)
        )
    hca, hca_source = placement.nccl_ib_hca(os.environ, nics)
    if hca and backend == "nccl":
        os.environ["NCCL_IB_HCA"] = hca
    paired = device_metadata.nic_for_gpu(nics, bus_id)
    if paired is not None:
        nic = f"{paired.interface} ({paired.rdma_device}, path {paired.gpu_path})"
        log.info("GPU %s pairs with NIC %s in the device metadata", bus_id, nic)
    gloo_if, gloo_source = placement.gloo_socket_ifname(os.environ, nics)
    if gloo_if and backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = gloo_if  # read when the process group is made
    if args.cpu:
        # Ranks sharing a host share its cores: one intra-op thread pool each, not one per core.
        cores = len(binding.cpus) or len(os.sched_getaffinity(0))
        torch.set_num_threads(max(1, cores // local_world_size(os.environ, args.nprocs or 1)))
    log.info(
        "rank %d/%d local %d device %s bus %s: numa %s (%s, memory %s, %d CPUs); NCCL_IB_HCA=%s (%s); "
        "gloo interfaces %s (%s)",
        rank_env.rank,
        rank_env.world_size,
        rank_env.local_rank,
        device_name,
        bus_id,
        binding.summary,
        binding.reason,
        binding.memory,
        len(binding.cpus),
        hca or "-",
        hca_source,
        gloo_if or "-",
        gloo_source,
    )

    dist.init_process_group(backend=backend, rank=rank_env.rank, world_size=rank_env.world_size)
    # NCCL barriers name this rank's GPU (PyTorch 2.x warns when they guess it from the context).
    barrier_kw: dict[str, Any] = {} if args.cpu else {"device_ids": [rank_env.local_rank]}
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden, bias=False), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device=device, dtype=dtype)
    ddp = DDP(model, device_ids=None if args.cpu else [rank_env.local_rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    batches: Iterator[Any]
    if args.data == "host":
        loader = torch.utils.data.DataLoader(
            HostBatches(args.batch_tokens, args.hidden, args.host_work, seed=rank_env.rank),
            batch_size=None,
            num_workers=args.num_workers,
            pin_memory=not args.cpu,
            worker_init_fn=placement.RepinWorker(binding.cpus),
            persistent_workers=args.num_workers > 0,
            prefetch_factor=2 if args.num_workers > 0 else None,
        )
        host_iter = iter(loader)
        batches = (b.to(device=device, dtype=dtype, non_blocking=True) for b in host_iter)
    else:
        resident = torch.randn(args.batch_tokens, args.hidden, device=device, dtype=dtype)
        batches = iter(lambda: resident, None)

    def step() -> None:
        x = next(batches)
        loss = ddp(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if not args.cpu:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    dist.barrier(**barrier_kw)
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    # NCCL reduces device tensors only; gloo host tensors.
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    # The slowest rank sets the pace of a synchronous data-parallel job.
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    line = None
    if rank_env.rank == 0:
        line = mfu.compute_result(
            world_size=rank_env.world_size,
            backend=backend,
            device=device_name,
            dtype=args.dtype,
            hidden=args.hidden,
            layers=args.layers,
            tokens_per_step=args.batch_tokens,
            steps=args.steps,
            total_seconds=float(elapsed.item()),
            peak_tflops=peak,
            peak_source=peak_source,
            numa_bind=binding.summary,
            nccl_ib_hca=hca or "",
        ).to_line()
    # Every rank is past the last collective before any tears the group down, and DDP (whose
    # reducer holds the group) goes first: without both, a gloo rank of PyTorch 1.13 hung at exit
    # in the process group's destructor about every other run of 8 ranks on 2 cores.
    dist.barrier(**barrier_kw)
    # (Rebinding clears the cells step() closes over, so the reducer really goes.)
    ddp = opt = model = batches = None  # type: ignore[assignment]
    dist.destroy_process_group()
    return line


def _print_notes(notes: list[str], rank: int) -> None:
    if rank == 0:
        for note in notes:
            print(f"benchmark: {note}", flush=True)


def _spawned(local_rank: int, args: argparse.Namespace, world_size: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    _configure_logging()
    line = run_rank(args, RankEnv(local_rank, world_size, local_rank))
    if line:
        print(line, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def main(argv: list[str] | None = None) -> int:
    """Entry point: spawn local CPU ranks (``--nprocs``) or run as one rank of a launched job."""
    args = parse_args(argv)
    _configure_logging()
    notes = resolve_mode(args, torch.cuda.is_available())
    if args.nprocs:
        if not args.cpu:
            raise SystemExit("--nprocs spawns local ranks for CPU mode only; use mpirun/torchrun on GPUs")
        import torch.multiprocessing as mp

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        _print_notes(notes, 0)
        mp.spawn(_spawned, args=(args, args.nprocs), nprocs=args.nprocs, join=True)
        return 0
    rank_env = RankEnv.from_env(os.environ)
    _print_notes(notes, rank_env.rank)
    line = run_rank(args, rank_env)
    if line:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
