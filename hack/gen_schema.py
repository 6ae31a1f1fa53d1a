"""Write the JSON Schema of claims with ``dra.net/v1alpha1`` configs for editors.

Run ``make schema`` after changing ``driver/api/v1alpha1``. The file ships with the chart
(``charts/dranet/files/``); point an editor at it, e.g. with a first line
``# yaml-language-server: $schema=<path or URL of the file>`` in a claim manifest.
tests/api/v1alpha1/test_schema.py fails if the committed file differs from what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from driver.api.v1alpha1.schema import claim_schema  # noqa: E402 - after the path is set

SCHEMA_FILE = ROOT / "charts" / "dranet" / "files" / "dranet-claims-v1alpha1.schema.json"


def render() -> str:
    """The file's text: the schema as indented JSON."""
    return json.dumps(claim_schema(), indent=2) + "\n"


def main() -> int:
    SCHEMA_FILE.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_FILE.write_text(render())
    print(SCHEMA_FILE.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
