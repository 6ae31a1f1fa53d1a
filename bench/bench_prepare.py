"""NodePrepareResources round trip over the real unix socket, against a real `dranet run`.

The driver runs as its own process (``dranet run --no-nri``, fixture sysfs with 8 NICs for the
sequential calls and 4 more per concurrent claim);
the claim GET is served by the local stub apiserver (harness/fake_apiserver.py) in
a third process. Each timed call prepares a *new* 4-device claim (GET + checkpoint
fsync), and is unprepared untimed afterwards so the checkpoint stays at steady-state size.

    python -m bench.bench_prepare [--calls 300] [--concurrent 100]

Goal: p99 <= 20 ms for one 4-device claim.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import stop_processes, write_nic_sysfs  # noqa: E402 - after the sys.path setup above
from harness.fake_apiserver import make_claim, result  # noqa: E402 - after the sys.path setup above
from harness.kubelet_client import KubeletClient, wait_for_socket  # noqa: E402 - after the sys.path setup above

NODE = "bench-node"
GOAL_P99_MS = 20.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def claims_for(devices: list[str], prefix: str, count: int, shared: bool = True) -> list[dict[str, Any]]:
    """``count`` claims, each with 4 of ``devices`` (two requests, one with a subrequest): claim i
    takes devices i..i+3 of the list when ``shared`` (one prepared at a time: a NIC is in one
    claim at a time), else its own four (prepared together)."""
    out = []
    for i in range(count):
        first = i if shared else 4 * i
        picks = [devices[(first + k) % len(devices)] for k in range(4)]
        results = [result(d, NODE, "nic/a" if k < 2 else "rdma") for k, d in enumerate(picks)]
        configs = [
            {
                "source": "FromClaim",
                "requests": ["nic"],
                "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 9000}}},
            }
        ]
        out.append(make_claim("bench", f"{prefix}{i}", f"{prefix}-uid-{i}", results, configs, pods=[f"pod-{i}"]))
    return out


async def run(calls: int, concurrent: int, work: Path, state_dir: Path) -> dict[str, float]:
    devices = write_nic_sysfs(work / "sys", 8 + 4 * concurrent)
    claims = claims_for(devices[:8], "seq", calls + 20) + claims_for(devices[8:], "conc", concurrent, shared=False)
    (work / "claims.json").write_text(json.dumps(claims))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        api = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.fake_apiserver",
                "--kubeconfig",
                str(work / "kubeconfig"),
                "--claims",
                str(work / "claims.json"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        procs.append(api)
        assert api.stdout is not None and api.stdout.readline().startswith(b"ready")
        log = open(work / "daemon.log", "wb")
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "driver",
                "--log-level",
                "warning",
                "run",
                "--no-nri",
                "--node-name",
                NODE,
                "--kubeconfig",
                str(work / "kubeconfig"),
                "--sysfs-root",
                str(work / "sys"),
                "--kubelet-root",
                str(work / "kubelet"),
                "--cdi-dir",
                str(work / "cdi"),
                "--state-dir",
                str(state_dir),
                "--runtime-dir",
                str(state_dir),
                "--bind-address",
                "127.0.0.1:0",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        procs.append(daemon)
        reg = str(work / "kubelet/plugins_registry/dra.net-reg.sock")
        await wait_for_socket(reg, 30)
        async with KubeletClient(reg) as kubelet:
            await kubelet.wait_serving()
            await kubelet.register()
            # Warm-up (connection, imports, first checkpoint write), untimed.
            for i in range(calls, calls + 20):
                await kubelet.prepare([("bench", f"seq{i}", f"seq-uid-{i}")])
                await kubelet.unprepare([("bench", f"seq{i}", f"seq-uid-{i}")])
            lat, hit = [], []
            for i in range(calls):
                ref = ("bench", f"seq{i}", f"seq-uid-{i}")
                t0 = time.perf_counter()
                resp = await kubelet.prepare([ref])
                lat.append((time.perf_counter() - t0) * 1000)
                entry = resp.claims[ref[2]]
                assert entry.error == "" and len(entry.devices) == 4, entry.error
                t0 = time.perf_counter()
                await kubelet.prepare([ref])  # the kubelet's retry: answered from the checkpoint
                hit.append((time.perf_counter() - t0) * 1000)
                await kubelet.unprepare([ref])
            refs = [("bench", f"conc{i}", f"conc-uid-{i}") for i in range(concurrent)]

            async def one(ref: tuple[str, str, str]) -> float:
                t0 = time.perf_counter()
                resp = await kubelet.prepare([ref])
                assert resp.claims[ref[2]].error == "", resp.claims[ref[2]].error
                return (time.perf_counter() - t0) * 1000

            t0 = time.perf_counter()
            conc = await asyncio.gather(*(one(r) for r in refs))
            wall = (time.perf_counter() - t0) * 1000
        return {
            "median": statistics.median(lat),
            "p99": pct(lat, 99),
            "max": max(lat),
            "hit_median": statistics.median(hit),
            "hit_p99": pct(hit, 99),
            "conc_wall": wall,
            "conc_median": statistics.median(conc),
            "conc_p99": pct(conc, 99),
        }
    finally:
        stop_processes(procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument(
        "--state-parent",
        default=None,
        help="directory for the checkpoint (default: the temp dir on the root disk); "
        "e.g. /dev/shm to see the cost without disk fsync latency",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dranet-bp-"))
    state = Path(tempfile.mkdtemp(prefix="dranet-bp-state-", dir=args.state_parent))
    try:
        r = asyncio.run(run(args.calls, args.concurrent, work, state))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    print(f"checkpoint directory under {state.parent}")
    print(f"NodePrepareResources, new 4-device claim (GET + checkpoint fsync), {args.calls} calls over dra.sock:")
    print(
        f"  median {r['median']:.2f} ms  p99 {r['p99']:.2f} ms  max {r['max']:.2f} ms"
        f"  goal p99 <= {GOAL_P99_MS:.0f} ms  ratio p99/goal {r['p99'] / GOAL_P99_MS:.2f}"
    )
    print(f"  retry of a prepared claim (checkpoint hit): median {r['hit_median']:.2f} ms  p99 {r['hit_p99']:.2f} ms")
    print(
        f"{args.concurrent} claims concurrently (one call each): wall {r['conc_wall']:.1f} ms"
        f"  per-call median {r['conc_median']:.1f} ms  p99 {r['conc_p99']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
