"""The project's scripts under ``hack/`` loaded as modules, for the tests that check what they write."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HACK = Path(__file__).resolve().parents[2] / "hack"


def load(script: str, name: str) -> ModuleType:
    """``hack/<script>`` as module ``name`` (registered in ``sys.modules``: a dataclass there
    resolves its module by name)."""
    spec = importlib.util.spec_from_file_location(name, HACK / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
