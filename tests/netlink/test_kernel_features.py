"""The kernel floor: releases parsed, features judged by version or asked of the kernel, the start
report, the metrics, and where the floor is written (the doctor's view: tests/kubectl/test_doctor_checks.py)."""

from __future__ import annotations

import logging
import socket

import pytest

from driver.metrics import Metrics
from driver.netlink import kernel_features
from driver.netlink.kernel_features import FLOOR, KernelFeatures, detect, parse_release


def _no_rdma() -> socket.socket:
    raise OSError(93, "Protocol not supported")


@pytest.mark.parametrize(
    ("release", "version"),
    [
        ("6.1.0-56-amd64", (6, 1, 0)),
        ("5.14.0-427.13.1.el9_4.x86_64", (5, 14, 0)),
        ("5.15.0-1064-azure", (5, 15, 0)),
        ("6.18.44-fc-v657", (6, 18, 44)),
        ("6.8", (6, 8, 0)),
        ("garbage", (0, 0, 0)),
    ],
)
def test_releases_parse_as_distributions_write_them(release: str, version: tuple[int, int, int]) -> None:
    assert parse_release(release) == version


def test_features_by_version_across_the_kernels_clusters_run() -> None:
    rhel9 = detect(release="5.14.0-427.13.1.el9_4.x86_64", rdma_socket=_no_rdma)
    assert not rhel9.below_floor
    assert [f.name for f in rhel9.missing()] == ["moveIfindex", "ipv4BigTcp", "tcx", "rdmaNetlink"]
    debian = detect(release="6.1.0-56-amd64", rdma_socket=_no_rdma)
    assert [f.name for f in debian.missing()] == ["ipv4BigTcp", "tcx", "rdmaNetlink"]
    assert detect(release="6.8.0-45-generic").has("tcx")
    assert detect(release="4.18.0-553.el8_10.x86_64").below_floor  # RHEL 8
    assert KernelFeatures("6.1.0").has("anything")  # an unknown feature is taken as present


def test_a_feature_made_unavailable_is_the_older_kernels_view() -> None:
    kernel = detect(release="6.18.44")
    older = kernel.without("moveIfindex")
    assert kernel.has("moveIfindex") and not older.has("moveIfindex")
    assert [f.name for f in older.missing()] == ["moveIfindex", *[f.name for f in kernel.missing()]]


def test_start_report_is_an_error_below_the_floor(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "driver.netlink.kernel_features"):
        kernel_features.report(detect(release="4.19.0", rdma_socket=_no_rdma))
        kernel_features.report(detect(release="6.1.0", rdma_socket=_no_rdma))
    below, fine = caplog.records
    assert below.levelno == logging.ERROR and below.kv["release"] == "4.19.0"  # type: ignore[attr-defined]
    assert fine.levelno == logging.INFO and set(fine.kv["missing"]) == {"ipv4BigTcp", "tcx", "rdmaNetlink"}  # type: ignore[attr-defined]
    assert "needs Linux 6.3" in fine.kv["missing"]["ipv4BigTcp"]  # type: ignore[attr-defined]


def test_metrics_say_the_kernel_and_each_feature() -> None:
    metrics = Metrics()
    kernel = detect(release="6.1.0-56-amd64", rdma_socket=_no_rdma)
    metrics.set_kernel(kernel.release, "5.10", not kernel.below_floor, {f.name: f.available for f in kernel.features})
    text = metrics.render().decode()
    assert 'dranet_driver_kernel_info{floor="5.10",release="6.1.0-56-amd64",supported="true"} 1.0' in text
    assert 'dranet_driver_kernel_feature{feature="ipv4BigTcp"} 0.0' in text
    assert 'dranet_driver_kernel_feature{feature="moveIfindex"} 1.0' in text


def test_the_floor_is_written_where_admins_read_it() -> None:
    """README, the chart (annotation and its README) and docs/install.md say the floor the driver checks."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    floor = f"Linux {FLOOR[0]}.{FLOOR[1]}"
    chart = yaml.safe_load((root / "charts/dranet/Chart.yaml").read_text())
    assert chart["annotations"]["dranet.dev/supported-kernels"] == f"{floor} and newer"
    assert f"{floor} and newer" in (root / "charts/dranet/README.md").read_text()
    assert f"**{floor} and newer**" in (root / "docs/install.md").read_text().replace("Supported: ", "")
    assert f"**Linux\n{FLOOR[0]}.{FLOOR[1]} or newer**" in (root / "README.md").read_text()
