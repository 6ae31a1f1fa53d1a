"""Strict readers for JSON values that collect every field error in one pass.

The claim configuration decoder (:mod:`driver.api.v1alpha1.decode`) reads user JSON field by field.
Each reader here takes the raw value, its field path and a :class:`FieldErrors` collector; it
returns the typed value, or ``None`` after recording why the value was refused. ``None`` in the
input means "not set" and is never an error here (required fields are checked by the caller).
Collecting instead of raising lets one ``kubectl apply`` report every mistake at once.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from driver.model.untrusted import DuplicateKeys, OversizedInt

MAX_TABLE = 2**32 - 1
"""The largest routing table id (the kernel's is a u32), for a route's, a rule's and a VRF's ``table``."""


@dataclass(frozen=True)
class FieldError:
    """One problem at one field path."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class ConfigError(Exception):
    """A configuration is invalid. ``errors`` holds every problem found (at least one).

    ``ConfigError(path, reason)`` builds a single-error instance; :meth:`of` several.
    ``path``/``reason`` are those of the first error.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.errors: list[FieldError] = [FieldError(path, reason)]
        super().__init__(str(self))

    @classmethod
    def of(cls, errors: Sequence[FieldError]) -> ConfigError:
        """One exception carrying all ``errors`` (must not be empty)."""
        if not errors:
            raise ValueError("ConfigError.of needs at least one error")
        exc = cls(errors[0].path, errors[0].reason)
        exc.errors = list(errors)
        exc.args = (str(exc),)
        return exc

    @property
    def path(self) -> str:
        """The field path of the first error."""
        return self.errors[0].path

    @property
    def reason(self) -> str:
        """The reason of the first error."""
        return self.errors[0].reason

    def __str__(self) -> str:
        return "; ".join(str(e) for e in self.errors)


class FieldErrors:
    """Collects field errors so one pass reports every problem, not just the first."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, reason: str) -> None:
        """Record that the value at ``path`` is refused for ``reason``."""
        self.items.append(FieldError(path, reason))


def json_type_name(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages ("must be an object, got array")."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int in Python, not in JSON
        return "boolean"
    if isinstance(value, (int, OversizedInt)):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def shown(value: Any, limit: int = 64) -> str:
    """``value`` for a message: a short string quoted, anything else by its JSON type (a value from a
    hostile document can be arbitrarily large)."""
    if isinstance(value, str) and len(value) <= limit:
        return repr(value)
    return f"a {json_type_name(value)}" if not isinstance(value, str) else f"a string of {len(value)} characters"


def read_object(raw: Any, path: str, allowed: Iterable[str], errs: FieldErrors) -> dict[str, Any] | None:
    """``raw`` as an object with only ``allowed`` keys (unknown keys reported, then dropped)."""
    if not isinstance(raw, dict):
        errs.add(path, f"must be an object, got {json_type_name(raw)}")
        return None
    allowed = list(allowed)
    out: dict[str, Any] = {}
    report_duplicates(raw, path, errs)
    for key, value in raw.items():
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f'did you mean "{close[0]}"? ' if close else ""
            errs.add(f"{path}.{key}", f"unknown field ({hint}allowed: {', '.join(allowed)})")
        else:
            out[key] = value
    return out


def report_duplicates(raw: dict[Any, Any], path: str, errs: FieldErrors) -> None:
    """Refuse keys given twice in one object (YAML and JSON parsers silently keep the last)."""
    for key in raw.duplicates if isinstance(raw, DuplicateKeys) else ():
        errs.add(f"{path}.{key}", "is given more than once in the same object")


def read_bool(raw: Any, path: str, errs: FieldErrors) -> bool | None:
    """A JSON boolean (``1`` and ``"true"`` are refused)."""
    if raw is None or isinstance(raw, bool):
        return raw
    errs.add(path, f"must be a boolean, got {json_type_name(raw)}")
    return None


def read_str(raw: Any, path: str, errs: FieldErrors) -> str | None:
    """A JSON string."""
    if raw is None or isinstance(raw, str):
        return raw
    errs.add(path, f"must be a string, got {json_type_name(raw)}")
    return None


def read_int(raw: Any, path: str, errs: FieldErrors, lo: int, hi: int) -> int | None:
    """A JSON integer in ``[lo, hi]``."""
    if raw is None:
        return None
    # bool is an int in Python but not in JSON; 1500.0 from a JSON number is accepted as 1500.
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, OversizedInt):
        errs.add(path, f"must be between {lo} and {hi}, got an integer of {raw.digits} digits")
        return None
    if isinstance(raw, bool) or not isinstance(raw, int):
        errs.add(path, f"must be an integer, got {json_type_name(raw)}")
        return None
    if not lo <= raw <= hi:
        shown = str(raw) if abs(raw) < 10**24 else f"an integer of {len(str(abs(raw)))} digits"
        errs.add(path, f"must be between {lo} and {hi}, got {shown}")
        return None
    return raw


def read_ip(raw: Any, path: str, errs: FieldErrors) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A JSON string holding one IPv4 or IPv6 address (no prefix length)."""
    text = read_str(raw, path, errs)
    if text is None:
        return None
    if "%" in text:
        errs.add(path, f"{text!r} has a zone (%...): the zone of an address in a pod is its interface")
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        errs.add(path, f"{text!r} is not an IP address")
        return None


def read_bool_map(raw: Any, path: str, errs: FieldErrors) -> dict[str, bool] | None:
    """An object of ``name: boolean`` (names non-empty, without whitespace)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errs.add(path, f"must be an object of name: boolean, got {json_type_name(raw)}")
        return None
    out: dict[str, bool] = {}
    report_duplicates(raw, path, errs)
    for key, value in raw.items():
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            errs.add(f"{path}.{key}", "name must be non-empty without whitespace")
            continue
        if not isinstance(value, bool):
            errs.add(f"{path}.{key}", f"must be a boolean, got {json_type_name(value)}")
            continue
        out[key] = value
    return out
