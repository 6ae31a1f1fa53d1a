"""``make test``: every test, in tiers, two lanes at once, and a table of each tier's count and time.

The suite is split into tiers by what they need (root, a control plane, real nodes, QEMU: see
docs/testing.md). Two lanes run side by side, each one tier at a time:

- **compute**: the unit and netlink/NRI tiers (``pytest -n 2``: their tests make their names unique
  per worker), then each stock kernel under QEMU (emulation: CPU-bound, ``nice``'d so the other
  lane's kubelets and apiservers keep their deadlines);
- **cluster**: the apiserver e2e tier and each real-node cluster's tier, which mostly wait on
  kubelets, the apiserver and pods.

A lane whose own tiers are done takes the last tier still queued in the other (``_next_tier``), so
neither lane waits idle while the other has a queue.

Each tier's output goes to its own log (``$DRANET_TEST_LOGS``, default ``build/test-logs/``); a
failed tier's log tail is printed with its name. Every test of the suite is in exactly one tier:
the runner collects the whole suite and the tiers' selections first and stops if they differ
(``--check``), so a new test file cannot be left out. Exit status: 0 when every tier passed (a
tier that ran no test fails, as pytest's exit 5 does).

``python hack/test_tiers.py [--only TIER ...] [--serial] [--check] [--list]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS_ENV = "DRANET_TEST_LOGS"
BASE = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not torch"]
NODE = "tests/e2e/node"
GUEST_NODE = "tests/e2e/guest"  # a real node on a stock kernel under QEMU
OWN_CLUSTERS = (  # real-node modules that bring up a cluster of their own shape
    f"{NODE}/test_crio_node.py",
    f"{NODE}/test_gpu_nic_pairs.py",
    f"{NODE}/test_ip_families.py",
    f"{NODE}/test_dranet_e2e_cluster.py",
)
NETLINK = ("tests/nri", "tests/netlink", "tests/nic_settings", "tests/daemon", "tests/faults", "tests/dhcp")
"""The tiers of real namespaces, veths and netlink (root), and the processes the NRI harness runs."""


@dataclass(frozen=True)
class Tier:
    """One tier: its tests (``paths`` less ``ignore``, with ``keyword`` in their id), its lane, what it needs."""

    name: str
    paths: tuple[str, ...]
    lane: str  # "compute" or "cluster"
    needs: str
    ignore: tuple[str, ...] = ()
    keyword: str = ""
    workers: int = 1  # pytest-xdist workers
    nice: int = 0

    def command(self, junit: Path) -> list[str]:
        cmd = [*BASE, f"--junitxml={junit}", "-o", "junit_family=xunit1", *self.paths]
        cmd += [f"--ignore={p}" for p in self.ignore]
        if self.keyword:
            cmd += ["-k", self.keyword]
        if self.workers > 1:
            cmd += ["-n", str(self.workers)]
        return ["nice", "-n", str(self.nice), *cmd] if self.nice else cmd

    def holds(self, nodeid: str) -> bool:
        """Whether the collected test ``nodeid`` is one of this tier's (as its command selects)."""
        path = nodeid.split("::", 1)[0]

        def under(prefix: str) -> bool:
            return path == prefix or path.startswith(prefix.rstrip("/") + "/")

        inside = any(under(p) for p in self.paths) and not any(under(p) for p in self.ignore)
        return inside and (not self.keyword or self.keyword in nodeid)


TIERS = (
    Tier(
        "unit",
        ("tests",),
        "compute",
        "Python only (a few need root: a tmpfs, a namespace)",
        ignore=(*NETLINK, "tests/e2e", "tests/kernels"),
        workers=2,
    ),
    Tier("netlink/NRI", NETLINK, "compute", "root: network namespaces, veths, the Go NRI harness", workers=2),
    Tier(
        "kernel 7.3",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): trixie-backports' Linux 7 (amd64 flavour)",
        keyword="backports",
        nice=10,
    ),
    Tier(
        "kernel 6.1",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): Debian 12's kernel",
        keyword="debian12",
        nice=10,
    ),
    Tier(
        "kernel 6.12",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): Debian 13's kernel",
        keyword="debian13",
        nice=10,
    ),
    Tier(
        "kernel 5.10",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): Debian 11's kernel",
        keyword="floor",
        nice=10,
    ),
    Tier(
        "kernel 6.1: SR-IOV",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): Debian 12's kernel, igb PFs and their VFs, an IOMMU",
        keyword="sriov-6.1",
        nice=10,
    ),
    Tier(
        "kernel 7.3: SR-IOV",
        ("tests/kernels",),
        "compute",
        "root, QEMU 10 (TCG, bookworm-backports): trixie-backports' Linux 7, igb PFs and their VFs, an IOMMU",
        keyword="sriov-7.3",
        nice=10,
    ),
    Tier(
        "real node on 7.3",
        (GUEST_NODE,),
        "compute",
        "root, QEMU 10 (TCG): trixie-backports' Linux 7 booted as a node (containerd, kubelet, the driver) of a "
        "control plane on this machine",
        nice=10,
    ),
    Tier(
        "real nodes",
        (NODE,),
        "cluster",
        "root, two real nodes (kubelet, containerd) on one cluster, shared by every module",
        ignore=OWN_CLUSTERS,
    ),
    Tier("dranet's e2e suite", (OWN_CLUSTERS[3],), "cluster", "root, bats, a node installed as dranet users do"),
    Tier("real nodes: IPv6-only", (OWN_CLUSTERS[2],), "cluster", "root, an IPv6-only cluster", keyword="ipv6"),
    Tier("real nodes: dual-stack", (OWN_CLUSTERS[2],), "cluster", "root, a dual-stack cluster", keyword="dual"),
    Tier(
        "apiserver e2e",
        ("tests/e2e",),
        "cluster",
        "a real etcd, apiserver, scheduler, controller-manager (no kubelet)",
        ignore=(NODE, GUEST_NODE),
    ),
    Tier("real nodes: CRI-O", (OWN_CLUSTERS[0],), "cluster", "root, a CRI-O node"),
    Tier("real nodes: GPU-NIC pairs", (OWN_CLUSTERS[1],), "cluster", "root, two nodes with a PCIe switch topology"),
)


@dataclass
class Result:
    tier: Tier
    seconds: float = 0.0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    code: int = -1
    log: Path = field(default_factory=Path)

    @property
    def ok(self) -> bool:
        return self.code == 0 and self.passed + self.skipped > 0


def _counts(junit: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a JUnit report (nothing when there is none)."""
    if not junit.is_file():
        return 0, 0, 0
    passed = failed = skipped = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
        # A stock-kernel test stands for the tests its guest ran: they count too.
        # (its other properties, such as its boot's seconds, are not counts)
        counted = {f"guest_{o}" for o in ("passed", "failed", "error", "skipped")}
        guest = {p.get("name"): int(p.get("value") or 0) for p in case.iter("property") if p.get("name") in counted}
        passed += guest.get("guest_passed", 0)
        failed += guest.get("guest_failed", 0) + guest.get("guest_error", 0)
        skipped += guest.get("guest_skipped", 0)
    return passed, failed, skipped


def _run(tier: Tier, logs: Path, say: threading.Lock) -> Result:
    slug = tier.name.lower().replace(" ", "-").replace("/", "-").replace(":", "").replace(",", "").replace("'", "")
    log, junit = logs / f"{slug}.log", logs / f"{slug}.xml"
    junit.unlink(missing_ok=True)
    with say:
        print(f"[tiers] {tier.name}: started ({tier.lane} lane)", flush=True)
    t0 = time.monotonic()
    with open(log, "wb") as out:
        code = subprocess.run(
            tier.command(junit), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    result = Result(tier, time.monotonic() - t0, *_counts(junit), code=code, log=log)
    with say:
        state = "passed" if result.ok else f"FAILED (exit {code})"
        shown = log.relative_to(ROOT) if log.is_relative_to(ROOT) else log
        print(f"[tiers] {tier.name}: {state} in {result.seconds:.0f} s, log {shown}", flush=True)
    return result


def check(tiers: Sequence[Tier]) -> list[str]:
    """Problems with the split (one collection of the whole suite): tests in no tier, or in two."""
    out = subprocess.run(
        [*BASE, "--collect-only", "tests"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    whole = [line.strip() for line in out.splitlines() if "::" in line]
    if not whole:
        return [f"the suite did not collect:\n{out[-2000:]}"]
    problems = []
    for test in whole:
        homes = [t.name for t in tiers if t.holds(test)]
        if len(homes) != 1:
            problems.append(f"{test}: in {' and '.join(homes) if homes else 'no tier'}")
    return problems


def table(results: Sequence[Result], wall: float) -> str:
    lines = ["| tier | lane | tests (passed / failed / skipped) | seconds |", "|---|---|---|---|"]
    for r in results:
        counts = f"{r.passed + r.failed + r.skipped} ({r.passed} / {r.failed} / {r.skipped})"
        mark = "" if r.ok else " **failed**"
        lines.append(f"| {r.tier.name}{mark} | {r.tier.lane} | {counts} | {r.seconds:.0f} |")
    total = sum(r.passed + r.failed + r.skipped for r in results)
    busy = sum(r.seconds for r in results)
    lines.append(f"| **all** (wall; the tiers' own sum {busy:.0f} s) | | {total} | **{wall:.0f}** |")
    return "\n".join(lines)


def _next_tier(own: deque[Tier], queues: Sequence[deque[Tier]], say: threading.Lock) -> Tier | None:
    """The lane's next tier: the first of its own queue; once that is empty, the last of the
    longest other queue (a lane never waits idle beside work it could do: the tiers' clusters,
    namespaces and guests are all their own, so any two of them may run at once)."""
    with say:
        if own:
            return own.popleft()
        others = [q for q in queues if q is not own and q]
        if not others:
            return None
        tier = max(others, key=len).pop()
        print(f"[tiers] {tier.name}: taken by a lane that finished its own ({tier.lane} lane's tier)", flush=True)
        return tier


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run only this tier (by name; repeatable)")
    ap.add_argument("--serial", action="store_true", help="one tier at a time (a lane after the other)")
    ap.add_argument("--check", action="store_true", help="only check that every test is in exactly one tier")
    ap.add_argument("--list", action="store_true", help="list the tiers and what each needs")
    a = ap.parse_args(argv)
    if a.list:
        for t in TIERS:
            print(f"{t.name:<30} {t.lane:<8} {t.needs}")
        return 0
    problems = check(TIERS)
    if problems:
        print("[tiers] the tiers do not cover the suite exactly once:", *problems[:30], sep="\n  ")
        return 2
    if a.check:
        print(f"[tiers] every test is in exactly one of {len(TIERS)} tiers")
        return 0
    chosen = [t for t in TIERS if not a.only or t.name in a.only]
    logs = Path(os.environ.get(LOGS_ENV, ROOT / "build" / "test-logs"))
    logs.mkdir(parents=True, exist_ok=True)
    say = threading.Lock()
    lanes = [[t for t in chosen if t.lane == lane] for lane in ("compute", "cluster")]
    if a.serial:
        lanes = [[t for lane in lanes for t in lane]]
    queues = [deque(lane) for lane in lanes if lane]
    results: dict[str, Result] = {}
    t0 = time.monotonic()
    if os.geteuid() == 0 and any(t.lane == "cluster" for t in chosen):
        # A run killed before its clusters' own cleanup left their namespaces, links and cgroups.
        subprocess.run([sys.executable, "-m", "devcluster", "sweep"], cwd=ROOT, check=False, timeout=600)

    def run_lane(own: deque[Tier]) -> None:
        while (tier := _next_tier(own, queues, say)) is not None:
            try:
                results[tier.name] = _run(tier, logs, say)
            except Exception as exc:  # noqa: BLE001 (the runner's own fault: that tier fails, the others still run)
                with say:
                    print(f"[tiers] {tier.name}: the runner failed: {exc!r}", flush=True)
                results[tier.name] = Result(tier, code=-1, log=logs / "runner-error.log")
                results[tier.name].log.write_text(f"{tier.name}: {exc!r}\n")

    threads = [threading.Thread(target=run_lane, args=(queue,)) for queue in queues]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    ordered = [results[t.name] for t in chosen]
    for r in ordered:
        if not r.ok:
            tail = r.log.read_text(errors="replace").splitlines()[-60:]
            print(f"\n[tiers] ---- {r.tier.name} failed (exit {r.code}); the end of {r.log}:", *tail, sep="\n")
    print("\n" + table(ordered, wall))
    return 0 if all(r.ok for r in ordered) else 1


if __name__ == "__main__":
    raise SystemExit(main())
