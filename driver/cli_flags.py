"""Command-line conventions shared by ``dranet`` and ``kubectl dranet``.

- Help shows every flag's default and the environment variable it is also read from.
- Every flag can come from a ``DRANET_<FLAG>`` environment variable (``--state-dir`` from
  ``DRANET_STATE_DIR``), as dra-example-driver's flags come from theirs; the command line wins.
  A variable's value goes through the flag's own type and choices, and a bad one is refused
  naming the variable.
- Global flags (``--log-level``, ...) are accepted before and after the subcommand.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

ENV_PREFIX = "DRANET_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_NO_ENV = (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)


class EnvError(ValueError):
    """A ``DRANET_*`` variable whose value its flag refuses (the message names the variable)."""


def env_var(action: argparse.Action, prefix: str = ENV_PREFIX) -> str | None:
    """The environment variable of a flag: its first long option, upper snake case."""
    if isinstance(action, _NO_ENV):
        return None
    longs = [o for o in action.option_strings if o.startswith("--")]
    if not longs:
        return None
    return prefix + longs[0][2:].upper().replace("-", "_")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X; env DRANET_X)`` to each flag's help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or isinstance(action, _NO_ENV) or text == argparse.SUPPRESS:
            return text
        notes = []
        if isinstance(action, argparse._StoreConstAction | argparse._StoreTrueAction | argparse._StoreFalseAction):
            pass  # a switch: its default is "not given"
        elif action.default is not argparse.SUPPRESS and "default:" not in text:
            notes.append("default: " + _shown(action.default))
        env = getattr(action, "env_var", None)
        if env:
            notes.append(f"env {env}")
        return f"{text} ({'; '.join(notes)})" if notes else text


def _shown(value: Any) -> str:
    """A default as help prints it (``%`` doubled: help strings are %-formatted)."""
    if value is None or value == "" or value == []:
        text = "none"
    elif isinstance(value, list | tuple):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    return text.replace("%", "%%")


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from _parsers(sub)


def _bool(env: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(f"{env}={raw!r}: expected true or false")


def _converted(action: argparse.Action, env: str, raw: str) -> Any:
    convert: Callable[[str], Any] = action.type if callable(action.type) else str
    try:
        value = convert(raw)
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise EnvError(f"{env}={raw!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise EnvError(f"{env}={raw!r}: invalid choice (choose from {choices})")
    return value


def apply_env(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Give each flag of ``parser`` and its subcommands the value of its ``DRANET_*`` variable as
    default (the command line still wins); record the variable's name for the help.

    Flags whose default is ``SUPPRESS`` (the global flags repeated on subcommands) are read on the
    top-level parser only. Raises :class:`EnvError` for a value the flag refuses.
    """
    environ = os.environ if environ is None else environ
    for p in _parsers(parser):
        for action in p._actions:
            env = env_var(action)
            if env is None or action.default is argparse.SUPPRESS:
                continue
            action.env_var = env  # type: ignore[attr-defined]
            raw = environ.get(env)
            if raw is None:
                continue
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                action.default = action.const if _bool(env, raw) else not action.const
            elif isinstance(action, argparse._AppendAction):
                action.default = [_converted(action, env, raw)]
            else:
                action.default = _converted(action, env, raw)
            action.required = False  # the variable gave it


def add_global_flags(
    parser: argparse.ArgumentParser,
    subparsers: Iterator[argparse.ArgumentParser] | list[argparse.ArgumentParser],
    add: Callable[[argparse.ArgumentParser | argparse._ArgumentGroup, bool], None],
) -> None:
    """``add(target, top)`` on the top-level parser (``top``: real defaults) and on each subcommand
    (defaults ``SUPPRESS``, so a flag given before the subcommand is not reset by it)."""
    add(parser, True)
    for sub in subparsers:
        add(sub.add_argument_group("global flags (also accepted before the subcommand)"), False)
