"""Pod start and stop on Debian's stock kernel (6.1) against this machine's, in one run.

``python -m bench.bench_stock_kernel [--cycles 30]`` (root). The NRI hooks in-process
(:func:`bench.bench_sharing.hook_times`: a share of a NIC as a sub-interface, a whole NIC moved in,
a pod without a NIC, interleaved) first on this machine's kernel, then under Debian's stock kernel
booted by QEMU (:mod:`harness.guest`, TCG here: every guest figure runs under emulation, so its
milliseconds are not a 6.1 node's). What compares across the two kernels is each arm's time over
the same kernel's ``no-nic`` arm (the hooks' fixed cost) and the sub-interface / whole-NIC ratio.
Also: the guest's boot to its first command, and the whole boot-run-poweroff.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.bench_sharing import ARMS, hook_times
from bench.stats import median, pct
from devcluster.builders.stock_kernel import GUEST_DIR, ensure
from harness import guest

ROOT = Path(__file__).resolve().parents[1]


def _table(label: str, times: dict[str, dict[str, list[float]]]) -> None:
    for hook in ("run", "stop"):
        none = median(times["no-nic"][hook])
        cells = []
        for arm in ARMS:
            ms = times[arm][hook]
            cells.append(f"{arm} {median(ms):7.2f} (p99 {pct(ms, 99):7.2f}, +{median(ms) - none:6.2f})")
        ratio = median(times["sub-interface"][hook]) / median(times["whole-nic"][hook])
        print(f"  {label:<28} {hook:<4} " + "  ".join(cells) + f"  sub/whole {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=30, help="hook cycles per arm on each kernel")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_stock_kernel needs root (namespaces, QEMU's export of /)", file=sys.stderr)
        return 2
    kernel = ensure()
    here = hook_times(a.cycles)
    with tempfile.TemporaryDirectory(prefix="dranet-bench-kernel-") as tmp:
        run = guest.run(
            f"{sys.executable} -m bench.bench_sharing --cycles {a.cycles} --json {GUEST_DIR}/times.json",
            Path(tmp),
            cwd=ROOT,
            timeout=3600,
            kernel=kernel,
        )
        if run.rc != 0:
            print(run.output[-4000:], file=sys.stderr)
            return 1
        there = json.loads((Path(tmp) / "times.json").read_text())
    print(f"NRI hooks in-process, {a.cycles} cycles per arm, ms: median (p99, + over no-nic)")
    _table(os.uname().release, here)
    _table(f"{there['release']} (TCG)", there["times"])
    print(f"  guest: boot to the first command {run.boot_s:.1f} s, boot + run + poweroff {run.wall_s:.0f} s")
    if a.json:
        report = {"host": {"release": os.uname().release, "times": here}, "guest": there}
        report["guest_boot_s"], report["guest_wall_s"] = run.boot_s, run.wall_s
        a.json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
