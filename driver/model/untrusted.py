"""Parsing untrusted JSON and YAML documents within bounds, the same way everywhere.

Claim configs reach the driver three ways: ``dranet validate`` reads YAML files, the admission
webhook reads an AdmissionReview body, NodePrepareResources reads the claim from the API server
(whose opaque ``parameters`` are kept as the user sent them). All three parse here, so the same
hostile input gets the same clear error, and none can crash the parser:

- nesting deeper than :data:`MAX_DEPTH` is refused before it can exhaust the interpreter's
  recursion (``InputError: nested more than 64 levels deep``);
- an integer literal outside the int64 range becomes an :class:`OversizedInt` (Python refuses to
  parse more than 4300 digits, and converting thousands costs quadratic time); the claim config
  decoder then reports it at its field path, like any out-of-range value;
- an object with a key given twice becomes a :class:`DuplicateKeys` (a ``dict`` holding the last
  value, as JSON parsers do, that remembers which keys were repeated), which the decoder refuses
  at its field path instead of silently keeping one of the values;
- a YAML document whose aliases repeat what they name into more than :data:`MAX_VALUES` values
  (a few hundred bytes can stand for billions: "billion laughs") is refused before anything walks
  or prints it; a JSON text is bounded by its own size.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted in a document (a claim needs about 10)."""
INT64_DIGITS = 19
"""Digits of the largest int64 (9223372036854775807): more can never fit."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_VALUES = 100_000
"""Values (scalars and collections, aliases counted each time they are used) in one YAML document;
a claim has a few hundred."""

# A string, or an unterminated one to the end of the text: every '"' that opens a string is consumed
# with it in one possessive pass (never retried from the next quote), so the scan is linear in the
# text whatever it holds: '"' followed by thousands of '\"' costs what any text of that size costs.
_STRINGS = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class InputError(ValueError):
    """A document cannot be parsed (or is out of bounds); the message says why, without a traceback."""


class OversizedInt:
    """An integer literal that does not fit in 64 bits, kept as its digit count (never converted)."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("+-").replace("_", ""))
        self.negative = text.startswith("-")

    def __repr__(self) -> str:
        return f"<integer of {self.digits} digits>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OversizedInt) and (other.digits, other.negative) == (self.digits, self.negative)

    def __hash__(self) -> int:
        return hash((OversizedInt, self.digits, self.negative))


class DuplicateKeys(dict[Any, Any]):
    """An object in which some keys were given more than once (the last value is kept)."""

    duplicates: tuple[Any, ...] = ()


def nesting_error(limit: int = MAX_DEPTH) -> str:
    """The one wording of the nesting limit, for every path that enforces it."""
    return f"nested more than {limit} levels deep"


def json_depth(data: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped), in C-speed passes,
    each linear in the text."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    brackets = _STRINGS.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(_DEPTH_STEP[b] for b in brackets), default=0)


def parse_int(text: str) -> int | OversizedInt:
    """An integer literal as ``int``, or :class:`OversizedInt` when it cannot be an int64."""
    if len(text.lstrip("+-").replace("_", "")) > INT64_DIGITS:
        return OversizedInt(text)
    value = int(text)
    return value if INT64_MIN <= value <= INT64_MAX else OversizedInt(text)


def _object(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    counts: dict[Any, int] = {}
    for key, _ in pairs:
        counts[key] = counts.get(key, 0) + 1
    dup = DuplicateKeys(out)
    dup.duplicates = tuple(k for k, n in counts.items() if n > 1)
    return dup


WRAPPED = 2
"""Levels an object gains inside an AdmissionReview (review, request) or a LIST (list, items): the
same claim must meet the same limit however it arrives."""


def load_json(data: bytes | str, max_depth: int = MAX_DEPTH, wrapping: int = 0) -> Any:
    """Parse one JSON document within the bounds above; :class:`InputError` when it cannot be.

    ``wrapping``: levels of envelope around the objects the limit is about (:data:`WRAPPED`).
    """
    if json_depth(data) > max_depth + wrapping:
        raise InputError(nesting_error(max_depth))
    try:
        return json.loads(data, object_pairs_hook=_object, parse_int=parse_int)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InputError(f"not valid JSON: {exc}") from None


def load_yaml_documents(text: str, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document of a YAML stream (safe types only) within the same bounds as :func:`load_json`.

    Nesting is counted while composing (PyYAML composes recursively, so the limit is checked
    before the interpreter's recursion limit can be hit); integers and duplicate keys become
    :class:`OversizedInt` and :class:`DuplicateKeys` like in JSON. :class:`InputError` names the
    line of the problem.
    """
    import yaml  # imported here: only `dranet validate` reads YAML

    loader = _bounded_loader(max_depth)
    try:
        docs = list(yaml.load_all(text, Loader=loader))
    except InputError:
        raise
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise InputError(nesting_error(max_depth)) from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor's own error: 2001-02-30, !!float x
        raise InputError(f"invalid YAML value: {exc}") from None
    if _has_cycle(docs):
        raise InputError("invalid YAML: an alias (*name) refers to a node that contains it")
    for doc in docs:
        if _expands_beyond(doc, MAX_VALUES):
            raise InputError(f"a document expands to more than {MAX_VALUES} values (aliases repeat what they name)")
    return docs


def _bounded_loader(max_depth: int) -> type[yaml.SafeLoader]:
    """A SafeLoader class counting nesting while it composes, with :class:`OversizedInt` and
    :class:`DuplicateKeys` for integers and mappings."""
    import yaml  # imported here: only `dranet validate` reads YAML

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.ScalarEvent, yaml.AliasEvent):  # only collections nest, as in JSON
                return super().compose_node(parent, index)
            self.depth += 1
            try:
                if self.depth > max_depth:
                    mark = self.peek_event().start_mark
                    raise InputError(f"{nesting_error(max_depth)} (line {mark.line + 1})")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_yaml_int(self, node: Any) -> Any:
            text = self.construct_scalar(node)
            digits = text.lstrip("+-").replace("_", "")
            if digits.isdigit() and len(digits) > INT64_DIGITS:
                return OversizedInt(text)
            value = super().construct_yaml_int(node)  # hex, octal, binary, base 60: short texts, any size
            return value if INT64_MIN <= value <= INT64_MAX else OversizedInt(text)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            pairs = [(self.construct_object(k, deep=deep), self.construct_object(v, deep=deep)) for k, v in node.value]
            try:
                return _object(pairs)
            except TypeError:  # an unhashable key (a list as a key): what SafeLoader says, as an InputError
                raise InputError(f"a mapping key is not a string (line {node.start_mark.line + 1})") from None

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:map", _yaml_map)
    loader: type[yaml.SafeLoader] = BoundedLoader
    return loader


def _expands_beyond(value: Any, limit: int) -> bool:
    """Whether ``value`` holds more than ``limit`` values when every alias is expanded; stops counting
    at the limit (acyclic input: :func:`_has_cycle` ran first)."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _has_cycle(value: Any) -> bool:
    """Whether ``value`` contains itself (YAML aliases can do that; JSON cannot). Linear in the
    distinct containers: a document of shared aliases (billion laughs) is not expanded."""
    done: set[int] = set()
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        if leaving:
            open_.discard(id(item))
            done.add(id(item))
            continue
        if not isinstance(item, (dict, list)) or id(item) in done:
            continue
        if id(item) in open_:
            return True
        open_.add(id(item))
        stack.append((item, True))
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        stack.extend((child, False) for child in children)
    return False


def _yaml_map(loader: Any, node: Any) -> Any:
    """SafeLoader's map constructor, but through :meth:`construct_mapping` (duplicate keys kept)."""
    loader.flatten_mapping(node)
    return loader.construct_mapping(node)
