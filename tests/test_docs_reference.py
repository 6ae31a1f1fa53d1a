"""docs/reference.md stays complete: every `dranet run` flag, published attribute and metric."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from driver.inventory import attributes
from driver.cli import build_parser
from driver.metrics import Metrics

DOC = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()


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
    text = generate_latest(Metrics().registry).decode()
    names = re.findall(r"^# TYPE (\S+) (\w+)", text, re.M)
    missing = [n + ("_total" if kind == "counter" and not n.endswith("_total") else "")
               for n, kind in names]
    missing = [n for n in missing if f"`{n}`" not in DOC]
    assert names and not missing, f"docs/reference.md lacks {missing}"
