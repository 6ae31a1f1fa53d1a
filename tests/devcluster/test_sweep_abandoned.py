"""A cluster a killed run left behind is removed by the next run; a live one, or one still coming
up, is left alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.cluster.lifecycle import ABANDONED_AFTER_S, sweep_abandoned


@pytest.fixture
def root() -> Iterator[Path]:
    # Short: a layout refuses a root too long for its unix sockets.
    d = Path(tempfile.mkdtemp(prefix="sw", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _cluster(root: Path, name: str, pids: dict[str, int], age_s: float) -> Path:
    base = root / name
    (base / "logs").mkdir(parents=True)
    state = base / "cluster.json"
    state.write_text(json.dumps({"name": name, "nodes": 2, "cluster_cidr": "10.88.0.0/20", "pids": pids}))
    then = time.time() - age_s
    os.utime(state, (then, then))
    return base


def test_only_the_quiet_cluster_with_every_process_gone_is_removed(root: Path) -> None:
    old = ABANDONED_AFTER_S + 60
    dead = _cluster(root, "edead1", {"etcd": _dead_pid(), "n0/kubelet": _dead_pid()}, old)
    live = _cluster(root, "elive1", {"etcd": _dead_pid(), "kube-apiserver": os.getpid()}, old)
    coming_up = _cluster(root, "eup1", {}, 5)  # nothing started yet, state just written
    (root / "notacluster").mkdir()
    (root / "notacluster" / "cluster.json").write_text("[1, 2]")
    said: list[str] = []
    assert sweep_abandoned(root, progress=said.append) == ["edead1"]
    assert not dead.exists()
    assert live.is_dir() and coming_up.is_dir() and (root / "notacluster").is_dir()
    assert len(said) == 1 and "edead1" in said[0]
