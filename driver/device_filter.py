"""The admin device filter: a CEL expression over ``device`` in DeviceClass selector syntax.

``device.driver``, ``device.attributes["dra.net"].type``,
``device.attributes["resource.kubernetes.io"].pciBusID``. As in Kubernetes, both known attribute
domains are always present (possibly empty), so ``has(device.attributes["dra.net"].type)`` is the
safe way to test for an attribute. Semantics follow the Go driver: an evaluation error (e.g. a
missing key) keeps the device (logged at debug); a non-bool result drops it.
"""

from __future__ import annotations

import logging
from typing import Any

import cel

from driver.model import DRIVER_NAME, STANDARD_DOMAIN, Device

log = logging.getLogger(__name__)


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
                self._program = cel.compile(self.expression)
            except Exception as err:  # noqa: BLE001 - cel raises ValueError/RuntimeError variants
                raise FilterError(f"--filter: invalid CEL expression: {err}") from err

    def keep(self, device: Device) -> bool:
        """Whether ``device`` passes the filter."""
        if self._program is None:
            return True
        try:
            result = self._program.execute({"device": cel_device(device, self.driver_name)})
        except Exception as err:  # noqa: BLE001 - like the Go driver: an eval error keeps the device
            log.debug("filter evaluation failed, keeping device",
                      extra={"kv": {"device": device.name, "error": str(err)}})
            return True
        if not isinstance(result, bool):
            log.warning("filter returned a non-bool, dropping device",
                        extra={"kv": {"device": device.name, "result": repr(result)}})
            return False
        return result

    def apply(self, devices: list[Device]) -> list[Device]:
        """The devices that pass, in their original order."""
        if self._program is None:
            return list(devices)
        return [d for d in devices if self.keep(d)]
