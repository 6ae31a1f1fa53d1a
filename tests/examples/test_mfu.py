"""MFU arithmetic of the distributed-training benchmark (examples/distributed_training/mfu.py)."""

from __future__ import annotations

import pytest

from harness import load_example_module

mfu = load_example_module("mfu")


def test_flops_formula_counts_forward_and_backward_matmuls() -> None:
    # One layer, B=2, H=3: forward 2*2*9 = 36, backward 72 -> 108.
    assert mfu.flops_per_step(2, 3, 1) == 108
    assert mfu.flops_per_step(8192, 8192, 6) == 6 * 8192 * 8192**2 * 6


def test_flops_formula_rejects_nonpositive() -> None:
    with pytest.raises(ValueError):
        mfu.flops_per_step(0, 8, 1)


def test_seed_table_is_consistent_with_default_model() -> None:
    # The training example's aligned row: 55.496 ms/step, 356.62 TFLOP/s per GPU, 36.06 % MFU on H100.
    # B=8192 tokens, H=8192, L=6 reproduces it (1.979e13 FLOPs per step).
    r = mfu.compute_result(
        world_size=8,
        backend="nccl",
        device="NVIDIA H100 80GB HBM3",
        dtype="bf16",
        hidden=8192,
        layers=6,
        tokens_per_step=8192,
        steps=1000,
        total_seconds=55.496,
        peak_tflops=989.0,
        peak_source="table:H100",
        numa_bind="node0",
        nccl_ib_hca="=mlx5_0",
    )
    assert r.tflops_per_gpu == pytest.approx(356.62, abs=0.02)
    assert r.mfu_pct == pytest.approx(36.06, abs=0.01)
    unaligned = mfu.compute_result(
        world_size=8,
        backend="nccl",
        device="H100",
        dtype="bf16",
        hidden=8192,
        layers=6,
        tokens_per_step=8192,
        steps=1000,
        total_seconds=60.951,
        peak_tflops=989.0,
        peak_source="x",
        numa_bind="-",
        nccl_ib_hca="",
    )
    assert unaligned.tflops_per_gpu == pytest.approx(324.70, abs=0.02)
    assert unaligned.mfu_pct == pytest.approx(32.83, abs=0.01)


@pytest.mark.parametrize(
    "name,peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
    ],
)
def test_peak_table(name: str, peak: float) -> None:
    assert mfu.peak_tflops_for(name, env={})[0] == peak


def test_gb200_is_not_read_as_b200() -> None:
    assert mfu.peak_tflops_for("NVIDIA GB200", env={}) == (2500.0, "table:GB200")
    assert mfu.peak_tflops_for("NVIDIA B200", env={}) == (2250.0, "table:B200")
    # No substring matching at all: "XB2000" names neither part.
    with pytest.raises(ValueError):
        mfu.peak_tflops_for("NVIDIA XB2000", env={})


def test_peak_env_override_wins_and_is_validated() -> None:
    assert mfu.peak_tflops_for("NVIDIA H100", env={"PEAK_TFLOPS": "756"}) == (756.0, "env")
    with pytest.raises(ValueError):
        mfu.peak_tflops_for("NVIDIA H100", env={"PEAK_TFLOPS": "0"})


def test_cpu_has_a_nominal_peak_and_unknown_gpu_fails() -> None:
    assert mfu.peak_tflops_for("cpu", env={}) == (mfu.CPU_NOMINAL_PEAK_TFLOPS, "nominal-cpu")
    with pytest.raises(ValueError, match="PEAK_TFLOPS"):
        mfu.peak_tflops_for("Some Accelerator 9000", env={})


def test_result_line_round_trip() -> None:
    r = mfu.compute_result(
        world_size=2,
        backend="gloo",
        device="cpu",
        dtype="float32",
        hidden=64,
        layers=2,
        tokens_per_step=32,
        steps=5,
        total_seconds=0.5,
        peak_tflops=1.0,
        peak_source="nominal-cpu",
        numa_bind="none",
        nccl_ib_hca="=mlx5_0,mlx5_1",
    )
    line = r.to_line()
    assert line.startswith("MFU_RESULT ")
    assert "\n" not in line
    parsed = mfu.parse_result_line("rank0: " + line)
    assert parsed["world_size"] == 2
    assert parsed["avg_step_ms"] == pytest.approx(100.0)
    # Tiny CPU values keep 4 significant digits instead of collapsing to 0.00.
    assert parsed["tflops_per_gpu"] == pytest.approx(6 * 32 * 64 * 64 * 2 / 0.1 / 1e12, rel=1e-3)
    assert parsed["mfu_pct"] == pytest.approx(100 * 6 * 32 * 64 * 64 * 2 / 0.1 / 1e12, rel=1e-3)
    assert parsed["peak_tflops"] == 1.0
    assert parsed["nccl_ib_hca"] == "=mlx5_0,mlx5_1"
    assert parsed["backend"] == "gloo"


def test_result_line_has_no_spaces_inside_values() -> None:
    r = mfu.compute_result(
        world_size=1,
        backend="nccl",
        device="NVIDIA H100 80GB HBM3",
        dtype="bf16",
        hidden=8,
        layers=1,
        tokens_per_step=8,
        steps=1,
        total_seconds=1.0,
        peak_tflops=989.0,
        peak_source="table:H100",
        numa_bind="node1",
        nccl_ib_hca="",
    )
    parsed = mfu.parse_result_line(r.to_line())
    assert parsed["device"] == "NVIDIA_H100_80GB_HBM3"
    assert parsed["nccl_ib_hca"] == "-"


def test_parse_rejects_lines_without_result() -> None:
    with pytest.raises(ValueError):
        mfu.parse_result_line("step 10 loss 1.0")
