"""Run every benchmark in bench/ in turn (the cluster-scale ones only when named): ``python -m bench [name ...]``.

Each ``bench/bench_*.py`` module is runnable on its own (``python -m bench.bench_discovery``)
and prints medians, p99s and the ratio to its goal; this runner just runs them all
in separate processes so one benchmark's state cannot skew another's numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ON_REQUEST = frozenset({"bench_cluster_scale", "bench_apiserver_load", "bench_vs_go"})
"""Run only when named: the cluster-scale benchmarks (minutes each, ``make bench-scale``), and the
comparison with the Go driver (it needs the Go driver's source: ``DRANET_GO_SOURCE``)."""


def main(argv: list[str]) -> int:
    """Run the named benchmarks (default: all); return non-zero if any crashed."""
    names = argv or sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py") if p.stem not in ON_REQUEST)
    failed = []
    for name in names:
        module = name if name.startswith("bench_") else f"bench_{name}"
        print(f"===== {module}", flush=True)
        if subprocess.call([sys.executable, "-m", f"bench.{module}"]) != 0:
            failed.append(module)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
