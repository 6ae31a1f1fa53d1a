"""Claim-level validation of ``dra.net`` configs: the admission webhook and ``dranet validate``.

:func:`validate_claim_spec` is the one validator the webhook (:mod:`driver.webhook`) and the CLI
(:func:`cli_validate`) share. It decodes each ``dra.net`` config with
:func:`driver.claims.decode.decode_config` (the decoder NodePrepareResources runs too) and adds
the checks only a whole claim allows: per-device settings on a request that can allocate
several NICs.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.claims.conflicts import conflict_errors, interface_conflicts
from driver.claims.decode import decode_config
from driver.claims.fields import ConfigError, json_type_name
from driver.claims.merge import configs_for_request, request_matches
from driver.config import DRIVER_NAME
from driver.model.network_config import NetworkConfig
from driver.model.untrusted import InputError, load_yaml_documents


def _multi_device_requests(devices: dict[str, Any]) -> dict[str, str]:
    """Requests (and subrequests) that may allocate several devices -> why."""
    out: dict[str, str] = {}
    for req in devices.get("requests") or []:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            continue
        subs = (
            [(req["name"], req.get("exactly"))]
            if req.get("exactly")
            else [(f"{req['name']}/{s.get('name')}", s) for s in req.get("firstAvailable") or [] if isinstance(s, dict)]
        )
        for name, spec in subs:
            if not isinstance(spec, dict):
                continue
            if spec.get("allocationMode") == "All":
                out[name] = "allocationMode All"
            elif isinstance(spec.get("count"), int) and spec["count"] > 1:
                out[name] = f"count {spec['count']}"
    return out


def validate_claim_spec(spec: Any, path: str, driver_name: str = DRIVER_NAME) -> list[ConfigError]:
    """Validate the ``dra.net`` configs of a ResourceClaim spec (or a template's ``spec.spec``).

    Returns one :class:`ConfigError` per problem (empty when valid). Configs for other
    drivers are ignored. Besides decoding, it refuses per-device settings (interface name,
    addresses, MAC) on a request that can allocate several devices: every NIC would get the
    same name or address in the pod and the second one would fail at pod start.
    """
    if not isinstance(spec, dict):
        return [ConfigError(path, f"must be an object, got {json_type_name(spec)}")]
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return []
    configs = devices.get("config")
    if not isinstance(configs, list):
        return []
    multi = _multi_device_requests(devices)
    problems: list[ConfigError] = []
    for i, entry in enumerate(configs):
        if not isinstance(entry, dict):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver_name:
            continue
        ppath = f"{path}.devices.config[{i}].opaque.parameters"
        try:
            config = decode_config(opaque.get("parameters"), ppath)
        except ConfigError as exc:
            problems.extend(ConfigError(e.path, e.reason) for e in exc.errors)
            continue
        problems.extend(_per_device_conflicts(config, entry.get("requests"), multi, ppath))
    problems.extend(_cross_request_conflicts(devices, configs, path, driver_name))
    return problems


def _request_names(devices: dict[str, Any]) -> list[str]:
    """Every request and subrequest name of a claim (``nic``, ``gpu/a100``)."""
    names = []
    for req in devices.get("requests") or []:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            continue
        subs = [s.get("name") for s in req.get("firstAvailable") or [] if isinstance(s, dict)]
        names += [f"{req['name']}/{s}" for s in subs if isinstance(s, str)] or [req["name"]]
    return names


def _cross_request_conflicts(
    devices: dict[str, Any], configs: list[Any], path: str, driver_name: str
) -> list[ConfigError]:
    """Two requests of one claim whose NICs would get the same name, address or MAC in the pod."""
    nics = []
    for name in _request_names(devices):
        try:
            nics.append((f"request {name!r}", name, configs_for_request(configs, name, driver_name)))
        except ConfigError:
            continue  # already reported by the decode above
    # Subrequests of one request are alternatives: only one of them is ever allocated.
    conflicts = [c for c in interface_conflicts(nics) if c.first_request.split("/", 1)[0] != c.request.split("/", 1)[0]]
    errors = conflict_errors(conflicts, configs, driver_name, f"{path}.devices.config")
    return [ConfigError(e.path, e.reason) for e in errors]


def _per_device_conflicts(config: NetworkConfig, requests: Any, multi: dict[str, str], ppath: str) -> list[ConfigError]:
    """Errors for interface settings that cannot be shared by the several NICs of one request."""
    iface = config.interface
    if iface is None:
        return []
    targets = [r for r in multi if request_matches(requests, r)]
    if not targets:
        return []
    out = []
    for fname, value in (("name", iface.name), ("addresses", iface.addresses), ("hardwareAddr", iface.hardware_addr)):
        if value:
            req = targets[0]
            out.append(
                ConfigError(
                    f"{ppath}.interface.{fname}",
                    f"applies to request {req!r} ({multi[req]}), which can allocate several NICs; "
                    "each would get the same value and pod start would fail (use one request per NIC)",
                )
            )
    return out


_CLAIM_KINDS = {"ResourceClaim": "spec", "ResourceClaimTemplate": "spec.spec"}


def validate_object(obj: Any) -> list[ConfigError]:
    """Validate one manifest; objects other than ResourceClaim(Template) are accepted as is."""
    if not isinstance(obj, dict):
        return [ConfigError("(document)", f"must be an object, got {json_type_name(obj)}")]
    kind = obj.get("kind")
    if kind not in _CLAIM_KINDS:
        return []
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, dict) else None
    if spec is None:
        return []
    return validate_claim_spec(spec, _CLAIM_KINDS[kind])


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
        if isinstance(doc, dict) and doc.get("kind") in _CLAIM_KINDS:
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
