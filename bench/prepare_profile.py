"""Where a NodePrepareResources call spends its wall time, from ``py-spy record --idle --threads --format raw``.

py-spy samples every thread of the driver at each tick, idle or not, so a thread's samples in
one state over a window of ``n`` sequential prepares, divided by ``n`` and the rate, is the time
per prepare that thread spent there. Each sample is put in one bucket by its thread and frames:
the claim GET in the claim's pool thread (waiting for the apiserver, or decoding the JSON), the
claim's record, the checkpoint write (encoding, writing, fsync) in that thread too, the event loop's own work
(gRPC handling, the claim's decoding and checks, the rest), and idle (the event loop waiting,
pool threads waiting for work: not part of the call's cost).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

RATE = 1000  # samples/s, as bench_prepare_apiserver asks py-spy
_LINE = re.compile(r"^thread \((\d+)\): ([^;]*);(.*) (\d+)$")
_FILE_CALL = re.compile(r"(\w+) \(.*(checkpoint/(?:files|journal)\.py):(\d+)\)")
_ROOT = Path(__file__).resolve().parent.parent
_SYSCALLS = ("fdatasync", "fsync", "replace", "pwrite", "ftruncate", "write", "open", "close", "unlink")


@functools.cache
def _file_step(module: str, function: str, line: int) -> str:
    """What a sampled line of the state-file writers calls (os.* calls are C: the Python frame calling
    them is the leaf, and its source line names the call), e.g. ``append: fdatasync``."""
    try:
        text = (_ROOT / "driver" / module).read_text().splitlines()[line - 1]
    except (OSError, IndexError):
        text = ""
    call = next((c for c in _SYSCALLS if f"ops.{c}(" in text or f"os.{c}(" in text), "other")
    where = "the directory" if "dir_fd" in text else ""
    return f"{function}: {call} {where}".rstrip()


def bucket(thread: str, stack: str) -> str | None:
    """The bucket of one sample; None for idle samples and threads unrelated to prepare."""
    leaf = stack.rsplit(";", 1)[-1]
    if thread.startswith("claim-lookup") and "_get_claim" not in stack:
        # A claim start to end in this thread: lookup, GET (below), record, the group commit (below).
        if "_lookup" in stack:
            return "checkpoint lookup (store read)"
        if "claim_build" in stack:
            return "claim record: decode, checks, snapshot"
        if "checkpoint/" not in stack:
            return "claim thread: other" if "claims/prepare" in stack else None
    elif thread.startswith("claim-lookup"):
        if "load_json" in stack or "json/decoder" in stack or "loads (" in stack:
            return "claim GET: JSON decode"
        if any(k in stack for k in ("recv_into", "readinto", "_safe_read", "getresponse", "read (ssl.py")):
            return "claim GET: waiting for the apiserver"
        return "claim GET: client (urllib3, headers, TLS write)"
    if "checkpoint/" in stack:
        if "compact (" in stack:
            return "checkpoint: compaction (background, after 1 s without claim changes)"
        m = _FILE_CALL.match(leaf)
        if m:
            return f"checkpoint: {_file_step(m.group(2), m.group(1), int(m.group(3)))}"
        if "_encode_claims" in stack or "encode (" in stack or "to_dict" in stack or "pods_json" in stack:
            return "checkpoint: encode (JSON)"
        return "checkpoint: other (store lock, stamps, mutation)"
    if thread.startswith("MainThread"):
        if "select (selectors.py" in leaf or "_run_once" in leaf and "select" in leaf or "poll (" in leaf:
            return None  # the event loop waiting
        if "driver/claims" in stack or "claims/" in stack:
            if "_commit" in stack or "group_commit" in stack:
                return "event loop: group commit bookkeeping"
            return "event loop: claim decode, checks, results"
        if "grpc" in stack or "dra_service" in stack or "kubelet/" in stack:
            return "event loop: gRPC handler"
        if leaf.startswith("_run (") and "events.py" in leaf:
            # A callback running C code with no Python frame of its own: grpc.aio's completions
            # (cython) and futures' done callbacks.
            return "event loop: C callbacks (grpc.aio completions, futures)"
        if "_yield_probe_port" in stack or "node_lease" in stack:
            return "event loop: probe-port and lease polling (every 0.2 s)"
        if "select" in leaf or "epoll" in leaf:
            return None
        return "event loop: other (callbacks, logging)"
    return None


def prepare_breakdown(files: list[Path], prepares: int) -> str:
    """A table: bucket, ms per prepare; then the busiest stacks of the event loop's "other" bucket."""
    per: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for f in files:
        for line in f.read_text().splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            _, thread, stack, count = m.groups()
            b = bucket(thread, stack)
            if b is None:
                continue
            per[b] += int(count)
            if b.startswith("event loop: other") or b.endswith("other"):
                other[";".join(s.split(" (")[0] for s in stack.split(";")[-4:])] += int(count)
    total = sum(per.values())
    rows = ["| where (thread: state) | ms per prepare | share |", "|---|---|---|"]
    for b, n in per.most_common():
        rows.append(f"| {b} | {n / RATE / prepares * 1e3:.2f} | {n / max(1, total):.0%} |")
    rows.append(f"| sum of sampled non-idle time | {total / RATE / prepares * 1e3:.2f} | |")
    rows.append("")
    rows.append("busiest stacks left in an 'other' bucket (last 4 frames):")
    rows += [f"  {n / RATE / prepares * 1e3:.2f} ms  {s}" for s, n in other.most_common(8)]
    return "\n".join(rows)
