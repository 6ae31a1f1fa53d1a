"""Discovery benchmarks: in-process scans of fixture trees and `dranet discover` wall time.

``python -m bench.bench_discovery [--runs N]``. Prints median, p99 and the ratio to each goal
(ratio < 1 = goal met). Fixture trees are built in a temp dir that is removed afterwards.

As root, also the netlink half of a full scan on a node with ``--netlink-links`` links (veth pairs
in a private namespace, removed afterwards): the driver's link, address and route dumps
(:meth:`driver.inventory.netlink_facts.LinkQuery.collect`) beside the same dumps through pyroute2
(``IPRoute.get_links``/``get_addr``/``get_routes``), in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devcluster.doubles.sysfs_fixture import build
from driver.inventory.discovery import Scanner
from driver.inventory.incremental import LinkChange, LinkUpdater
from driver.inventory.sysfs import IdentityCache

GOALS_MS = {"nd-h100-v5": 5.0, "sriov-520": 30.0}  # a 520-device node scanned in <= 30 ms
GOAL_UPDATE_MS = 2.0  # one device updated from one event


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def report(label: str, samples_ms: list[float], goal_ms: float | None) -> None:
    med, p99 = statistics.median(samples_ms), percentile(samples_ms, 99)
    ratio = f"  goal {goal_ms:.0f} ms  ratio {med / goal_ms:.2f}" if goal_ms else ""
    print(f"{label:<40} runs {len(samples_ms):>4}  median {med:8.2f} ms  p99 {p99:8.2f} ms{ratio}", flush=True)


def bench_scan(root: Path, runs: int, exclude: list[str], full: str = "replay") -> tuple[list[float], int]:
    """Rescans with one Scanner, as the daemon does (resync timer, lost link events).

    ``full``: ``"replay"`` = a rescan when nothing changed (every input read again, the last
    full scan's calls replayed); ``"full"`` = a full scan (the pipeline runs: something
    changed); ``"first"`` = also an empty identity cache (the daemon's first scan).
    """
    scanner = Scanner(str(root), exclude_interfaces=exclude)
    count = len(scanner.scan())  # warm-up (imports, pci.ids); recorded for replays
    samples = []
    for _ in range(runs):
        if full != "replay":
            scanner.close()  # drops the recording: the next scan runs the whole pipeline
        if full == "first":
            scanner.identity = IdentityCache()
        start = time.perf_counter()
        scanner.scan()
        samples.append((time.perf_counter() - start) * 1000)
    return samples, count


def bench_update(root: Path, runs: int) -> tuple[list[float], str]:
    """One link event -> its one device rebuilt (``LinkUpdater``), on a fixture (sysfs only):
    each sample changes the netdev's MTU first, so the device really differs."""
    scanner = Scanner(str(root))
    scanner.scan()
    updater = LinkUpdater(scanner)
    ifname = sorted(os.listdir(root / "class/net"))[len(os.listdir(root / "class/net")) // 2]
    mtu = (root / "class/net" / ifname).resolve() / "mtu"
    samples = []
    for i in range(runs):
        mtu.write_text(f"{1500 + i % 2}\n")
        start = time.perf_counter()
        delta = updater.apply([LinkChange(0, ifname)])
        samples.append((time.perf_counter() - start) * 1000)
        assert len(delta.updated) == 1 and not delta.full_scan
    return samples, ifname


def bench_update_host(runs: int) -> list[float] | None:
    """The same on this host's /sys with netlink (one RTM_GETLINK + its addresses): a veth whose
    MTU changes before each sample. Root only; None otherwise."""
    if os.geteuid() != 0:
        return None
    name = f"dnb{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
    try:
        scanner = Scanner("/sys")
        scanner.scan()
        updater = LinkUpdater(scanner)
        index = int(Path(f"/sys/class/net/{name}/ifindex").read_text())
        samples = []
        for i in range(runs):
            subprocess.run(["ip", "link", "set", name, "mtu", str(1400 + i % 2)], check=True)
            start = time.perf_counter()
            delta = updater.apply([LinkChange(index, name)])
            samples.append((time.perf_counter() - start) * 1000)
            assert name in delta.updated, delta
        scanner.close()
        return samples
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def bench_netlink(links: int, runs: int) -> tuple[list[float], list[float]] | None:
    """Milliseconds per netlink collection of a scan, ``links`` links (each with an address) in a
    private netns: (the driver's raw dumps, pyroute2's), interleaved. Root only; None otherwise."""
    if os.geteuid() != 0 or links < 2:
        return None
    from pyroute2 import IPRoute

    from driver.inventory.netlink_facts import LinkQuery
    from driver.netlink.channel import inside_netns, open_netns

    ns = f"dnbn{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".ip") as batch:
            for i in range(links // 2):
                batch.write(f"link add v{i}a type veth peer name v{i}b\n")
                batch.write(f"addr add 10.{i // 250}.{i % 250}.1/24 dev v{i}a\n")
            batch.flush()
            subprocess.run(["ip", "-n", ns, "-batch", batch.name], check=True)
        query = LinkQuery(ns)
        fd = open_netns(ns)
        try:
            with inside_netns(fd):
                ipr = IPRoute()  # created here, its socket is in the namespace
        finally:
            os.close(fd)
        raw, lib = [], []
        try:
            assert len(query.collect().links) >= links
            for _ in range(runs):
                start = time.perf_counter()
                query.collect()
                raw.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                ipr.get_links()
                ipr.get_addr()
                ipr.get_routes(table=254)
                lib.append((time.perf_counter() - start) * 1000)
        finally:
            query.close()
            ipr.close()
        return raw, lib
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def bench_cli(root: Path, runs: int) -> list[float]:
    cmd = [
        sys.executable,
        "-m",
        "driver.cli",
        "--log-level",
        "error",
        "discover",
        "--sysfs-root",
        str(root),
        "--output",
        "json",
        "--exclude-interfaces",
        "eth0",
    ]
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def main(argv: list[str] | None = None) -> int:
    """Run all discovery benchmarks."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--cli-runs", type=int, default=15)
    parser.add_argument("--netlink-links", type=int, default=520, help="links of the netlink measurement (0: skip)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dranet-bench-") as tmp:
        for topology, goal in GOALS_MS.items():
            root = build(topology, Path(tmp) / topology)
            exclude = ["eth0"] if topology == "nd-h100-v5" else []
            samples, count = bench_scan(root, args.runs, exclude)
            report(f"scan {topology} ({count} devices)", samples, goal)
            samples, _ = bench_scan(root, max(1, args.runs // 3), exclude, full="full")
            report("  full scan (pipeline runs)", samples, None)
            samples, _ = bench_scan(root, max(1, args.runs // 3), exclude, full="first")
            report("  first scan (no identity cache)", samples, None)
        samples, ifname = bench_update(Path(tmp) / "sriov-520", args.runs)
        report(f"one link event -> one device (sriov-520, {ifname})", samples, GOAL_UPDATE_MS)
        host = bench_update_host(max(1, args.runs // 3))
        if host:
            report("one link event -> one device (host veth, netlink)", host, GOAL_UPDATE_MS)
        netlink = bench_netlink(args.netlink_links, max(1, args.runs // 10))
        if netlink:
            report(f"netlink facts, {args.netlink_links} links: raw dumps", netlink[0], None)
            report(f"netlink facts, {args.netlink_links} links: pyroute2", netlink[1], None)
        nd = Path(tmp) / "nd-h100-v5"
        report("dranet discover (process, nd-h100-v5)", bench_cli(nd, args.cli_runs), None)
        report("dranet discover (process, sriov-520)", bench_cli(Path(tmp) / "sriov-520", args.cli_runs), None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
