"""Untrusted JSON and YAML parsed within bounds: nesting refused before the interpreter's recursion,
integers beyond int64 kept as their digit count, keys given twice remembered, aliases that expand
or contain themselves refused; every failure an :class:`InputError` that says why."""

from __future__ import annotations

import pytest

from driver.model.untrusted import (
    MAX_DEPTH,
    MAX_VALUES,
    WRAPPED,
    DuplicateKeys,
    InputError,
    OversizedInt,
    json_depth,
    load_json,
    load_yaml_documents,
    nesting_error,
    parse_int,
)


def test_json_depth_counts_brackets_outside_strings() -> None:
    assert json_depth("{}") == 1 and json_depth('{"a": [[1], {"b": []}]}') == 4 and json_depth("1") == 0
    assert json_depth('{"a": "[[[[{{{{"}') == 1  # brackets in a string do not nest
    assert json_depth('["\\"[[["]') == 1  # nor after an escaped quote
    assert json_depth(b'["unterminated [[[[') == 1


def test_nesting_at_the_limit_parses_and_beyond_it_is_refused() -> None:
    assert load_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(InputError, match=nesting_error()):
        load_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    wrapped = "[" * (MAX_DEPTH + WRAPPED) + "]" * (MAX_DEPTH + WRAPPED)
    assert load_json(wrapped, wrapping=WRAPPED) is not None  # an envelope's levels are not the claim's
    with pytest.raises(InputError, match="nested more than 64 levels deep"):
        load_json("[" * 100_000)  # refused before the parser recurses


def test_integers_beyond_int64_are_kept_as_their_digit_count() -> None:
    assert parse_int("9223372036854775807") == 2**63 - 1 and parse_int("-9223372036854775808") == -(2**63)
    assert parse_int("9223372036854775808") == OversizedInt("9223372036854775808")
    big = load_json('{"mtu": ' + "9" * 5000 + "}")["mtu"]
    assert isinstance(big, OversizedInt) and big.digits == 5000 and not big.negative
    assert str(big) == "<integer of 5000 digits>"
    assert OversizedInt("-" + "1" * 30) != OversizedInt("1" * 30)


def test_a_key_given_twice_is_remembered() -> None:
    doc = load_json('{"a": 1, "b": 2, "a": 3}')
    assert isinstance(doc, DuplicateKeys) and doc == {"a": 3, "b": 2} and doc.duplicates == ("a",)
    assert type(load_json('{"a": 1}')) is dict


@pytest.mark.parametrize("text", ['{"a": ', "\xff", "[1,]"])
def test_what_is_not_json_says_so(text: str) -> None:
    with pytest.raises(InputError, match="not valid JSON"):
        load_json(text)


def test_yaml_documents_have_the_same_bounds_as_json() -> None:
    docs = load_yaml_documents("a: 1\na: 2\n---\nn: " + "9" * 40 + "\n---\nh: 0x10\n")
    assert isinstance(docs[0], DuplicateKeys) and docs[0].duplicates == ("a",)
    assert docs[1]["n"] == OversizedInt("9" * 40) and docs[2] == {"h": 16}
    with pytest.raises(InputError, match=r"nested more than 64 levels deep \(line \d+\)"):
        load_yaml_documents("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert load_yaml_documents("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


def test_yaml_aliases_that_expand_or_contain_themselves_are_refused() -> None:
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, n in zip("abcdef", "bcdefg", strict=True)
    )
    with pytest.raises(InputError, match=f"more than {MAX_VALUES} values"):
        load_yaml_documents(laughs)
    with pytest.raises(InputError, match="refers to a node that contains it"):
        load_yaml_documents("&a [*a]")


@pytest.mark.parametrize(
    ("text", "message"),
    [("a: [", "invalid YAML"), ("d: !!timestamp 2001-02-30", "invalid YAML value"), ("? [1]\n: x", "not a string")],
)
def test_what_is_not_yaml_says_so(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_yaml_documents(text)
