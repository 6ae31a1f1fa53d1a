"""``dranet validate FILE...``: claim manifests in, one line per problem out.

Every ResourceClaim and ResourceClaimTemplate of each file is judged like the webhook and
NodePrepareResources judge it (:func:`driver.api.v1alpha1.validation.validate_object`), plus what
the apiserver's strict field validation refuses around the configs. A problem names the file,
the line of the field, the document and the field path; success says what was checked.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.api.v1alpha1.schema import CLAIM_KINDS
from driver.api.v1alpha1.validation import validate_object
from driver.config import DRIVER_NAME
from driver.model.untrusted import InputError, load_yaml_documents


@dataclass
class FileReport:
    """What ``dranet validate`` found in one file: problem lines and what was checked."""

    problems: list[str] = field(default_factory=list)
    claims: int = 0  # ResourceClaims and ResourceClaimTemplates
    configs: int = 0  # their opaque configs for the driver


def _config_count(obj: dict[str, Any], driver_name: str = DRIVER_NAME) -> int:
    spec = obj.get("spec")
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, dict) else None
    devices = spec.get("devices") if isinstance(spec, dict) else None
    configs = devices.get("config") if isinstance(devices, dict) else None
    return sum(
        1
        for c in configs or []
        if isinstance(c, dict) and isinstance(c.get("opaque"), dict) and c["opaque"].get("driver") == driver_name
    )


_PATH_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def field_line(document: Any, field_path: str) -> int | None:
    """1-based line of ``field_path`` (``spec.devices.config[0].opaque``) in a composed YAML
    document: the line of its key (or list item), else of the deepest part of it that exists
    (a misspelt key: the key itself; a missing one: its parent's)."""
    import yaml

    if document is None:
        return None
    node, line = document, document.start_mark.line + 1
    tokens = [(m.group(1), m.group(2)) for m in _PATH_TOKEN.finditer(field_path)]
    i = 0
    while i < len(tokens):
        key, index = tokens[i]
        if index is not None and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
            node, i = node.value[int(index)], i + 1
            line = node.start_mark.line + 1
            continue
        if key is None or not isinstance(node, yaml.MappingNode):
            break
        # A key may hold dots itself (a sysctl name): try the longest run of tokens first.
        for end in range(len(tokens), i, -1):
            if any(t[1] is not None for t in tokens[i:end]):
                continue
            name = ".".join(str(t[0]) for t in tokens[i:end])
            match = next((kv for kv in node.value if getattr(kv[0], "value", None) == name), None)
            if match is not None:
                line, node, i = match[0].start_mark.line + 1, match[1], end
                break
        else:
            break
    return line


def _composed(text: str) -> list[Any]:
    """The documents as YAML node trees (for line numbers); empty when composing fails."""
    import yaml

    try:
        return list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except (yaml.YAMLError, RecursionError):
        return []


def _describe(doc: Any, n: int) -> str:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    name = meta.get("name") or meta.get("generateName") if isinstance(meta, dict) else None
    kind = doc.get("kind") if isinstance(doc, dict) else None
    what = " ".join(str(x) for x in (kind, name) if x)
    return f"document {n}" + (f" ({what})" if what else "")


def validate_file(path: str) -> FileReport:
    """Every problem in a multi-document YAML file, as ``file:line: document N (Kind name):
    field.path: reason`` lines, and how many claims and configs were checked.

    A file that cannot be read or parsed (not UTF-8, invalid YAML, nested too deep) gives one
    line saying why, never a traceback; the caller goes on with the next file.
    """
    report = FileReport()
    try:
        text = Path(path).read_text() if path != "-" else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        report.problems.append(f"{path}: cannot read: {reason}")
        return report
    try:
        docs = load_yaml_documents(text)
    except InputError as exc:
        report.problems.append(f"{path}: {exc}")
        return report
    nodes: list[Any] | None = None
    for n, doc in enumerate(docs, start=1):
        if doc is None:
            continue  # an empty document ("---" at the end) is not an error
        if isinstance(doc, dict) and doc.get("kind") in CLAIM_KINDS:
            report.claims += 1
            report.configs += _config_count(doc)
        errors = [e for error in validate_object(doc) for e in error.errors]
        if errors and nodes is None:
            nodes = [d for d in _composed(text) if d is not None]
        for e in errors:
            line = field_line(nodes[n - 1], e.path) if nodes and n <= len(nodes) else None
            where = f"{path}:{line}" if line else path
            report.problems.append(f"{where}: {_describe(doc, n)}: {e.path}: {e.reason}")
    return report


def cli_validate(args: argparse.Namespace) -> int:
    """``dranet validate FILE...``: every problem on stdout and exit 1, else ``ok: N claims, M configs``."""
    claims = configs = 0
    problems: list[str] = []
    for path in args.files:
        report = validate_file(path)
        problems += report.problems
        claims, configs = claims + report.claims, configs + report.configs
    for line in problems:
        print(line)
    if problems:
        return 1
    print(f"ok: {claims} claim{'s' if claims != 1 else ''}, {configs} config{'s' if configs != 1 else ''}")
    return 0
