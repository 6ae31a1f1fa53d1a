"""A node's mount namespace file under real mounts: the nodes of one cluster boot side by side, and a
second bind of the namespace directory over itself would hide a node's file already bound there
(``nsenter`` then reads an empty file; the file can be neither unmounted nor removed by its path).
Root only; everything made lives under a temporary root and is unmounted at the end."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster import node_host, node_ns
from devcluster.cluster.node_layout import NodeLayout

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture
def layout() -> Iterator[NodeLayout]:
    with tempfile.TemporaryDirectory(prefix="dc", dir="/tmp") as d:
        lay = NodeLayout(name="nstest", nodes=2, root=Path(d))
        try:
            yield lay
        finally:
            for _ in range(10):  # stacked binds (the race this module tests for) take a round each
                if node_host.unmount_below(lay.base) == [] and _mounts_at(lay.ns_dir) == 0:
                    break
            assert _mounts_at(lay.ns_dir) == 0


def _mounts_at(path: Path) -> int:
    return sum(1 for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[4] == str(path))


def _bind_namespace(layout: NodeLayout, index: int) -> Path:
    """What `node_ns.create` does for the mount namespace, without the node's own mounts."""
    node_ns.private_ns_dir(layout)
    f = layout.node(index).mnt_ns_file
    f.touch()
    subprocess.run(["unshare", f"--mount={f}", "--propagation", "slave", "true"], check=True)
    return f


def _enterable(f: Path) -> bool:
    return subprocess.run(["nsenter", f"--mount={f}", "true"], capture_output=True).returncode == 0


def test_nodes_booting_together_bind_the_directory_once(layout: NodeLayout) -> None:
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def boot() -> None:
        try:
            start.wait()
            node_ns.private_ns_dir(layout)
        except (OSError, node_ns.NodeNsError, threading.BrokenBarrierError) as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=boot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _mounts_at(layout.ns_dir) == 1


def test_a_node_booting_after_another_keeps_the_first_ones_namespace(layout: NodeLayout) -> None:
    first = _bind_namespace(layout, 0)
    second = _bind_namespace(layout, 1)
    assert _enterable(first) and _enterable(second)
    assert node_ns.destroy(layout.node(0)) == [] and node_ns.destroy(layout.node(1)) == []
    assert not first.exists() and not second.exists()


def test_a_hidden_namespace_file_is_reported_and_the_sweep_still_clears_it(layout: NodeLayout) -> None:
    hidden = _bind_namespace(layout, 1)
    # What the unlocked race did: the directory bound over itself once more, hiding the file's mount.
    subprocess.run(["mount", "--bind", str(layout.ns_dir), str(layout.ns_dir)], check=True)
    assert not _enterable(hidden)
    problems = node_ns.destroy(layout.node(1))  # a problem in the report, never an OSError
    assert any(str(hidden) in p for p in problems), problems
    assert node_host.unmount_below(layout.base) == []
    hidden.unlink()
