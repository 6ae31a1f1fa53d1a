"""docs/reference.md stays complete: every `dranet run` flag, published attribute and metric."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from driver.cli import build_parser
from driver.inventory import attributes
from driver.metrics import Metrics

DOC = (Path(__file__).resolve().parents[2] / "docs" / "reference.md").read_text()


def _run_flags() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return [a.option_strings[0] for a in sub.choices["run"]._actions if a.option_strings and a.dest != "help"]


def test_every_run_flag_is_documented() -> None:
    missing = [f for f in _run_flags() if f"`{f}`" not in DOC]
    assert not missing, f"docs/reference.md lacks {missing}"


def test_every_published_attribute_is_documented() -> None:
    missing = [a for a in attributes.PRIORITY if f"`{a}`" not in DOC]
    assert not missing, f"docs/reference.md lacks {missing}"


def test_every_metric_is_documented() -> None:
    metrics = Metrics()
    metrics.watch_claim_devices(lambda: (0, 0))  # the daemon's state-backed gauges
    text = generate_latest(metrics.registry).decode()
    names = re.findall(r"^# TYPE (\S+) (\w+)", text, re.M)
    missing = [n + ("_total" if kind == "counter" and not n.endswith("_total") else "") for n, kind in names]
    missing = [n for n in missing if f"`{n}`" not in DOC]
    assert names and not missing, f"docs/reference.md lacks {missing}"


def test_documented_flag_defaults_are_the_config_defaults() -> None:
    """Each default is defined once (driver.config): the reference table shows those values."""
    from driver.config import DRIVER_NAME, HOST_NETNS, default

    rows = dict(re.findall(r"^\| `(--[a-z-]+)` \| (.+?) \| ", DOC, re.M))
    for flag, field in (
        ("--driver-name", "driver_name"),
        ("--sysfs-root", "sysfs_root"),
        ("--kubelet-root", "kubelet_root"),
        ("--state-dir", "state_dir"),
        ("--runtime-dir", "runtime_dir"),
        ("--host-netns", "host_netns"),
        ("--nri-socket", "nri_socket"),
        ("--bind-address", "bind_address"),
    ):
        assert rows[flag] == f"`{default(field)}`", flag
    assert rows["--filter"] == "`" + str(default("filter")).replace("|", "\\|") + "`"
    assert default("driver_name") == DRIVER_NAME and default("host_netns") == HOST_NETNS
    assert build_parser().parse_args(["run"]).host_netns == HOST_NETNS
