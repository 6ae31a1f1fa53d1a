"""Every runtime dependency in pyproject.toml is imported by the installed driver (``driver/``,
``dranet_proto/``), eagerly or lazily: a dependency nothing imports only makes the image bigger."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules() -> set[str]:
    """Top-level names of every module imported anywhere in the shipped packages (also in functions)."""
    out: set[str] = set()
    for package in ("driver", "dranet_proto"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    out.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    out.add(node.module.split(".")[0])
    return out


def test_every_runtime_dependency_is_imported() -> None:
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    by_distribution: dict[str, set[str]] = {}
    for module, distributions in importlib.metadata.packages_distributions().items():
        for dist in distributions:
            by_distribution.setdefault(re.sub(r"[-_.]+", "-", dist).lower(), set()).add(module)
    imported = imported_modules()
    unused = []
    for requirement in requirements:
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]).lower()
        modules = by_distribution.get(name)
        assert modules, f"{name} is not installed here (pip install it: the test needs its module names)"
        if not modules & imported:
            unused.append(f"{name} (provides {', '.join(sorted(modules))})")
    assert not unused, f"runtime dependencies nothing in driver/ imports: {unused}"
