"""An MPI allreduce over the claim's RDMA NICs only: what the launcher runs before the benchmark
when every worker has RDMA devices, to show that they carry traffic and which transport does.

Run by mpirun, one rank per worker (through rank.sh, which restores the container's environment).
Each rank reads the RDMA devices its container was given (``DRANET_RDMA_DEVICES``, set by the
dra.net driver) and, before MPI starts, tells Open MPI to use UCX (``pml ucx``, no TCP BTL) and UCX
to use those devices through its verbs transports only (``rc_verbs``, ``ud_verbs``: no ``tcp``, so
nothing falls back silently to the pod network). Soft-RoCE (rxe) devices made in the pods need
UCX's UD destination-GID check off (docs/workloads.md); a hardware NIC keeps it. With
``UCX_LOG_LEVEL=info`` UCX prints the lanes it chose (``tag(rc_verbs/mlx5_0:1)``).

Each rank prints ``rank R/N on HOST: sum S, 4 MiB allreduce T ms over DEVICES``; a wrong sum fails.
Needs mpi4py (Debian's python3-mpi4py, or ``pip install mpi4py`` against the image's MPI).
"""

from __future__ import annotations

import argparse
import array
import os
import socket
import time

SYSFS = "/sys"


def soft_devices(devices: list[str], sysfs: str = SYSFS) -> list[str]:
    """The devices of ``devices`` made in software (rxe, siw): no PCI function under them."""
    return [d for d in devices if "/virtual/" in os.path.realpath(f"{sysfs}/class/infiniband/{d}")]


def ucx_environment(devices: list[str], sysfs: str = SYSFS) -> dict[str, str]:
    """Open MPI's and UCX's variables that keep the ranks' traffic on ``devices``' verbs transports."""
    env = {
        "OMPI_MCA_pml": "ucx",
        "OMPI_MCA_btl": "self",
        "OMPI_MCA_osc": "^ucx",
        # Open MPI 4.1's pml ucx takes only the device types it knows unless told otherwise.
        "OMPI_MCA_pml_ucx_tls": "any",
        "OMPI_MCA_pml_ucx_devices": "any",
        "UCX_TLS": "rc_verbs,ud_verbs,self",
        "UCX_NET_DEVICES": ",".join(f"{d}:1" for d in devices),
    }
    if soft_devices(devices, sysfs):
        env["UCX_UD_VERBS_ETH_DGID_CHECK"] = "n"
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floats", type=int, default=1 << 20, help="float32 values per rank (default 4 MiB)")
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    devices = [d for d in os.environ.get("DRANET_RDMA_DEVICES", "").split(",") if d]
    if not devices:
        raise SystemExit(f"{socket.gethostname()}: no DRANET_RDMA_DEVICES: this container got no RDMA device")
    os.environ.update(ucx_environment(devices))  # read by MPI_Init, which importing mpi4py runs
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mine, total = array.array("f", [comm.rank + 1.0]) * a.floats, array.array("f", [0.0]) * a.floats
    comm.Allreduce([mine, MPI.FLOAT], [total, MPI.FLOAT])  # connections made outside the timing
    start = time.monotonic()
    for _ in range(a.rounds):
        comm.Allreduce([mine, MPI.FLOAT], [total, MPI.FLOAT])
    took = (time.monotonic() - start) / a.rounds
    want = comm.size * (comm.size + 1) / 2
    if total[0] != want or total[-1] != want:
        raise SystemExit(f"rank {comm.rank}: allreduce gave {total[0]}, {total[-1]}, not {want}")
    print(
        f"rank {comm.rank}/{comm.size} on {socket.gethostname()}: sum {total[0]},"
        f" {a.floats * 4 / (1 << 20):.0f} MiB allreduce {took * 1000:.0f} ms over {','.join(devices)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
