"""The distributed-training benchmark: its placement rules, and a real 2-rank gloo run on CPU.

The CPU run needs torch. It uses the interpreter in ``DRANET_TORCH_PYTHON`` when set (CI can
keep torch in its own venv), else this interpreter when it can import torch, and is skipped
only when neither has torch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import EXAMPLE_DIR, load_example_module

placement = load_example_module("placement")
mfu = load_example_module("mfu")


def _torch_python() -> str | None:
    explicit = os.environ.get("DRANET_TORCH_PYTHON")
    if explicit:
        return explicit if shutil.which(explicit) or os.path.isfile(explicit) else None
    return sys.executable if importlib.util.find_spec("torch") else None


TORCH_PYTHON = _torch_python()
# Opt-in: `make test` deselects `-m torch` (torch pulls ~5 GB of CUDA wheels); `make test-torch`
# installs the [example] extra and runs them. Selected explicitly without torch, they skip.
needs_torch = pytest.mark.skipif(
    TORCH_PYTHON is None,
    reason="torch is not installed (pip install torch, or set DRANET_TORCH_PYTHON to a python that has it)",
)


# -- placement: pure rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,cpus",
    [
        ("0-3,8-11", [0, 1, 2, 3, 8, 9, 10, 11]),
        ("0-23,48-71\n", list(range(24)) + list(range(48, 72))),
        ("5", [5]),
        ("", []),
        ("1,1,0", [0, 1]),
    ],
)
def test_parse_cpulist(text: str, cpus: list[int]) -> None:
    assert placement.parse_cpulist(text) == cpus


def test_parse_cpulist_rejects_reversed_range() -> None:
    with pytest.raises(ValueError):
        placement.parse_cpulist("7-3")


def _sysfs(tmp_path: Path, numa: dict[str, str], nodes: dict[int, str]) -> Path:
    for bdf, value in numa.items():
        d = tmp_path / "bus/pci/devices" / bdf
        d.mkdir(parents=True)
        (d / "numa_node").write_text(value + "\n")
    for node, cpus in nodes.items():
        d = tmp_path / f"devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    return tmp_path


def test_device_numa_node_minus_one_is_unknown(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, {"0001:00:00.0": "1", "0002:00:00.0": "-1"}, {0: "0-1", 1: "2-3"})
    assert placement.device_numa_node("0001:00:00.0", str(root)) == 1
    assert placement.device_numa_node("0002:00:00.0", str(root)) is None
    assert placement.device_numa_node("0003:00:00.0", str(root)) is None
    assert placement.numa_nodes(str(root)) == {0: [0, 1], 1: [2, 3]}


def test_plan_binding_rules() -> None:
    two = {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}
    bound = placement.plan_binding(1, two, allowed={2, 3, 4, 5})
    assert (bound.node, bound.cpus, bound.summary) == (1, (4, 5), "node1")
    assert placement.plan_binding(None, two, allowed={0, 1}).node is None  # numa_node = -1
    assert placement.plan_binding(0, {0: [0, 1]}, allowed={0, 1}).node is None  # single node
    assert placement.plan_binding(1, two, allowed={0, 1}).node is None  # cpuset excludes node 1
    assert placement.plan_binding(None, two, allowed={0}).summary == "none"


def test_nccl_ib_hca_exact_match_form() -> None:
    assert placement.nccl_ib_hca({"DRANET_RDMA_DEVICES": "mlx5_0, mlx5_1"}) == ("=mlx5_0,mlx5_1", "DRANET_RDMA_DEVICES")
    assert placement.nccl_ib_hca({"NCCL_IB_HCA": "=mlx5_3", "DRANET_RDMA_DEVICES": "mlx5_0"})[0] == "=mlx5_3"
    assert placement.nccl_ib_hca({})[0] is None


def _run_snippet(code: str) -> str:
    # Affinity changes are process-wide: do them in a child, never in the pytest process.
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(EXAMPLE_DIR)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_apply_binding_pins_every_thread_of_the_process() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = _run_snippet(f"""
        import os, threading, time
        import placement
        stop = threading.Event()
        t = threading.Thread(target=stop.wait); t.start()  # a thread that exists before binding
        b = placement.apply_binding(placement.Binding(0, ({cpu},), "-", "test"))
        tids = [int(x) for x in os.listdir("/proc/self/task")]
        print(sorted({{c for tid in tids for c in os.sched_getaffinity(tid)}}), b.memory in ("preferred", "no-libnuma"))
        stop.set(); t.join()
    """)
    assert out == f"[{cpu}] True"


def test_repin_worker_sets_affinity() -> None:
    cpu = max(os.sched_getaffinity(0))
    out = _run_snippet(f"""
        import os, pickle, placement
        fn = pickle.loads(pickle.dumps(placement.RepinWorker(({cpu},))))  # must survive spawn
        fn(0)
        print(sorted(os.sched_getaffinity(0)))
    """)
    assert out == f"[{cpu}]"


# -- the real thing on CPU ---------------------------------------------------------------------


def _run_benchmark(*extra: str, timeout: int) -> dict[str, int | float | str]:
    assert TORCH_PYTHON is not None
    cmd = [
        TORCH_PYTHON,
        str(EXAMPLE_DIR / "benchmark.py"),
        "--cpu",
        "--nprocs",
        "2",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--batch-tokens",
        "64",
        "--steps",
        "5",
        "--warmup",
        "2",
        *extra,
    ]
    env = {**os.environ, "DRANET_RDMA_DEVICES": "mlx5_0,mlx5_1", "OMP_NUM_THREADS": "1"}
    env.pop("PEAK_TFLOPS", None)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("MFU_RESULT ")]
    assert len(lines) == 1, result.stdout  # rank 0 only
    return mfu.parse_result_line(lines[0])


@pytest.mark.torch
@needs_torch
@pytest.mark.timeout(90)
def test_cpu_benchmark_two_ranks_gloo(tmp_path: Path) -> None:
    # A two-node sysfs tree whose node 1 holds the "GPU" and one CPU this process may use:
    # each rank must bind to node 1, and rank 0 reports it.
    cpu = max(os.sched_getaffinity(0))
    others = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)) if c != cpu) or "0"
    root = _sysfs(tmp_path, {"0009:00:00.0": "1"}, {0: others, 1: str(cpu)})
    r = _run_benchmark("--sysfs-root", str(root), "--device-bus-id", "0009:00:00.0", timeout=60)
    assert r["numa_bind"] == "node1"
    assert r["world_size"] == 2 and r["backend"] == "gloo" and r["device"] == "cpu"
    assert (r["hidden"], r["layers"], r["tokens_per_step"], r["steps"]) == (64, 2, 64, 5)
    assert isinstance(r["avg_step_ms"], float) and r["avg_step_ms"] > 0
    assert r["peak_source"] == "nominal-cpu" and r["peak_tflops"] == mfu.CPU_NOMINAL_PEAK_TFLOPS
    expected_tflops = mfu.flops_per_step(64, 64, 2) / (r["avg_step_ms"] / 1000) / 1e12
    assert r["tflops_per_gpu"] == pytest.approx(expected_tflops, rel=2e-3)
    assert r["mfu_pct"] == pytest.approx(100 * expected_tflops / mfu.CPU_NOMINAL_PEAK_TFLOPS, rel=2e-3)
    # The HCA list is computed (exact-match form) even though gloo does not use it.
    assert r["nccl_ib_hca"] == "=mlx5_0,mlx5_1"


@pytest.mark.torch
@needs_torch
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cpu_benchmark_host_data_loading() -> None:
    r = _run_benchmark("--data", "host", "--num-workers", "1", timeout=90)
    assert r["world_size"] == 2 and r["steps"] == 5
    assert isinstance(r["avg_step_ms"], float) and r["avg_step_ms"] > 0
