"""Resident memory (VmRSS) of an idle ``dranet run`` against the stub apiserver.

The daemon runs with a fixture sysfs root (``--devices N`` PCI NICs, default 8; 0 = empty
root; a comma-separated list runs each), publishes its slices, and is then left idle; VmRSS and
VmHWM (the peak) are sampled from /proc/<pid>/status over a few seconds, and the anonymous and
file-backed parts from /proc/<pid>/smaps_rollup.

``--heap``: a second run of each size under tracemalloc (:mod:`bench.heap_probe`) tells what the
Python heap holds once idle, by package and by line.

    python -m bench.bench_memory [--devices 8] [--idle 5] [--heap]

Goals: <= 80 MB idle at 1k devices; <= 150 MiB peak at 10k devices.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from driver.kube.client import KubeClient  # noqa: E402 - after the sys.path setup above
from harness import stop_processes, write_nic_sysfs  # noqa: E402 - after the sys.path setup above
from harness.kubelet_client import KubeletClient, wait_for_socket  # noqa: E402 - after the sys.path setup above

GOAL_MB = 80.0


def status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rollup_kb(pid: int) -> dict[str, int]:
    """``Rss``, ``Anonymous`` and file-backed (``Rss`` - ``Anonymous``) kB of /proc/<pid>/smaps_rollup."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in ("Rss", "Anonymous"):
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def package_of(filename: str) -> str:
    """A traced file's package: ``driver/<sub>``, a site-packages top-level name, or ``stdlib``."""
    if "/driver/" in filename:
        rest = filename.split("/driver/", 1)[1]
        return "driver/" + rest.split("/")[0].removesuffix(".py")
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/")[0].removesuffix(".py")
    if filename.startswith("<frozen"):
        return "imports (frozen importlib)"
    return "stdlib"


def heap_table(report: dict[str, Any]) -> str:
    """The Python heap by package and the biggest lines (tracemalloc, idle daemon)."""
    pkgs: dict[str, int] = {}
    for fname, size, _count in report["files"]:
        pkgs[package_of(fname)] = pkgs.get(package_of(fname), 0) + size
    lines = [
        f"  Python heap traced: {report['traced'] / 2**20:.1f} MiB (peak {report['traced_peak'] / 2**20:.1f} MiB;"
        f" tracemalloc's own {report['tracemalloc_overhead'] / 2**20:.1f} MiB not included)"
    ]
    for pkg, size in sorted(pkgs.items(), key=lambda x: -x[1])[:12]:
        lines.append(f"    {size / 2**20:6.2f} MiB  {pkg}")
    mods = report.get("modules", {})
    lines.append(
        f"  modules loaded: {sum(mods.values())}, by package: "
        + ", ".join(f"{k} {v}" for k, v in list(mods.items())[:14])
    )
    lines.append("  biggest lines:")
    for where, size, count in report["lines"][:12]:
        lines.append(
            f"    {size / 2**20:6.2f} MiB  {count:7d} blocks  {where.split('/work/')[-1].split('site-packages/')[-1]}"
        )
    return "\n".join(lines)


async def measure(devices: int, idle: float, work: Path, nri: bool, heap: Path | None = None) -> dict[str, Any]:
    (work / "sys").mkdir()
    if devices:
        write_nic_sysfs(work / "sys", devices)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        api = subprocess.Popen(
            [sys.executable, "-m", "harness.fake_apiserver", "--kubeconfig", str(work / "kubeconfig")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        procs.append(api)
        assert api.stdout is not None and api.stdout.readline().startswith(b"ready")
        launcher = ["-m", "bench.heap_probe", str(heap)] if heap else ["-m", "driver"]
        daemon = subprocess.Popen(
            [
                sys.executable,
                *launcher,
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
                "--cdi-dir",
                str(work / "cdi"),
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
        await wait_published(work, devices)
        published = time.monotonic() - started
        samples = []
        end = time.monotonic() + idle
        while time.monotonic() < end:
            samples.append(status_kb(daemon.pid, "VmRSS") / 1024)
            await asyncio.sleep(0.25)
        out: dict[str, Any] = {
            "rss_median": statistics.median(samples),
            "rss_max": max(samples),
            "hwm": status_kb(daemon.pid, "VmHWM") / 1024,
            "startup": startup,
            "published": published,
            **{k: v / 1024 for k, v in rollup_kb(daemon.pid).items()},
        }
        if heap is not None:
            daemon.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 300  # a snapshot of a 10k-device heap takes a while
            while not heap.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            out["heap"] = json.loads(heap.read_text())
        return out
    finally:
        stop_processes(procs)


async def wait_published(work: Path, devices: int, timeout: float = 300.0) -> None:
    """Until the stub apiserver holds ``devices`` devices in slices (the first publish is done)."""
    kube = KubeClient.from_kubeconfig(str(work / "kubeconfig"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = (await asyncio.to_thread(kube.list_resource_slice, "spec.driver=dra.net")).get("items") or []
        if sum(len(s["spec"].get("devices") or []) for s in items) >= devices:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{devices} devices not published within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="8", help="fixture NICs; a comma-separated list runs each")
    parser.add_argument("--heap", action="store_true", help="also a traced run: what the Python heap holds")
    parser.add_argument("--idle", type=float, default=5.0)
    parser.add_argument(
        "--nri",
        action="store_true",
        help="NRI enabled (pointed at a socket nobody serves: the plugin keeps reconnecting)",
    )
    args = parser.parse_args()
    mode = "NRI on (no runtime)" if args.nri else "--no-nri"
    for devices in (int(d) for d in args.devices.split(",")):
        for traced in (False, True) if args.heap else (False,):
            work = Path(tempfile.mkdtemp(prefix="dranet-bm-"))
            try:
                r = asyncio.run(measure(devices, args.idle, work, args.nri, work / "heap.json" if traced else None))
            finally:
                shutil.rmtree(work, ignore_errors=True)
            if traced:
                print(f"  traced run ({devices} devices), VmRSS {r['rss_max']:.1f} MB with tracing:")
                print(heap_table(r["heap"]))
                continue
            print(
                f"idle dranet run {mode}, {devices} fixture devices, sampled {args.idle:.0f}s after the first publish:"
            )
            print(
                f"  VmRSS median {r['rss_median']:.1f} MB  max {r['rss_max']:.1f} MB  VmHWM (peak) {r['hwm']:.1f} MB"
                f"  (anonymous {r.get('Anonymous', 0):.1f} MB, "
                f"file-backed {r.get('Rss', 0) - r.get('Anonymous', 0):.1f} MB)"
                f"  goal idle <= {GOAL_MB:.0f} MB: ratio {r['rss_max'] / GOAL_MB:.2f}"
            )
            print(
                f"  start to first GetInfo answered: {r['startup'] * 1000:.0f} ms; all devices published after"
                f" {r['published']:.1f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
