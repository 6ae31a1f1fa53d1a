"""make test's runner (hack/test_tiers.py): what its table counts from each tier's JUnit report,
and what keeps its two lanes apart."""

from __future__ import annotations

import re
import threading
from collections import deque
from pathlib import Path
from types import ModuleType

from tests.e2e.node.realnode import CLUSTER_SECOND_OCTETS
from tests.support.hack_scripts import load

ROOT = Path(__file__).resolve().parents[2]


def _runner() -> ModuleType:
    return load("test_tiers.py", "test_tiers_runner")


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
  <testcase classname="tests.a" name="test_passes"/>
  <testcase classname="tests.a" name="test_skips"><skipped message="no"/></testcase>
  <testcase classname="tests.kernels" name="test_guest">
    <properties>
      <property name="guest_passed" value="65"/>
      <property name="guest_failed" value="1"/>
      <property name="guest_error" value="2"/>
      <property name="guest_skipped" value="3"/>
      <property name="guest_boot_s" value="4.5"/>
      <property name="guest_wall_s" value="185"/>
    </properties>
    <failure message="one guest test failed"/>
  </testcase>
</testsuite></testsuites>
"""


def test_a_stock_kernel_test_counts_its_guests_tests_and_nothing_else_of_its_properties(tmp_path: Path) -> None:
    junit = tmp_path / "tier.xml"
    junit.write_text(JUNIT)
    passed, failed, skipped = _runner()._counts(junit)
    assert (passed, failed, skipped) == (1 + 65, 1 + 1 + 2, 1 + 3)


def test_a_tier_without_a_report_counts_nothing(tmp_path: Path) -> None:
    assert _runner()._counts(tmp_path / "missing.xml") == (0, 0, 0)


def test_the_tiers_have_distinct_names_and_the_four_stock_kernels() -> None:
    runner = _runner()
    names = [t.name for t in runner.TIERS]
    assert len(names) == len(set(names))
    assert {"kernel 7.3", "kernel 6.12", "kernel 6.1", "kernel 5.10"} <= set(names)


def test_no_test_names_an_address_in_the_clusters_range() -> None:
    """The cluster lane's clusters put addresses of 10.104-10.127 on the host; the compute lane,
    running beside them, must never give a NIC one of those (it would read as the host's)."""
    octets = "|".join(str(o) for o in CLUSTER_SECOND_OCTETS)
    address = re.compile(rf"\b10\.({octets})\.\d+\.\d+")
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for folder in ("tests", "harness", "bench", "devcluster")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for m in address.finditer(path.read_text())
    ]
    assert not found, found


def test_a_lane_that_finished_its_own_takes_the_other_lanes_last_tier() -> None:
    runner = _runner()
    compute, cluster = (deque(t for t in runner.TIERS if t.lane == lane) for lane in ("compute", "cluster"))
    first_cluster, last_cluster = cluster[0], cluster[-1]
    queues = [compute, cluster]
    say = threading.Lock()
    while compute:
        taken = runner._next_tier(compute, queues, say)
        assert taken.lane == "compute"
    assert runner._next_tier(compute, queues, say) is last_cluster, "the other lane's last"
    assert runner._next_tier(cluster, queues, say) is first_cluster, "its own first"
    while runner._next_tier(cluster, queues, say) is not None:
        pass
    assert runner._next_tier(compute, queues, say) is None and not cluster
