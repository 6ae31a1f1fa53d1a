"""The declared architecture and style hold: import-linter contracts and ruff, as configured in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["driver", "tests", "bench", "devcluster", "hack", "examples"]


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


MAX_MODULE_LINES = 400


def test_no_driver_module_is_over_400_lines() -> None:
    """A module does one job (docs/architecture.md): past 400 lines it is doing several; split it
    by what each part does (the generated protobuf stubs live outside driver/)."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "driver").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long
