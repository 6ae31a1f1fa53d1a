"""``dranet validate FILE...``: claim manifests in, one line per problem out.

Every ResourceClaim and ResourceClaimTemplate of each file is judged like the webhook and
NodePrepareResources judge it (:func:`driver.api.v1alpha1.validation.validate_object`), plus what
the apiserver's strict field validation refuses around the configs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from driver.api.v1alpha1.validation import validate_object
from driver.model.untrusted import InputError, load_yaml_documents


def validate_file(path: str) -> list[str]:
    """``file:doc: path: reason`` lines for every problem in a multi-document YAML file.

    A file that cannot be read or parsed (not UTF-8, invalid YAML, nested too deep) gives one
    line saying why, never a traceback; the caller goes on with the next file.
    """
    try:
        text = Path(path).read_text() if path != "-" else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}:0: (file): cannot read: {exc}"]
    try:
        docs = load_yaml_documents(text)
    except InputError as exc:
        return [f"{path}:0: (file): {exc}"]
    lines: list[str] = []
    for n, doc in enumerate(docs, start=1):
        if doc is None:
            continue  # an empty document ("---" at the end) is not an error
        for error in validate_object(doc):
            lines.extend(f"{path}:{n}: {e.path}: {e.reason}" for e in error.errors)
    return lines


def cli_validate(args: argparse.Namespace) -> int:
    """``dranet validate FILE...``: print every problem; exit 1 if any, else 0."""
    failed = False
    for path in args.files:
        for line in validate_file(path):
            failed = True
            print(line)
    return 1 if failed else 0
