"""``dranet`` under tracemalloc: ``python -m bench.heap_probe REPORT dranet-args...``.

Starts tracing before the driver's first import, installs a SIGUSR2 handler that writes what the
Python heap holds to ``REPORT`` (JSON: the traced total, tracemalloc's own overhead, the top
files and lines), then runs ``python -m driver`` with the remaining arguments. Used by
``bench_memory --heap``; tracing costs memory of its own, so RSS is measured in a plain run.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import tracemalloc
from types import FrameType


def _report(path: str) -> None:
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    traced, peak = tracemalloc.get_traced_memory()
    by_file = snap.statistics("filename")
    by_line = snap.statistics("lineno")
    out = {
        "traced": traced,
        "traced_peak": peak,
        "tracemalloc_overhead": tracemalloc.get_tracemalloc_memory(),
        "files": [(s.traceback[0].filename, s.size, s.count) for s in by_file[:400]],
        "lines": [(f"{s.traceback[0].filename}:{s.traceback[0].lineno}", s.size, s.count) for s in by_line[:40]],
        "modules": _modules_by_package(),
    }
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)  # the reader polls for the name: it appears complete


def _modules_by_package() -> dict[str, int]:
    """How many modules of each top-level package are loaded (their code is most of the heap)."""
    out: dict[str, int] = {}
    for name in list(sys.modules):
        top = name.split(".")[0]
        out[top] = out.get(top, 0) + 1
    return dict(sorted(out.items(), key=lambda x: -x[1]))


def main() -> None:
    path = sys.argv[1]
    tracemalloc.start(1)

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        _report(path)

    signal.signal(signal.SIGUSR2, on_signal)
    sys.argv = ["driver", *sys.argv[2:]]
    runpy.run_module("driver", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
