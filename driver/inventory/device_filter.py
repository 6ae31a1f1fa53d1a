"""The admin device filter (``--filter``): a CEL expression in one of two syntaxes.

- DeviceClass selector syntax, over ``device``: ``device.driver``,
  ``device.attributes["dra.net"].type``, ``device.attributes["resource.kubernetes.io"].pciBusID``.
  As in Kubernetes, both known attribute domains are always present (possibly empty), so
  ``has(device.attributes["dra.net"].type)`` is the safe way to test for an attribute.
- The Go driver's syntax, over ``attributes`` (see :mod:`driver.inventory.dranet_filter`):
  ``attributes["dra.net/type"].StringValue == "device"``, so its users' ``--filter`` values work
  unchanged.

The syntax is told by the variables the expression reads; an expression reading both is refused.
Semantics follow the Go driver: an evaluation error (e.g. a missing key) keeps the device
(logged at debug). A non-bool result keeps the device in dranet's syntax (as the Go driver does)
and drops it in the DeviceClass syntax (a selector must be a bool).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

from driver.config import DRIVER_NAME
from driver.inventory import dranet_filter
from driver.model.device import STANDARD_DOMAIN, Device

log = logging.getLogger(__name__)


def _load_cel() -> ModuleType:
    """The ``cel`` Rust extension, loaded without the package's ``__init__``.

    ``import cel`` also imports its interactive CLI (prompt_toolkit), ten times what the extension
    alone takes to load (docs/performance.md, "Small costs the code's choices rest on"). Falls back
    to the normal import if the package layout ever changes.
    """
    # The extension may only be initialised once per process (it installs a logger).
    for name in ("cel.cel", "cel"):
        if name in sys.modules:
            return sys.modules[name]
    try:
        spec = importlib.util.find_spec("cel")
        directory = os.path.dirname(spec.origin) if spec and spec.origin else ""
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        so = next(f for f in os.listdir(directory) if f.startswith("cel.") and f.endswith(suffixes))
        ext_spec = importlib.util.spec_from_file_location("cel.cel", os.path.join(directory, so))
        if ext_spec is None or ext_spec.loader is None:
            raise ImportError("no loader for the cel extension")
        module = importlib.util.module_from_spec(ext_spec)
        ext_spec.loader.exec_module(module)
        sys.modules["cel.cel"] = module
        return module
    except (ImportError, OSError, StopIteration):
        import cel

        return cel


class FilterError(ValueError):
    """The filter expression does not compile; the message names the flag and the reason."""


def cel_device(device: Device, driver_name: str = DRIVER_NAME) -> dict[str, Any]:
    """The CEL view of a device: ``{"driver", "attributes": {domain: {name: value}}, "capacity"}``."""
    domains: dict[str, dict[str, Any]] = {DRIVER_NAME: {}, STANDARD_DOMAIN: {}}
    for qualified, value in device.attributes.items():
        domain, _, name = qualified.rpartition("/")
        domains.setdefault(domain or DRIVER_NAME, {})[name] = value
    return {"driver": driver_name, "attributes": domains, "capacity": {}}


DEVICECLASS, DRANET = "deviceclass", "dranet"
"""The two syntaxes of :class:`DeviceFilter` (its ``syntax``)."""


def _syntax(expression: str, variables: list[str], flag: str = "--filter") -> str:
    """Which syntax ``expression`` is written in; :class:`FilterError` when it cannot be both."""
    if dranet_filter.VARIABLE not in variables:
        return DEVICECLASS
    if "device" in variables:
        raise FilterError(
            f"{flag}: the expression reads both `device` (DeviceClass syntax, "
            'device.attributes["dra.net"].type) and `attributes` (dranet syntax, '
            'attributes["dra.net/type"].StringValue): use one'
        )
    unknown = dranet_filter.unknown_fields(expression)
    if unknown:
        raise FilterError(
            f"{flag}: attributes[...].{unknown[0]}: a DeviceAttribute has no such field "
            f"(fields: {', '.join(dranet_filter.FIELDS)})"
        )
    return DRANET


class DeviceFilter:
    """A compiled admin filter; an empty expression keeps every device.

    ``syntax`` is :data:`DEVICECLASS` or :data:`DRANET` (the Go driver's ``attributes`` form);
    ``flag``: the flag errors name (the sharing filter is written in the same language).
    """

    def __init__(self, expression: str, driver_name: str = DRIVER_NAME, flag: str = "--filter") -> None:
        self.expression = expression.strip()
        self.driver_name = driver_name
        self.syntax = DEVICECLASS
        self._program = None
        if self.expression:
            try:
                self._program = _load_cel().compile(self.expression)
            except Exception as err:
                raise FilterError(f"{flag}: invalid CEL expression: {err}") from err
            self.syntax = _syntax(self.expression, list(self._program.variables()), flag)

    def _context(self, device: Device) -> dict[str, Any]:
        if self.syntax == DRANET:
            return {dranet_filter.VARIABLE: dranet_filter.dranet_attributes(device)}
        return {"device": cel_device(device, self.driver_name)}

    def keep(self, device: Device, missing: bool = True) -> bool:
        """Whether ``device`` passes the filter; ``missing``: the answer when evaluating fails (a
        missing attribute): the admin filter keeps the device, as the Go driver does."""
        if self._program is None:
            return True
        try:
            result = self._program.execute(self._context(device))
        except Exception as err:  # noqa: BLE001 - like the Go driver: an eval error keeps the device
            log.debug(
                "filter evaluation failed",
                extra={"kv": {"device": device.name, "error": str(err), "result": missing}},
            )
            return missing
        if not isinstance(result, bool):
            keep = self.syntax == DRANET  # the Go driver keeps it; a DeviceClass selector must be a bool
            log.warning(
                "filter returned a non-bool, " + ("keeping" if keep else "dropping") + " device",
                extra={"kv": {"device": device.name, "result": repr(result)}},
            )
            return keep
        return result

    def apply(self, devices: list[Device]) -> list[Device]:
        """The devices that pass, in their original order."""
        if self._program is None:
            return list(devices)
        return [d for d in devices if self.keep(d)]
