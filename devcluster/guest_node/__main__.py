"""``python -m devcluster.guest_node`` (``make guest-node``): a real node on Linux 7.3 under QEMU,
joined to a control plane on this machine, RDMA between two of its pods (:mod:`.host`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from devcluster.builders import stock_kernel
from devcluster.guest_node.host import REPO, run, say


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="pod pairs, one after the other (default 2)")
    parser.add_argument("--timeout", type=float, default=1500, help="the guest's whole run, seconds")
    parser.add_argument("--json", type=Path, default=REPO / "build" / "guest-node.json", help="where the report goes")
    parser.add_argument("--folder", type=Path, help="the run folder, kept (default: a temporary one)")
    args = parser.parse_args(argv)
    try:
        report = run(args.rounds, args.timeout, args.folder)
    except (RuntimeError, OSError, subprocess.SubprocessError, stock_kernel.StockKernelError) as exc:
        say(f"failed: {exc}")
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report.__dict__, indent=2))
    say(f"{'FAILED' if report.failures else 'passed'} in {report.seconds.get('total')} s; report {args.json}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
