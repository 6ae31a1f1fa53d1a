"""The admin device filter: a CEL expression over ``device`` in DeviceClass selector syntax.

``device.driver``, ``device.attributes["dra.net"].type``,
``device.attributes["resource.kubernetes.io"].pciBusID``. As in Kubernetes, both known attribute
domains are always present (possibly empty), so ``has(device.attributes["dra.net"].type)`` is the
safe way to test for an attribute. Semantics follow the Go driver: an evaluation error (e.g. a
missing key) keeps the device (logged at debug); a non-bool result drops it.
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
from driver.model.device import STANDARD_DOMAIN, Device

log = logging.getLogger(__name__)


def _load_cel() -> ModuleType:
    """The ``cel`` Rust extension, loaded without the package's ``__init__``.

    ``import cel`` also imports its interactive CLI (prompt_toolkit), about 150 ms of a
    ``dranet discover`` run; the extension alone loads in about 15 ms. Falls back to the normal
    import if the package layout ever changes.
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


class DeviceFilter:
    """A compiled admin filter; an empty expression keeps every device."""

    def __init__(self, expression: str, driver_name: str = DRIVER_NAME) -> None:
        self.expression = expression.strip()
        self.driver_name = driver_name
        self._program = None
        if self.expression:
            try:
                self._program = _load_cel().compile(self.expression)
            except Exception as err:
                raise FilterError(f"--filter: invalid CEL expression: {err}") from err

    def keep(self, device: Device) -> bool:
        """Whether ``device`` passes the filter."""
        if self._program is None:
            return True
        try:
            result = self._program.execute({"device": cel_device(device, self.driver_name)})
        except Exception as err:  # noqa: BLE001 - like the Go driver: an eval error keeps the device
            log.debug(
                "filter evaluation failed, keeping device", extra={"kv": {"device": device.name, "error": str(err)}}
            )
            return True
        if not isinstance(result, bool):
            log.warning(
                "filter returned a non-bool, dropping device",
                extra={"kv": {"device": device.name, "result": repr(result)}},
            )
            return False
        return result

    def apply(self, devices: list[Device]) -> list[Device]:
        """The devices that pass, in their original order."""
        if self._program is None:
            return list(devices)
        return [d for d in devices if self.keep(d)]
