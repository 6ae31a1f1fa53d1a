"""``python -m devcluster.demo [--allocation-only]``: the training example's demos (``make demo``, ``demo-fast``)."""

from __future__ import annotations

import argparse
import signal

from devcluster.demo import allocation, nodes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devcluster.demo", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--allocation-only",
        action="store_true",
        help="fast: allocation by the real scheduler only, no kubelet, no pods started",
    )
    a = ap.parse_args(argv)
    # SIGTERM behaves like Ctrl-C so `finally` blocks stop every process.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if a.allocation_only:
        return allocation.run_demo()
    return nodes.run()


if __name__ == "__main__":
    raise SystemExit(main())
