"""The "May import" paragraph of each package of ``driver/`` says what the package imports, and the
import-linter contracts allow it: the prose cannot drift from the code or from pyproject.toml.

The paragraph names each package or top-level module of ``driver/`` that the package imports, as
``driver.<name>``, exactly those (a sentence from "never" on names what it must not import); each
one sits on a lower floor of the layers contract of ``driver``.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "driver"
NAMED = re.compile(r"``driver\.([a-z_0-9]+)")
NEVER = re.compile(r"\b[Nn]ever\b")
PACKAGES = sorted(p.parent.name for p in DRIVER.glob("*/__init__.py"))
TOP = {p.stem for p in DRIVER.glob("*.py") if p.name != "__init__.py"} | set(PACKAGES)


def _floors() -> dict[str, int]:
    """driver.<name> -> its floor in the layers contract of driver (0 the top)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c.get("type") == "layers" and "driver.config" in c["layers"]]
    return {name.strip().removeprefix("driver."): i for i, layer in enumerate(layers) for name in layer.split("|")}


def _imported(package: str) -> set[str]:
    """The other packages and top-level modules of driver/ that ``package``'s modules import."""
    out: set[str] = set()
    for path in (DRIVER / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [f"{node.module}.{a.name}" for a in node.names] if node.module == "driver" else [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] == "driver" and len(parts) > 1 and parts[1] in TOP and parts[1] != package:
                    out.add(parts[1])
    return out


def _paragraph(package: str) -> tuple[set[str], set[str]]:
    """(the names the package may import, the names it must never) from its docstring."""
    doc = ast.get_docstring(ast.parse((DRIVER / package / "__init__.py").read_text())) or ""
    start = doc.find("May import:")
    assert start >= 0, f"driver/{package}/__init__.py has no 'May import:' paragraph"
    paragraph = doc[start:].split("\n\n", 1)[0]
    never = NEVER.search(paragraph)
    may, must_not = (paragraph[: never.start()], paragraph[never.start() :]) if never else (paragraph, "")
    return set(NAMED.findall(may)), set(NAMED.findall(must_not))


@pytest.mark.parametrize("package", PACKAGES)
def test_the_may_import_paragraph_names_what_the_package_imports(package: str) -> None:
    may, _ = _paragraph(package)
    imported = _imported(package)
    assert not imported - may, f"driver/{package}/__init__.py omits {sorted(imported - may)}"
    assert not may - imported, f"driver/{package}/__init__.py names {sorted(may - imported)}, which it does not import"


@pytest.mark.parametrize("package", PACKAGES)
def test_what_the_paragraph_allows_the_contracts_allow(package: str) -> None:
    may, must_not = _paragraph(package)
    floors = _floors()
    above = sorted(name for name in may if floors[name] <= floors[package])
    assert not above, f"driver/{package} may import {above}, not below it in pyproject.toml's layers"
    assert not must_not & _imported(package)
    assert all(floors[name] <= floors[package] for name in must_not), f"driver/{package}: {sorted(must_not)}"
