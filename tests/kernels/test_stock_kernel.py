"""The stock-kernel tier: the tests whose behaviour depends on the kernel (marked ``kernel``), run
again under Debian's own kernels, booted by QEMU with this machine's userland (:mod:`harness.guest`):

- **Debian 12's 6.1** (what Debian 12, COS and Amazon Linux 2023 run) and **trixie-backports' 7.3**
  (Linux 7, whose Soft-RoCE has network namespaces: RDMA between pods, ``RXE_NETNS_TESTS``): every
  kernel test, on a q35 machine with two NUMA nodes and PCI NICs behind each
  (:class:`harness.guest.Topology`); both again with an ``igb`` PF on each node and an IOMMU, for
  real SR-IOV VFs (``SRIOV_TESTS``);
- **Debian 13's 6.12**: the tests whose behaviour differs by kernel;
- **Debian 11's 5.10**, the driver's kernel floor (below ``IFLA_NEW_IFINDEX``, as RHEL 9's 5.14 and
  Ubuntu 22.04's 5.15 are): the NIC moves and returns, sub-interfaces, and the refusal a kernel that
  cannot choose a NIC's ifindex needs.

One boot per kernel runs its tests (Python under emulation is slow to start: one pytest, a worker
per vCPU); the tests here read its JUnit report. A test that needs a feature the guest's kernel
lacks skips there naming the kernel and the feature, and the tier lists what ran on which kernel.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.builders import qemu as qemu_builder
from devcluster.builders.stock_kernel import GUEST_DIR, StockKernelError, ensure
from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import allocated_claim, delete_pod, seed_docs
from driver.dra.field_support import counter_sets_accepted
from driver.kube.client import RESOURCE_API
from harness import guest
from tests.plugins.cluster import delete_if_present, delete_node_and_slices
from tests.plugins.sriov_scheduling import (
    GUEST_OUT_ENV,
    NODE_PLACEHOLDER,
    SLICES_FILE,
    UID_PLACEHOLDER,
    SchedulingNode,
    allocated_devices,
    pf_templates,
)

ROOT = Path(__file__).resolve().parents[2]
GUEST_TIMEOUT = 2400  # s: a kernel's tests under TCG on 2 cores, with room
GUEST_CPUS = 2  # one pytest worker per vCPU (xdist, a file per worker): the tier's time halves on 2 cores
# (the SR-IOV guests' files share their PFs' VF counts and settings: one worker there)
TOPOLOGY_ENV = "DRANET_GUEST_TOPOLOGY"  # set in the guest: tests of the guest's own PCI/NUMA machine run
SRIOV_ENV = "DRANET_GUEST_SRIOV"  # set in the SR-IOV guest: its PFs must be there
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs")


@dataclass(frozen=True)
class Kernel:
    """One kernel of the tier: which, what it must be, which tests run on it."""

    suite: str  # "": this machine's suite (Debian 12); else another Debian suite
    release: str  # the start of its ``uname -r``
    tests: tuple[str, ...]  # the files whose ``kernel`` tests run there; empty: every ``kernel`` test
    min_tests: int  # fewer ran: the selection broke, not that they passed
    topology: bool  # the two-NUMA-node machine with PCI NICs
    sriov: bool = False  # and an igb PF (SR-IOV) on each node, an IOMMU: the backport's QEMU


FLOOR_TESTS = (
    "tests/netlink/test_nic_moves.py",
    "tests/nri/test_kernels_without_move_ifindex.py",
    "tests/nri/test_sub_interfaces.py",
)
"""What differs on a kernel without ``IFLA_NEW_IFINDEX`` and before the 2025 rtnetlink change: the
moves and returns, the refusal, the sub-interfaces made from the host straight into the pod."""
MODULE_TESTS = (
    "tests/netlink/test_rdma_nldev.py",
    "tests/nic_settings/test_rdma.py",
    "tests/nic_settings/test_soft_rdma.py",
    "tests/nic_settings/test_vrf.py",
    "tests/nic_settings/test_offload_sizes.py",
)
"""What a kernel's RDMA core, Soft-RoCE, VRF and BIG TCP limits change (6.3's IPv4 sizes)."""
DIFFERING_TESTS = (*FLOOR_TESTS, *MODULE_TESTS)
RXE_NETNS_TESTS = ("tests/nic_settings/test_rxe_between_pods.py",)
"""RDMA between pods through Soft-RoCE made in their namespaces: Linux 7.1's rxe namespaces."""
SRIOV_TESTS = ("tests/inventory/test_sriov_vfs.py", "tests/inventory/test_vfio_container.py")
"""Real VFs of QEMU's igb PFs (no other guest has a PF): discovery, the VF count, a VF in a pod."""
SRIOV_FAULT_TESTS = ("tests/inventory/test_sriov_vf_faults.py",)
"""A VF's settings through a driver killed after each hook step: on the newest kernel only (the
kill and the PF's requests are the same on 6.1; a tier's minutes are not)."""
KERNELS = {
    # 6.1 and 7.3 run every kernel test (what a kernel cannot do skips there, naming it), 6.12
    # every file that differs by kernel, 5.10 the moves; the SR-IOV guests their PFs' VFs.
    "backports-7.3": Kernel("trixie-backports", "7.3.", (), 100, True),
    "debian12-6.1": Kernel("", "6.1.", (), 100, True),
    "debian13-6.12": Kernel("trixie", "6.12.", DIFFERING_TESTS, 60, False),
    "floor-5.10": Kernel("bullseye", "5.10.", FLOOR_TESTS, 30, False),
    "sriov-6.1": Kernel("", "6.1.", SRIOV_TESTS, 5, True, sriov=True),
    "sriov-7.3": Kernel("trixie-backports", "7.3.", (*SRIOV_TESTS, *SRIOV_FAULT_TESTS), 5, True, sriov=True),
}

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(GUEST_TIMEOUT + 300)]


@dataclass(frozen=True)
class Outcome:
    """One test's result in the guest."""

    nodeid: str
    outcome: str  # passed, failed, error, skipped
    message: str


@dataclass(frozen=True)
class TierRun:
    kernel: Kernel
    run: guest.GuestRun
    outcomes: list[Outcome]
    prepare_s: float  # here, before the boot: bytecode and the guest's selection
    folder: Path  # shared with the guest (its GUEST_DIR): its report and what its tests leave for the host


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


def _guest_files(kernel: Kernel) -> tuple[list[str], float]:
    """The test files with ``kernel`` tests that the guest runs, from one collection here that
    also writes their assertion-rewritten bytecode where the guest finds it (the guest's pytest
    then imports only those files, compiled here: a collection of the whole suite in the guest
    took 200 s under TCG, 48 s of it with no file to compile); and its seconds."""
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env[guest.PYCACHE_ENV] = str(guest.bytecode_prefix())
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "kernel", "-p", "no:cacheprovider"]
        + [*(kernel.tests or ("tests",)), "--ignore=tests/kernels"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    files = sorted({line.split("::", 1)[0] for line in out.stdout.splitlines() if "::" in line})
    if not files:
        pytest.fail(f"no kernel tests collected here for the guest:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return files, time.monotonic() - start


@pytest.fixture(scope="module", params=list(KERNELS))
def tier(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TierRun:
    if os.geteuid() != 0:
        pytest.skip("needs root (QEMU's 9p export of the root, namespaces in the guest)")
    kernel = KERNELS[request.param]
    try:
        image = ensure(kernel.suite)
    except StockKernelError as exc:
        pytest.fail(f"the stock kernel cannot be had here: {exc}")
    folder = tmp_path_factory.mktemp(request.param)
    warm_s = guest.warm_bytecode()
    files, collect_s = _guest_files(kernel)
    # Debian's pyverbs (python3-pyverbs) is built for this CPython minor; only it joins the path.
    pyverbs = f"mkdir -p {GUEST_DIR}/pyverbs && ln -sf {PYVERBS} {GUEST_DIR}/pyverbs/ && " if PYVERBS.exists() else ""
    command = (
        f"{pyverbs}PYTHONPATH={GUEST_DIR}/pyverbs {sys.executable} -m pytest -m kernel -q -rs -p no:cacheprovider"
        f" -p no:hypothesispytest -n {1 if kernel.sriov else GUEST_CPUS} --dist loadfile --durations=0"
        f" --junitxml={GUEST_DIR}/junit.xml -o junit_family=xunit1 -o junit_logging=log {' '.join(files)}"
    )
    # The backport's QEMU for every guest: its igb for the SR-IOV ones, and its TCG runs a guest's
    # process starts 2.5x faster than this machine's 7.2 (100 `ip` processes in 7.3's guest: 2.6 s
    # against 6.6 s), which most of these tests are made of.
    try:
        qemu = qemu_builder.ensure()
    except StockKernelError as exc:
        pytest.fail(f"the guests' QEMU (bookworm-backports) cannot be had here: {exc}")
    if kernel.sriov:
        env, topology = {SRIOV_ENV: "1", GUEST_OUT_ENV: GUEST_DIR}, guest.Topology(igb_per_node=1)
    elif kernel.topology:
        env, topology = {TOPOLOGY_ENV: "2x2"}, guest.Topology()
    else:
        env, topology = {}, None
    run = guest.run(
        command,
        folder,
        cwd=ROOT,
        env=env,
        topology=topology,
        cpus=GUEST_CPUS,
        timeout=GUEST_TIMEOUT,
        kernel=image,
        qemu=qemu,
    )
    junit = folder / "junit.xml"
    if not junit.exists():
        pytest.fail(f"no test report from the guest (exit {run.rc}):\n{run.output[-6000:]}\n{run.console[-3000:]}")
    return TierRun(kernel, run, _outcomes(junit), warm_s + collect_s, folder)


def test_every_kernel_test_passes_on_debians_own_kernel(
    tier: TierRun, capsys: pytest.CaptureFixture[str], record_property: Callable[[str, object], None]
) -> None:
    counts = Counter(o.outcome for o in tier.outcomes)
    for outcome in ("passed", "failed", "error", "skipped"):  # make test's table counts the guest's tests
        record_property(f"guest_{outcome}", counts.get(outcome, 0))
    record_property("guest_boot_s", round(tier.run.boot_s, 1))
    record_property("guest_wall_s", round(tier.run.wall_s))
    record_property("guest_boots_died", len(tier.run.panics))
    with capsys.disabled():  # what ran where: the tier's own report
        print(
            f"\nstock-kernel tier: {tier.run.release} (guest, QEMU TCG, boot {tier.run.boot_s:.1f} s, "
            f"{tier.run.wall_s:.0f} s in all, {tier.prepare_s:.0f} s before it here): "
            f"{dict(sorted(counts.items()))}; host {platform.release()}"
        )
        for died in tier.run.panics:
            print("  a boot died before its command (booted again):", *died.splitlines(), sep="\n    ")
        print(*_slowest(tier.run.output), sep="\n")
        for o in tier.outcomes:
            if o.outcome != "passed":
                print(f"  {o.outcome:8} {o.nodeid}: {o.message.splitlines()[0] if o.message else ''}"[:300])
    assert tier.run.release.startswith(tier.kernel.release), tier.run.release
    assert len(tier.outcomes) >= tier.kernel.min_tests, f"only {len(tier.outcomes)} kernel tests ran in the guest"
    failed = [o for o in tier.outcomes if o.outcome in ("failed", "error")]
    assert not failed, "\n\n".join(f"{o.nodeid}\n{o.message[-3000:]}" for o in failed)


def _slowest(output: str, count: int = 8) -> list[str]:
    """The guest's slowest test steps, from its ``--durations`` table."""
    rows = [line for line in output.splitlines() if re.match(r"\d+\.\d+s (call|setup|teardown) ", line)]
    return [f"  slowest: {row}" for row in rows[:count]]


def test_a_skip_in_the_guest_names_the_kernel(tier: TierRun) -> None:
    """A kernel-marked test that cannot run on the stock kernel says which feature it lacks there."""
    vague = [o for o in tier.outcomes if o.outcome == "skipped" and tier.run.release not in o.message]
    assert not vague, "\n".join(f"{o.nodeid}: {o.message}" for o in vague)


REQUEUE_WAIT = 90.0  # a pod waiting on a freed VF: the scheduler requeues it when the claim is deallocated


def test_the_real_scheduler_keeps_a_real_pf_and_its_vfs_apart(tier: TierRun, control_plane: ControlPlane) -> None:
    """The SR-IOV guests: the ResourceSlices the driver made of the guest's igb PFs and their VFs
    (``test_the_pool_of_the_real_pfs_and_vfs_is_published_with_their_counters``), published for a
    node of a real control plane here. The real scheduler gives a PF taken whole none of its VFs
    to other claims until it is freed, and a PF with a VF taken to no claim whole; one claim cannot
    have a PF and one of its VFs; the VFs of a PF go to as many claims, never one twice, and then
    no more."""
    if not tier.kernel.sriov:
        pytest.skip(f"{tier.kernel.release}: no PFs in this guest (the SR-IOV guests have them)")
    written = tier.folder / SLICES_FILE
    if not written.exists():
        pytest.fail("the guest wrote no slices: its test of them failed (see the test above)")
    data = json.loads(written.read_text())
    pf0, pf1 = data["pfs"]
    kube = control_plane.kube()
    accepted, why = counter_sets_accepted(kube, "dra.net", "probe-node")
    assert accepted, f"the control plane keeps no shared counters: {why}"
    name, ns = f"igb-{secrets.token_hex(3)}", f"igb-{secrets.token_hex(3)}"
    classes, _ = seed_docs()
    try:
        control_plane.create_node(name)
        uid = kube.request("GET", f"/api/v1/nodes/{name}")["metadata"]["uid"]
        text = json.dumps(data["slices"]).replace(NODE_PLACEHOLDER, name).replace(UID_PLACEHOLDER, uid)
        for body in json.loads(text):
            kube.request("POST", f"{RESOURCE_API}/resourceslices", body)
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        create_objects(kube, classes)
        create_objects(kube, pf_templates(pf0, pf1), ns)
        node = SchedulingNode(kube, name, ns)
        published = _published(data["slices"])
        named = {attrs.get("pciAddress"): device for device, attrs in published.items()}

        def vfs_of(pf: str) -> set[str]:
            return {device for device, attrs in published.items() if attrs.get("pfPciAddress") == pf}

        assert len(vfs_of(pf0)) == len(vfs_of(pf1)) == data["vfs_per_pf"]

        whole = node.schedule("whole-0", "pf0-whole")
        assert allocated_devices(whole) == [named[pf0]]
        node.unschedulable("vf-0", "pf0-vf")
        delete_pod(kube, ns, "whole-0")
        vf = wait_for(lambda: allocated_claim(kube, ns, "vf-0"), REQUEUE_WAIT, what="vf-0 allocated")
        assert allocated_devices(vf)[0] in vfs_of(pf0)
        node.unschedulable("whole-1", "pf0-whole")  # vf-0 holds a VF of PF 0
        delete_pod(kube, ns, "whole-1")

        cond = node.unschedulable("both", "pf1-and-its-vf")
        assert "cannot allocate all claims" in cond["message"], cond
        delete_pod(kube, ns, "both")

        claims = [node.schedule(f"vf1-{i}", "pf1-vf") for i in range(data["vfs_per_pf"])]
        taken = [d for c in claims for d in allocated_devices(c)]
        assert set(taken) == vfs_of(pf1) and len(taken) == data["vfs_per_pf"], taken
        node.unschedulable("vf1-more", "pf1-vf")  # every VF of PF 1 taken
    finally:
        delete_if_present(kube, f"/api/v1/namespaces/{ns}")
        delete_node_and_slices(kube, name)
        for c in classes:
            delete_if_present(kube, f"{RESOURCE_API}/deviceclasses/{c['metadata']['name']}")


def _published(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each published device's attributes of our domain, by device name: ``{"pciAddress": ...}``."""
    out = {}
    for body in slices:
        for device in body["spec"].get("devices") or []:
            attrs = {}
            for key, value in (device.get("attributes") or {}).items():
                short = key.removeprefix("dra.net/")
                if "/" not in short:
                    attrs[short] = next(iter(value.values()))
            out[device["name"]] = attrs
    return out
