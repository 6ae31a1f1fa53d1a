"""Order statistics and CPU clocks shared by the benchmarks that compare a path with its floor."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def median(values: list[float]) -> float:
    """The median (0.0 for no values)."""
    return statistics.median(values) if values else 0.0


def abba(cycles: int) -> list[str]:
    """``cycles`` labels "A"/"B" in ABBA blocks (A B B A A B B A ...): drift hits both alike."""
    return ["A" if i % 4 in (0, 3) else "B" for i in range(cycles)]


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far (``/proc/<pid>/stat``), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Row:
    """One table row: a measured path against its floor, both in ms."""

    name: str
    path: list[float]
    floor: list[float]
    cpu_s_per_cycle: float | None = None
    goal_median: float | None = None  # overhead goals, ms
    goal_p99: float | None = None
    goal_path_median: float | None = None  # an absolute goal for the path's median, ms

    @property
    def overhead_median(self) -> float:
        return median(self.path) - median(self.floor)

    @property
    def overhead_p99(self) -> float:
        return pct(self.path, 99) - pct(self.floor, 99)

    def verdict(self) -> str:
        """ "met" / "NOT met" against the goals set on this row, "" without goals."""
        checks = []
        if self.goal_path_median is not None:
            checks.append(median(self.path) <= self.goal_path_median)
        if self.goal_median is not None:
            checks.append(self.overhead_median <= self.goal_median)
        if self.goal_p99 is not None:
            checks.append(self.overhead_p99 <= self.goal_p99)
        if not checks:
            return ""
        return "met" if all(checks) else "NOT met"


def table(rows: list[Row]) -> str:
    """A Markdown table: path and floor median/p99, overhead, driver CPU per cycle, goal."""
    head = (
        "| | n | floor median | floor p99 | driver median | driver p99 | overhead median | overhead p99 "
        "| driver CPU s/cycle | goal (overhead median / p99, or absolute) |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        goal = " / ".join(f"≤ +{g:g} ms" if g is not None else "–" for g in (r.goal_median, r.goal_p99))
        if r.goal_path_median is not None:
            goal = f"median ≤ {r.goal_path_median:g} ms"
        cpu = f"{r.cpu_s_per_cycle:.4f}" if r.cpu_s_per_cycle is not None else "–"
        lines.append(
            f"| {r.name} | {len(r.path)} | {median(r.floor):.2f} ms | {pct(r.floor, 99):.2f} ms "
            f"| {median(r.path):.2f} ms | {pct(r.path, 99):.2f} ms | {r.overhead_median:+.2f} ms "
            f"| {r.overhead_p99:+.2f} ms | {cpu} | {goal} {r.verdict()} |"
        )
    return "\n".join(lines)
