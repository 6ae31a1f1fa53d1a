"""Resident memory (VmRSS) of an idle ``dranet run`` against the stub apiserver.

The daemon runs with a fixture sysfs root (``--devices N`` PCI NICs, default 8; 0 = empty
root), publishes its slices, and is then left idle; VmRSS and VmHWM are sampled from
/proc/<pid>/status over a few seconds.

    python -m bench.bench_memory [--devices 8] [--idle 5]

Goal (issue 2): <= 80 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import stop_processes, write_nic_sysfs  # noqa: E402 - after the sys.path setup above
from tests.support.kubelet_client import KubeletClient, wait_for_socket  # noqa: E402 - after the sys.path setup above

GOAL_MB = 80.0


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


async def measure(devices: int, idle: float, work: Path, nri: bool) -> dict[str, float]:
    (work / "sys").mkdir()
    if devices:
        write_nic_sysfs(work / "sys", devices)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        api = subprocess.Popen(
            [sys.executable, "-m", "tests.support.fake_apiserver", "--kubeconfig", str(work / "kubeconfig")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        procs.append(api)
        assert api.stdout is not None and api.stdout.readline().startswith(b"ready")
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "driver",
                "--log-level",
                "warning",
                "run",
                "--node-name",
                "mem-node",
                *(["--nri-socket", str(work / "no-runtime/nri.sock")] if nri else ["--no-nri"]),
                "--kubeconfig",
                str(work / "kubeconfig"),
                "--sysfs-root",
                str(work / "sys"),
                "--kubelet-root",
                str(work / "kubelet"),
                "--state-dir",
                str(work / "state"),
                "--runtime-dir",
                str(work / "run"),
                "--bind-address",
                "127.0.0.1:0",
                "--publish-interval",
                "0.5",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(daemon)
        reg = str(work / "kubelet/plugins_registry/dra.net-reg.sock")
        started = time.monotonic()
        await wait_for_socket(reg, 30)
        async with KubeletClient(reg) as kubelet:
            await kubelet.wait_serving()
            await kubelet.register()  # the kubelet's registration, as on a real node
        startup = time.monotonic() - started
        samples = []
        end = time.monotonic() + idle
        while time.monotonic() < end:
            samples.append(status_kb(daemon.pid, "VmRSS") / 1024)
            await asyncio.sleep(0.25)
        return {
            "rss_median": statistics.median(samples),
            "rss_max": max(samples),
            "hwm": status_kb(daemon.pid, "VmHWM") / 1024,
            "startup": startup,
        }
    finally:
        stop_processes(procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument(
        "--nri",
        action="store_true",
        help="NRI enabled (pointed at a socket nobody serves: the plugin keeps reconnecting)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dranet-bm-"))
    try:
        r = asyncio.run(measure(args.devices, args.idle, work, args.nri))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mode = "NRI on (no runtime)" if args.nri else "--no-nri"
    print(f"idle dranet run {mode}, {args.devices} fixture devices, sampled {args.idle:.0f}s:")
    print(
        f"  VmRSS median {r['rss_median']:.1f} MB  max {r['rss_max']:.1f} MB  VmHWM {r['hwm']:.1f} MB"
        f"  goal <= {GOAL_MB:.0f} MB  ratio {r['rss_max'] / GOAL_MB:.2f}"
    )
    print(f"  start to first GetInfo answered: {r['startup'] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
