"""Model FLOPs Utilization (MFU) arithmetic and the ``MFU_RESULT`` line, without torch.

The benchmark's model is a stack of ``L`` bias-free ``Linear(H, H)`` layers. One step on one
rank pushes ``B`` token rows (``B = micro_batch * seq_len``, the rows of the ``[B, H]``
activation that rank sees) through every layer forward and backward:

* forward: one ``[B, H] x [H, H]`` matmul per layer = ``2 * B * H^2`` FLOPs,
* backward: the input gradient and the weight gradient, two more matmuls = ``4 * B * H^2``,

so **FLOPs per step per GPU = 6 * B * H^2 * L**. Activations (GELU) and the all-reduce are
not counted: MFU counts only the model's matmul FLOPs, by definition.

``TFLOP/s per GPU = FLOPs per step / step seconds / 1e12`` and
``MFU % = 100 * TFLOP/s per GPU / peak TFLOP/s per GPU`` (bf16 dense peak).

This file ships in the benchmark ConfigMap next to ``benchmark.py``, so it must not import
anything outside the standard library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

RESULT_PREFIX = "MFU_RESULT"
"""First token of the result line; ``grep MFU_RESULT`` on the launcher log finds it."""

PEAK_ENV = "PEAK_TFLOPS"
"""Environment variable overriding the peak bf16 dense TFLOP/s per device."""

CPU_NOMINAL_PEAK_TFLOPS = 1.0
"""Nominal CPU peak for CPU mode: MFU on a CPU is only a smoke signal, so a round number that
keeps the percentage readable; set ``PEAK_TFLOPS`` for a meaningful value."""

# bf16 dense (no sparsity) peak per GPU, TFLOP/s, from the vendors' data sheets (SXM parts).
# Keys are exact product tokens: "GB200" must never be matched by a "B200" substring test.
PEAK_TFLOPS_BY_TOKEN: dict[str, float] = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
}


def flops_per_step(tokens_per_step: int, hidden: int, layers: int) -> int:
    """Model FLOPs of one training step on one rank: ``6 * B * H^2 * L`` (see module doc)."""
    if tokens_per_step <= 0 or hidden <= 0 or layers <= 0:
        raise ValueError("tokens_per_step, hidden and layers must be positive")
    return 6 * tokens_per_step * hidden * hidden * layers


def _tokens(device_name: str) -> list[str]:
    # "NVIDIA A100-SXM4-80GB" -> ["NVIDIA", "A100", "SXM4", "80GB"]; exact-token matching is what
    # keeps "NVIDIA GB200" from being read as a B200.
    return [t.upper() for t in re.split(r"[^A-Za-z0-9]+", device_name) if t]


def peak_tflops_for(device_name: str, env: Mapping[str, str] | None = None) -> tuple[float, str]:
    """Peak bf16 dense TFLOP/s for a device name and where it came from.

    Returns ``(peak, source)`` with source ``env`` (``PEAK_TFLOPS`` set), ``table:<TOKEN>``
    or ``nominal-cpu`` (device name ``cpu``). Raises ``ValueError`` for an unknown GPU so a
    wrong MFU is never printed silently.
    """
    env = os.environ if env is None else env
    override = env.get(PEAK_ENV, "").strip()
    if override:
        value = float(override)
        if value <= 0:
            raise ValueError(f"{PEAK_ENV} must be positive, got {override!r}")
        return value, "env"
    if device_name.strip().lower() == "cpu":
        return CPU_NOMINAL_PEAK_TFLOPS, "nominal-cpu"
    tokens = _tokens(device_name)
    for token, peak in PEAK_TFLOPS_BY_TOKEN.items():
        if token in tokens:
            return peak, f"table:{token}"
    raise ValueError(f"no peak TFLOP/s known for device {device_name!r}; set {PEAK_ENV}")


def _format_float(value: float, decimals: int) -> str:
    # Fixed decimals as in the seed's table; values below 1 (CPU mode) switch to exponent
    # form so they keep 4 significant digits. Both forms keep a '.': the parser reads a float.
    if value == 0 or abs(value) >= 1:
        return f"{value:.{decimals}f}"
    return f"{value:.3e}"


@dataclass(frozen=True)
class MfuResult:
    """One benchmark run's summary: everything the ``MFU_RESULT`` line carries."""

    world_size: int
    backend: str
    device: str
    dtype: str
    hidden: int
    layers: int
    tokens_per_step: int
    steps: int
    avg_step_ms: float
    tflops_per_gpu: float
    peak_tflops: float
    peak_source: str
    mfu_pct: float
    numa_bind: str
    nccl_ib_hca: str

    def to_line(self) -> str:
        """``MFU_RESULT key=value ...``: one line, fixed key order, no spaces inside values."""
        parts = [RESULT_PREFIX]
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                text = _format_float(value, 3 if f.name == "avg_step_ms" else 2)
            else:
                text = str(value)
            # Values are single tokens; GPU names have spaces ("NVIDIA H100 80GB HBM3").
            text = re.sub(r"\s+", "_", text) or "-"
            parts.append(f"{f.name}={text}")
        return " ".join(parts)


def compute_result(
    *,
    world_size: int,
    backend: str,
    device: str,
    dtype: str,
    hidden: int,
    layers: int,
    tokens_per_step: int,
    steps: int,
    total_seconds: float,
    peak_tflops: float,
    peak_source: str,
    numa_bind: str,
    nccl_ib_hca: str,
) -> MfuResult:
    """Derive avg step time, TFLOP/s per GPU and MFU from a timed run of ``steps`` steps."""
    if steps <= 0 or total_seconds <= 0:
        raise ValueError("steps and total_seconds must be positive")
    step_s = total_seconds / steps
    tflops = flops_per_step(tokens_per_step, hidden, layers) / step_s / 1e12
    return MfuResult(
        world_size=world_size,
        backend=backend,
        device=device,
        dtype=dtype,
        hidden=hidden,
        layers=layers,
        tokens_per_step=tokens_per_step,
        steps=steps,
        avg_step_ms=step_s * 1000.0,
        tflops_per_gpu=tflops,
        peak_tflops=peak_tflops,
        peak_source=peak_source,
        mfu_pct=100.0 * tflops / peak_tflops,
        numa_bind=numa_bind,
        nccl_ib_hca=nccl_ib_hca or "-",
    )


def parse_result_line(line: str) -> dict[str, int | float | str]:
    """Parse an ``MFU_RESULT`` line (anywhere in ``line``) into typed values.

    Integers stay ``int``, decimals become ``float``, everything else stays ``str``.
    Raises ``ValueError`` when the line holds no result.
    """
    idx = line.find(RESULT_PREFIX + " ")
    if idx < 0:
        raise ValueError("no MFU_RESULT in line")
    out: dict[str, int | float | str] = {}
    for item in line[idx + len(RESULT_PREFIX) :].split():
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"malformed MFU_RESULT field {item!r}")
        if re.fullmatch(r"-?\d+", raw):
            out[key] = int(raw)
        elif re.fullmatch(r"-?\d+\.\d*(e[-+]?\d+)?", raw):
            out[key] = float(raw)
        else:
            out[key] = raw
    return out
