"""Every metric the chart's Grafana dashboard and PrometheusRule query is one the driver exports:
checked against a scrape of a real `dranet run` (the ND H100 v5 fixture, a stub API server), not
against a list. Also: the process collectors (RSS, CPU, fds) and one device_healthy series per
published device are in that scrape."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.repo.test_chart import CHART, one, render
from tests.support.metrics_driver import metrics_driver

ROOT = Path(__file__).resolve().parents[2]
# Metrics the rule queries that another part of the driver exports (its state-file writer);
# listed here until they are in the scrape, and the test says when to drop the entry.
NOT_YET_EXPORTED: set[str] = set()
METRIC = re.compile(r"\b((?:dranet|process|python)_[a-z0-9_]+)\b")


@pytest.fixture(scope="module")
def scrape(nd_h100_sysfs_module: Path) -> Iterator[str]:
    """/metrics of a real driver once it has published and run a health round."""
    with metrics_driver(nd_h100_sysfs_module, "--publish-interval", "0.1", "--health-interval", "0.2") as driver:
        deadline = time.monotonic() + 60
        while True:
            text = driver.scrape()
            published = re.search(r"^dranet_driver_last_published_time_seconds (\S+)$", text, re.M)
            if published and float(published.group(1)) > 0 and "dranet_driver_device_healthy{" in text:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
        yield text


@pytest.fixture(scope="module")
def nd_h100_sysfs_module() -> Iterator[Path]:
    from devcluster.demo.allocation import build_fixture

    d = Path(tempfile.mkdtemp(prefix="dranet-dash-sysfs-"))
    try:
        yield build_fixture("nd-h100-v5", d / "sysfs")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def exported(text: str) -> set[str]:
    """Series names a query may use: each family's name as the text format writes its samples
    (counters ``_total``, histograms ``_bucket``/``_sum``/``_count``), declared even before a sample."""
    names = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text, re.M))
    for name, kind in re.findall(r"^# TYPE (\S+) (\w+)", text, re.M):
        if kind == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
        elif kind == "histogram":
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def dashboard_metrics() -> set[str]:
    dashboard = json.loads((CHART / "dashboards" / "dranet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    return {m for e in exprs for m in METRIC.findall(e)}


def test_dashboard_json_is_a_dashboard() -> None:
    dashboard = json.loads((CHART / "dashboards" / "dranet.json").read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"] and panel["gridPos"]["w"] > 0
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "job", "node"}


def test_every_dashboard_metric_is_exported(scrape: str) -> None:
    wanted = dashboard_metrics()
    assert {"process_resident_memory_bytes", "dranet_driver_device_healthy"} <= wanted
    missing = sorted(wanted - exported(scrape))
    assert not missing, f"the dashboard queries metrics the driver does not export: {missing}"


def test_every_alert_metric_is_exported(scrape: str, helm: str) -> None:
    rule = one(render(helm, "prometheus.rule.enabled=true"), "PrometheusRule")
    wanted = {m for g in rule["spec"]["groups"] for r in g["rules"] for m in METRIC.findall(r["expr"])}
    assert len(wanted) >= 5
    have = exported(scrape)
    missing = sorted(wanted - have - NOT_YET_EXPORTED)
    assert not missing, f"the PrometheusRule queries metrics the driver does not export: {missing}"
    arrived = sorted(NOT_YET_EXPORTED & have)
    assert not arrived, f"now exported: drop {arrived} from NOT_YET_EXPORTED"


def test_process_collectors_and_device_health_in_the_scrape(scrape: str) -> None:
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        value = re.search(rf"^{name} (\S+)$", scrape, re.M)
        assert value and float(value.group(1)) > 0, name
    healthy = dict(re.findall(r'^dranet_driver_device_healthy\{device="([^"]+)"\} (\S+)$', scrape, re.M))
    total = re.search(r'^dranet_driver_published_devices_total\{feature="total"\} (\S+)$', scrape, re.M)
    assert total and len(healthy) == int(float(total.group(1))) > 0
    assert set(healthy.values()) <= {"1.0", "0.0"}


def test_the_dashboard_metrics_are_documented() -> None:
    doc = (ROOT / "docs" / "reference.md").read_text()
    bases = {re.sub(r"_(bucket|sum|count)$", "", m) for m in dashboard_metrics()}
    missing = sorted(m for m in bases if f"`{m}`" not in doc)
    assert not missing, missing
