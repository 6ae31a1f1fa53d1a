"""The Go driver's ``--filter`` syntax: CEL over ``attributes``, a map of ``v1.DeviceAttribute``.

dranet (kubernetes-sigs/dranet, ``cmd/dranet``) compiles its filter in an environment with one
variable, ``attributes``: the device's attributes keyed by qualified name (``"dra.net/type"``),
each a Kubernetes ``DeviceAttribute`` with the fields ``IntValue``, ``BoolValue``,
``StringValue`` and ``VersionValue``::

    !("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth"

Here each attribute is a CEL map holding only its set field, so ``has(a.StringValue)`` is true
exactly when dranet's is (a non-nil field). Differences, both on expressions dranet's type
checker would accept: reading a field of another type (``.IntValue`` of a string attribute) is an
evaluation error here (the device is kept, as for any evaluation error), where dranet reads the
zero value; and list-valued attributes (``resource.kubernetes.io/numaNode`` with
``DRAListTypeAttributes``) have no scalar field. A field name that is not one of the four fails
at start, as dranet's type check does.
"""

from __future__ import annotations

import re
from typing import Any

from driver.model.device import ATTRIBUTE_DOMAIN, Device

VARIABLE = "attributes"
"""The one variable of dranet's filter environment."""
FIELDS = ("IntValue", "BoolValue", "StringValue", "VersionValue")
"""The fields of a ``v1.DeviceAttribute`` a dranet filter may read."""

_STRING_LITERAL = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
# ``].Name`` not followed by ``(``: a field read on an indexed value (``attributes["x"].Name``).
_FIELD_AFTER_INDEX = re.compile(r"\]\s*\.\s*([A-Za-z_]\w*)\b(?!\s*\()")


def unknown_fields(expression: str) -> list[str]:
    """Field names read on ``attributes[...]`` that a ``DeviceAttribute`` does not have, in order."""
    code = _STRING_LITERAL.sub('""', expression)  # a "]." inside a string literal is no field read
    found = [m.group(1) for m in _FIELD_AFTER_INDEX.finditer(code)]
    return [name for name in found if name not in FIELDS]


def _field(value: Any) -> dict[str, Any]:
    """The one set field of a ``DeviceAttribute`` holding ``value`` (none for a list)."""
    if isinstance(value, bool):  # before int: bool is a subclass of int
        return {"BoolValue": value}
    if isinstance(value, int):
        return {"IntValue": value}
    if isinstance(value, str):
        return {"StringValue": value}
    return {}


def dranet_attributes(device: Device) -> dict[str, dict[str, Any]]:
    """dranet's view of a device: ``{"dra.net/type": {"StringValue": "device"}, ...}``.

    Names without a domain are qualified with ``dra.net``, as the API server reads them.
    """
    return {
        (name if "/" in name else f"{ATTRIBUTE_DOMAIN}/{name}"): _field(value)
        for name, value in device.attributes.items()
    }
