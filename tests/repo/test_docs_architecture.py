"""docs/architecture.md's module table is the packages' and modules' docstrings, as
hack/gen_module_table.py renders them: it cannot drift from the code."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.hack_scripts import load

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    return load("gen_module_table.py", "gen_module_table")


def test_the_committed_module_table_is_what_the_generator_writes() -> None:
    gen = _generator()
    doc = gen.DOC.read_text()
    assert gen.rewritten(doc) == doc, "run `make module-table` and commit docs/architecture.md"


def test_every_package_and_module_of_the_driver_has_a_row_and_a_description() -> None:
    gen = _generator()
    table = "\n".join(gen.rows())
    packages = [p.parent for p in (ROOT / "driver").rglob("__init__.py") if p.parent != ROOT / "driver"]
    for package in packages:
        assert f"| `{package.relative_to(ROOT)}/` |" in table, package
        for module in package.glob("*.py"):
            if module.name not in gen.SKIPPED:
                assert gen.first_sentence(gen.docstring(module)), f"{module.relative_to(ROOT)} has no docstring"
                assert f"`{module.stem}` (" in table, module


def test_every_package_and_module_of_the_tooling_has_a_row_and_a_description() -> None:
    gen = _generator()
    table = "\n".join(gen.tooling_rows())
    for name in gen.TOOLING:
        for init in (ROOT / name).rglob("__init__.py"):
            package = init.parent
            assert f"| `{package.relative_to(ROOT)}/` |" in table, package
            assert gen.first_paragraph(gen.docstring(init)), f"{init.relative_to(ROOT)} has no docstring"
            for module in package.glob("*.py"):
                if module.name not in gen.SKIPPED:
                    assert gen.first_sentence(gen.docstring(module)), f"{module.relative_to(ROOT)} has no docstring"
                    assert f"`{module.stem}` (" in table, module
