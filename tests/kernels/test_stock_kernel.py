"""The stock-kernel tier: every test whose behaviour depends on the kernel (marked ``kernel``), run
again under Debian's stock kernel (6.1, what Debian 12, COS and Amazon Linux 2023 run), booted by
QEMU with this machine's userland (:mod:`harness.guest`), on a q35 machine with two NUMA nodes and
PCI NICs behind each (:class:`harness.guest.Topology`).

One boot runs them all (Python under emulation is slow to start: one interpreter, one pytest); the
tests here read its JUnit report. A test that needs a feature the guest's kernel lacks skips there
naming the kernel and the feature, and this tier lists what ran on which kernel.
"""

from __future__ import annotations

import os
import platform
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from devcluster.builders.stock_kernel import GUEST_DIR, StockKernelError, ensure
from harness import guest

ROOT = Path(__file__).resolve().parents[2]
GUEST_TIMEOUT = 2400  # s: the whole kernel-dependent suite under TCG on 2 cores, with room
GUEST_CPUS = 2  # one pytest worker per vCPU (xdist, a file per worker): the tier's time halves on 2 cores
MIN_TESTS = 100  # the kernel-marked tests: fewer means the selection broke, not that they passed
TOPOLOGY_ENV = "DRANET_GUEST_TOPOLOGY"
PYVERBS = Path(
    "/usr/lib/python3/dist-packages/pyverbs"
)  # set in the guest: tests of the guest's own PCI/NUMA machine run

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(GUEST_TIMEOUT + 300)]


@dataclass(frozen=True)
class Outcome:
    """One test's result in the guest."""

    nodeid: str
    outcome: str  # passed, failed, error, skipped
    message: str


@dataclass(frozen=True)
class TierRun:
    run: guest.GuestRun
    outcomes: list[Outcome]


def _outcomes(junit: Path) -> list[Outcome]:
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        nodeid = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = found.get("message") or (found.text or "")
                break
        out.append(Outcome(nodeid, outcome, message))
    return out


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> TierRun:
    if os.geteuid() != 0:
        pytest.skip("needs root (QEMU's 9p export of the root, namespaces in the guest)")
    try:
        kernel = ensure()
    except StockKernelError as exc:
        pytest.fail(f"the stock kernel cannot be had here: {exc}")
    folder = tmp_path_factory.mktemp("stock-kernel")
    # Debian's pyverbs (python3-pyverbs) is built for this CPython minor; only it joins the path.
    pyverbs = f"mkdir -p {GUEST_DIR}/pyverbs && ln -sf {PYVERBS} {GUEST_DIR}/pyverbs/ && " if PYVERBS.exists() else ""
    command = (
        f"{pyverbs}PYTHONPATH={GUEST_DIR}/pyverbs {sys.executable} -m pytest -m kernel -q -rs -p no:cacheprovider"
        f" -p no:hypothesispytest -n {GUEST_CPUS} --dist loadfile"
        f" --junitxml={GUEST_DIR}/junit.xml -o junit_family=xunit1 -o junit_logging=log"
    )
    run = guest.run(
        command,
        folder,
        cwd=ROOT,
        env={TOPOLOGY_ENV: "2x2"},
        topology=guest.Topology(),
        cpus=GUEST_CPUS,
        timeout=GUEST_TIMEOUT,
        kernel=kernel,
    )
    junit = folder / "junit.xml"
    if not junit.exists():
        pytest.fail(f"no test report from the guest (exit {run.rc}):\n{run.output[-6000:]}\n{run.console[-3000:]}")
    return TierRun(run, _outcomes(junit))


def test_the_guest_runs_debians_stock_kernel_and_every_kernel_test(tier: TierRun, capsys) -> None:
    counts = Counter(o.outcome for o in tier.outcomes)
    with capsys.disabled():  # what ran where: the tier's own report
        print(
            f"\nstock-kernel tier: {tier.run.release} (guest, QEMU TCG, boot {tier.run.boot_s:.1f} s, "
            f"{tier.run.wall_s:.0f} s in all): {dict(sorted(counts.items()))}; host {platform.release()}"
        )
        for o in tier.outcomes:
            if o.outcome != "passed":
                print(f"  {o.outcome:8} {o.nodeid}: {o.message.splitlines()[0] if o.message else ''}"[:300])
    assert tier.run.release.startswith("6.1."), tier.run.release
    assert len(tier.outcomes) >= MIN_TESTS, f"only {len(tier.outcomes)} kernel tests ran in the guest"
    failed = [o for o in tier.outcomes if o.outcome in ("failed", "error")]
    assert not failed, "\n\n".join(f"{o.nodeid}\n{o.message[-3000:]}" for o in failed)


def test_a_skip_in_the_guest_names_the_kernel(tier: TierRun) -> None:
    """A kernel-marked test that cannot run on the stock kernel says which feature it lacks there."""
    vague = [o for o in tier.outcomes if o.outcome == "skipped" and tier.run.release not in o.message]
    assert not vague, "\n".join(f"{o.nodeid}: {o.message}" for o in vague)
