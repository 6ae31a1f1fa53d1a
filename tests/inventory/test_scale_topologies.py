"""The node shapes of the cluster-scale benchmark: DGX H100 and GB200 fixtures as discovery sees them,
the GPU double read from the same trees, the Go attribute cut, and the claim templates per shape."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.bench_cluster_scale import templates
from bench.prepare_profile import bucket
from bench.scale_fleet import GO_ATTRIBUTES, SHAPES, fixture_gpus, go_cut, scan_shape
from devcluster.demo.allocation import seed_docs

D = "dra.net/"
STD = "resource.kubernetes.io/"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("shapes")
    return {name: scan_shape(shape, work) for name, shape in SHAPES.items()}


def _by_numa(devices: list, rdma_ib: bool = False) -> dict[int, int]:
    out: dict[int, int] = {}
    for d in devices:
        if rdma_ib and d.attributes.get(D + "linkLayer") != "InfiniBand":
            continue
        numa = d.attributes[STD + "numaNode"]
        out[numa] = out.get(numa, 0) + 1
    return out


def test_dgx_h100_devices_and_gpu_pairs(shapes: dict, tmp_path: Path) -> None:
    dgx = shapes["dgx"]
    devices = dgx.devices["dranet"]
    names = {d.attributes[D + "ifName"] for d in devices}
    assert "enp170s0f0np0" not in names  # the uplink
    assert len(devices) == 11 and all(d.attributes[D + "rdma"] is True for d in devices)
    assert _by_numa(devices, rdma_ib=True) == {0: 4, 1: 4}
    # Each GPU sits behind the PCIe switch of one compute NIC: the same pcieRoot, one pair each.
    nic_roots = {d.attributes[STD + "pcieRoot"] for d in devices if d.attributes[D + "linkLayer"] == "InfiniBand"}
    gpu_roots = [g.pcie_root for g in dgx.gpus]
    assert len(dgx.gpus) == 8 and sorted(gpu_roots) == sorted(nic_roots) and len(set(gpu_roots)) == 8
    assert [g.numa for g in dgx.gpus] == [0] * 4 + [1] * 4


def test_gb200_devices_and_gpus(shapes: dict) -> None:
    gb = shapes["gb200"]
    devices = gb.devices["dranet"]
    assert len(devices) == 7  # 4 IB + 3 BlueField-3 ports (one is the uplink)
    assert _by_numa(devices, rdma_ib=True) == {0: 2, 1: 2}
    assert [(g.bus_id, g.numa) for g in gb.gpus] == [
        ("0008:01:00.0", 0),
        ("0009:01:00.0", 0),
        ("0018:01:00.0", 1),
        ("0019:01:00.0", 1),
    ]
    # Grace: one PCI domain per root port, so no NIC shares a root with a GPU.
    assert not {g.pcie_root for g in gb.gpus} & {d.attributes[STD + "pcieRoot"] for d in devices}


def test_nd_gpus_match_the_gpu_double(shapes: dict) -> None:
    from devcluster.doubles.gpu_double import ND_H100_V5_GPUS

    assert [(g.bus_id, g.numa) for g in shapes["nd"].gpus] == list(ND_H100_V5_GPUS)


def test_go_cut_keeps_only_the_go_attributes(shapes: dict) -> None:
    ours = shapes["dgx"].devices["dranet"]
    cut = go_cut(ours)
    assert [d.name for d in cut] == [d.name for d in ours]
    for full, short in zip(ours, cut, strict=True):
        assert set(short.attributes) == set(full.attributes) & GO_ATTRIBUTES
        assert set(full.attributes) - set(short.attributes) == {D + "linkLayer", D + "rateGbps", STD + "pciBusID"}


def test_templates_per_shape(shapes: dict) -> None:
    tmpls = templates(SimpleNamespace(shapes=shapes))
    (seed,) = [t for t in seed_docs()[1] if t["metadata"]["name"].endswith("numa-aligned")]
    assert tmpls[("aligned", "nd")] == seed  # the training example's template, unchanged
    gpu, nic = tmpls[("aligned", "dgx")]["spec"]["spec"]["devices"]["requests"]
    expr = gpu["exactly"]["selectors"][0]["cel"]["expression"]
    assert all(f'"{g.bus_id}"' in expr for g in shapes["dgx"].gpus if g.numa == 0)
    assert not any(f'"{g.bus_id}"' in expr for g in shapes["dgx"].gpus if g.numa == 1)
    assert gpu["exactly"]["count"] == nic["exactly"]["count"] == 4
    gb = tmpls[("match", "gb200")]["spec"]["spec"]["devices"]
    assert [r["exactly"]["count"] for r in gb["requests"]] == [2, 2]
    assert "NVIDIA GB200" in gb["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert gb["constraints"] == [{"requests": ["gpu", "nic"], "matchAttribute": STD + "numaNode"}]
    assert tmpls[("match", "nd")]["metadata"]["name"] == "4gpu-4nic-same-numa"


def test_fixture_gpus_reads_only_nvidia_3d_controllers(shapes: dict, tmp_path: Path) -> None:
    from devcluster.doubles.sysfs_fixture import build

    root = build("dgx-h100", tmp_path / "dgx")
    assert len(fixture_gpus(root)) == 8  # not the 4 NVSwitches (class 0x0680), not the NICs


def _line_of(module: str, text: str) -> int:
    """The line of ``driver/checkpoint/<module>`` that holds ``text`` (the profile reads the source)."""
    lines = (Path(__file__).resolve().parents[2] / "driver/checkpoint" / module).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.parametrize(
    ("thread", "stack", "expected"),
    [
        ("claim-lookup_0", "run;_lookup (p.py:1);_get_claim (p.py:2);recv_into (ssl.py:3)", "claim GET: waiting"),
        ("claim-lookup_0", "run;_lookup (p.py:1);_get_claim (p.py:2);load_json (u.py:4)", "claim GET: JSON"),
        ("claim-lookup_1", "_worker (thread.py:9);get (queue.py:1)", None),
        (
            "claim-lookup_0",
            "run;_prepare (/w/driver/claims/prepare.py:1);apply (/w/driver/claims/prepare.py:2);"
            f"update (/w/driver/checkpoint/store.py:1);append (/w/driver/checkpoint/journal.py:"
            f"{_line_of('journal.py', 'ops.fdatasync(fd)')})",
            "checkpoint: append: fdatasync",
        ),
        (
            "claim-lookup_0",
            "run;_prepare (/w/driver/claims/prepare.py:1);build (/w/driver/claims/claim_build.py:3)",
            "claim record",
        ),
        (
            "asyncio_0",
            f"update (/w/driver/checkpoint/store.py:1);append (/w/driver/checkpoint/journal.py:"
            f"{_line_of('journal.py', 'ops.fdatasync(fd)')})",
            "checkpoint: append: fdatasync",
        ),
        (
            "asyncio_0",
            f"compact (/w/driver/checkpoint/store.py:1);atomic_write (/w/driver/checkpoint/files.py:"
            f"{_line_of('files.py', 'ops.fsync(fd)')})",
            "compaction",
        ),
        (
            "asyncio_0",
            f"update (/w/driver/checkpoint/store.py:1);atomic_write (/w/driver/checkpoint/files.py:"
            f"{_line_of('files.py', 'ops.fsync(dir_fd)')})",
            "atomic_write: fsync the directory",
        ),
        ("MainThread", "run_forever (b.py:1);_run_once (b.py:2);select (selectors.py:468)", None),
    ],
)
def test_profile_buckets(thread: str, stack: str, expected: str | None) -> None:
    got = bucket(thread, stack)
    assert (got is None) if expected is None else (got is not None and expected in got)
