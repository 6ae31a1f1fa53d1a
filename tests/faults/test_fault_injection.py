"""kill -9 after every netlink operation and every state-file step of prepare, RunPodSandbox and
StopPodSandbox (1, 2 and 3 NICs, with and without a full config; moves the kernel refuses half-way;
a share of a NIC as a sub-interface, with a claim address and a pool lease), and every part of every
record of the claims journal damaged (a byte flipped, bytes inserted, bytes cut out, the file cut
there): no NIC stranded, every intact journal record read at the restart, no claim lost (after the
rebuild from the API server a damaged journal asks for; but those of records left torn at the
journal's end, which no reader can tell from a crash's tear), the state file valid at every restart,
no link the driver does not own touched. The
engine is tests/faults/runner.py; it runs in a throwaway "host" namespace so its veths, addresses
and routes never touch the node's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIN_FAULTS = 200

pytestmark = [pytest.mark.root, pytest.mark.slow]


def run_faults(netns_factory, work: Path, *args: str, timeout: float = 600) -> dict:
    """The engine in a throwaway "host" namespace against a throwaway pod's; its summary."""
    host, pod = netns_factory.netns(), netns_factory.netns()
    out = subprocess.run(
        ["ip", "netns", "exec", host, sys.executable, "-m", "tests.faults.runner", *args]
        + ["--pod-netns", pod, "--host-netns", host, "--work", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_every_step_killed_nothing_lost(netns_factory, tmp_path: Path, capsys) -> None:
    summary = run_faults(netns_factory, tmp_path)
    with capsys.disabled():  # the counts belong in the test log (and the note)
        print(
            f"\nfault injection: {summary['faults']} faults injected, {summary['stranded']} NICs stranded, "
            f"{summary['lost_claims']} claims lost, {summary['invalid_state']} invalid state files, "
            f"{summary['foreign_touched']} foreign links touched, {summary['seconds']} s; journal records "
            f"kept/intact (mended/mendable, torn) by damage: "
            + ", ".join(
                f"{kind} {n['kept']}/{n['intact']} ({n['mended']}/{n['mendable']}, {n['torn']})"
                for kind, n in summary["journal_records"].items()
            )
        )
    assert summary["problems"] == [], summary["problems"]
    assert summary["faults"] >= MIN_FAULTS
    assert (summary["stranded"], summary["lost_claims"], summary["invalid_state"]) == (0, 0, 0)
    assert summary["foreign_touched"] == 0
    assert any("refused" in name for name in summary["by_scenario"]), summary["by_scenario"]
    damaged = {name: n for name, n in summary["by_scenario"].items() if name.startswith("journal record")}
    assert len(damaged) == 4 * 4 * 7, damaged  # every part of every record of the claims journal, 4 kinds of damage
    journal = summary["journal_records"]
    assert set(journal) == {"flipped", "bytes inserted", "bytes cut out", "truncated"}, journal
    assert all(n["kept"] == n["intact"] > 0 and n["mended"] == n["mendable"] for n in journal.values()), journal
    assert all(n > 0 for n in summary["by_scenario"].values()), summary["by_scenario"]


KERNEL_FAMILIES = "macvlan,ipvlan,vrf"
"""The paths that differ by kernel: sub-interfaces (made into another namespace, looked up where the
kernel of the day looks), ipvlan and VRF (modules). The stock-kernel tier runs them all on 6.1."""


@pytest.mark.kernel
@pytest.mark.timeout(1500)  # under emulation (the stock-kernel tier) every fault costs ~20x
def test_every_step_killed_on_the_paths_that_differ_by_kernel(netns_factory, tmp_path: Path, capsys) -> None:
    summary = run_faults(netns_factory, tmp_path, "--only", KERNEL_FAMILIES, timeout=1400)
    with capsys.disabled():
        print(
            f"\nfault injection ({os.uname().release}, {KERNEL_FAMILIES}): {summary['faults']} faults, "
            f"{summary['stranded']} stranded, {summary['invalid_state']} invalid state files, "
            f"{summary['foreign_touched']} foreign links touched, {summary['seconds']} s; by scenario "
            f"{summary['by_scenario']}; not run: {summary['skipped']}"
        )
    assert summary["problems"] == [], summary["problems"]
    assert (summary["stranded"], summary["lost_claims"], summary["invalid_state"]) == (0, 0, 0)
    assert summary["foreign_touched"] == 0
    assert summary["faults"] > 0 and all(n > 0 for n in summary["by_scenario"].values())
    assert any("macvlan share" in name for name in summary["by_scenario"]), summary["by_scenario"]
    assert all(os.uname().release in why for why in summary["skipped"]), summary["skipped"]
