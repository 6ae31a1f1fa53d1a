#!/usr/bin/env python3
"""Write charts/dranet/README.md from the chart's values.yaml and its comments.

values.yaml documents itself: the comment block right above a key (no blank line between)
describes it and the plain values that follow it at the same indentation up to the next blank
line, comment or mapping (``extraArgs`` .. ``extraVolumeMounts`` share one block); a comment after the value on
the same line adds to that; a key without either takes its parent's description. The table has
one row per value a user sets (a key whose value is not a mapping with keys), with its default
as YAML. ``tests/repo/test_chart_conventions.py`` fails when README.md is not what this script writes, and
when a value has no description.

helm-docs (norwoodj/helm-docs) reads only comments marked ``# --``; this chart's comments are
plain, so the few lines here read them as written.

Usage: hack/chart-readme.py [--check]
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "dranet"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


@dataclass
class Doc:
    """What the comments say about one key."""

    path: str
    text: str  # its own (or its comment group's) description; empty when it has none


def _inline_comment(rest: str) -> str:
    """A trailing ``# ...`` after a plain scalar (quotes make ``#`` part of the value)."""
    value = rest.strip()
    if value.startswith(("'", '"')):
        quote = value[0]
        end = value.find(quote, 1)
        value = value[end + 1 :] if end > 0 else ""
    match = re.search(r"\s#\s?(.*)$", " " + value)
    return match.group(1).strip() if match else ""


def comment_docs(text: str) -> dict[str, str]:
    """Key path -> description, from the comment conventions in the module doc."""
    docs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    block: list[str] = []  # comment lines waiting for their key
    group: dict[int, str] = {}  # indent -> description shared by the following keys
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            block, group = [], {}
            continue
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = KEY.match(line)
        if not match:
            block = []
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [match.group("key")])
        for deeper in [i for i in group if i > indent]:
            del group[deeper]
        if block:
            group[indent] = " ".join(block)
            block = []
        own = group.get(indent, "")
        inline = _inline_comment(match.group("rest"))
        docs[path] = " ".join(t for t in (own, inline) if t)
        stack.append((indent, match.group("key")))
        if not match.group("rest").split("#", 1)[0].strip():
            group.pop(indent, None)  # a mapping: its comment is its own, not its next siblings'

    return docs


def leaves(values: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, default) of every value a user sets: keys whose value is not a non-empty mapping."""
    out: list[tuple[str, Any]] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += leaves(value, f"{path}.")
        else:
            out.append((path, value))
    return out


def described(path: str, docs: dict[str, str]) -> str:
    """The key's description, else its nearest ancestor's."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        text = docs.get(".".join(parts[:n]), "")
        if text:
            return text
    return ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(chart: Path = CHART) -> str:
    """README.md's text."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    docs = comment_docs(text)
    rows = []
    for path, default in leaves(values):
        shown = json.dumps(default, separators=(", ", ": ")) if default is not None else "null"
        rows.append(f"| `{path}` | `{_cell(shown)}` | {_cell(described(path, docs))} |")
    name, version = meta["name"], meta["version"]
    return (
        f"""# {name} Helm chart

{" ".join(meta["description"].split())}

Chart version {version}, app version {meta["appVersion"]}; Kubernetes `{meta["kubeVersion"]}`; node kernels
{meta["annotations"]["dranet.dev/supported-kernels"]} ([what each feature needs](../../docs/install.md#kernels)).

```sh
helm install {name} oci://ghcr.io/dranet-py/charts/{name} --version {version} -n kube-system
```

See the project's [README](../../README.md) and [docs/install.md](../../docs/install.md). Every value is
checked by `values.schema.json`: a misspelt or mistyped value stops the install, naming it.

## Values

<!-- Generated from values.yaml by hack/chart-readme.py: edit the comments there, then run it. -->

| Key | Default | Description |
|-----|---------|-------------|
"""
        + "\n".join(rows)
        + "\n"
    )


def main(argv: list[str]) -> int:
    out = CHART / "README.md"
    text = render()
    if "--check" in argv:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is out of date: run hack/chart-readme.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
