"""The declared architecture and style hold: import-linter contracts and ruff, as configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["driver", "tests", "bench", "devcluster", "harness", "hack", "examples"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept() -> None:
    """The layering of docs/architecture.md (contracts in pyproject.toml [tool.importlinter])."""
    # lint-imports' own entry point, run with this interpreter so the work tree's driver is read.
    out = _run("-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())", "--no-cache")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command: list[str]) -> None:
    """``ruff check`` and ``ruff format --check`` (settings in pyproject.toml [tool.ruff])."""
    out = _run("-m", "ruff", *command, *SOURCES)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


COMPLEXITY_RULES = ("C901", "PLR0912", "PLR0915")


def test_complexity_limits_hold_in_the_driver_without_exceptions() -> None:
    """A function a reader follows in one go (docs/architecture.md "Conventions"): ruff's McCabe
    complexity (C901) at most 12, branches (PLR0912) at most 12, statements (PLR0915) at most 50,
    in force for driver/ with no per-file ignore and no ``noqa`` for them. Modules are sized by
    feature, not by line count."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert set(COMPLEXITY_RULES) <= set(config["select"])
    assert config["mccabe"]["max-complexity"] == 12
    assert (config["pylint"]["max-branches"], config["pylint"]["max-statements"]) == (12, 50)
    for pattern, ignored in config["per-file-ignores"].items():
        assert not (pattern.startswith("driver") and set(COMPLEXITY_RULES) & set(ignored)), pattern
    waived = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "driver").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "noqa" in line and any(rule in line for rule in COMPLEXITY_RULES)
    ]
    assert not waived, waived
