"""The JSON Schema of ``dra.net/v1alpha1`` claim configs, generated from the typed config.

:func:`network_config_schema` walks the dataclasses of :mod:`~driver.api.v1alpha1.network_config`
(their fields, Python types and JSON names) and adds what the decoder enforces from its own
constants (bounds, lengths, patterns, enumerations) and a description per field.
:func:`claim_schema` puts it under ``opaque.parameters`` of ``driver: dra.net`` configs in
ResourceClaim and ResourceClaimTemplate documents, whose structure around the config is as
strict as the apiserver's strict field validation: an unknown field is refused (a ``config``
list misplaced at ``spec.spec.config`` in a template would otherwise be dropped without a word).

``hack/gen_schema.py`` writes it to ``charts/dranet/files/`` for editors (a test holds the file
to this module); ``dranet validate`` checks documents against the same schema
(:func:`document_errors`). The schema accepts every config the decoder accepts; the decoder stays
the authority for what only code can check (CIDR syntax, address families, duplicates,
combinations), and its messages are the ones given for the parameters.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from driver.api.v1alpha1 import decode, decode_interface, decode_routing, decode_sriov
from driver.api.v1alpha1 import fields as readers
from driver.api.v1alpha1 import network_config as nc
from driver.api.v1alpha1.fields import FieldError, json_type_name
from driver.config import DRIVER_NAME

if TYPE_CHECKING:
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator

JSON = dict[str, Any]
"""A JSON Schema object."""

DRAFT = "https://json-schema.org/draft/2020-12/schema"
RESOURCE_GROUP = "resource.k8s.io"
"""The API group of claims; the structure around the config is the same in its v1, v1beta2 and v1beta1."""

_IFNAME: JSON = {
    "type": "string",
    "minLength": 1,
    "maxLength": decode_interface.MAX_IFNAME_LENGTH,
    "pattern": "^[A-Za-z0-9_.-]+$",
}
_MAC: JSON = {"type": "string", "pattern": "^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$"}
_OFFLOAD_SIZE: JSON = {"type": "integer", "minimum": 1, "maximum": decode_interface.MAX_OFFLOAD_SIZE}
_TABLE: JSON = {"type": "integer", "minimum": 0, "maximum": readers.MAX_TABLE}

# (class name, Python field name) -> what the decoder adds to the field's type, and its description.
FIELD_RULES: dict[tuple[str, str], JSON] = {
    ("NetworkConfig", "interface"): {"description": "How the NIC looks inside the pod."},
    ("NetworkConfig", "routes"): {
        "description": "Routes added in the pod through this NIC.",
        "maxItems": decode.MAX_NIC_ENTRIES,
    },
    ("NetworkConfig", "rules"): {
        "description": "Policy-routing rules (ip rule) added in the pod.",
        "maxItems": decode.MAX_NIC_ENTRIES,
    },
    ("NetworkConfig", "neighbors"): {
        "description": "Permanent neighbor (ARP/NDP) entries on the NIC in the pod.",
        "maxItems": decode.MAX_NIC_ENTRIES,
    },
    ("NetworkConfig", "ethtool"): {"description": "Offload features and private flags, checked against the NIC."},
    ("NetworkConfig", "profile"): {
        "description": "A profile name for the profile provider (--profile-provider).",
        "minLength": 1,
        "maxLength": decode.MAX_PROFILE_LENGTH,
        "pattern": "^\\S+$",
    },
    ("NetworkConfig", "rdma"): {"description": "RDMA environment given to the consuming containers."},
    ("NetworkConfig", "numa"): {"description": "NUMA pinning of the consuming containers."},
    ("NetworkConfig", "sriov"): {
        "description": "An SR-IOV VF's settings, set through its PF while it is in the pod, or its driver."
    },
    ("InterfaceConfig", "name"): _IFNAME | {"description": "The interface name in the pod (default: the host's)."},
    ("InterfaceConfig", "addresses"): {
        "description": "CIDR addresses (192.0.2.5/24); default: the host's addresses and routes.",
        "items": {"type": "string", "pattern": "/"},
        "maxItems": decode.MAX_NIC_ENTRIES,
    },
    ("InterfaceConfig", "dhcp"): {"description": "Configure the NIC by DHCP in the pod (not with addresses)."},
    ("InterfaceConfig", "mtu"): {"minimum": decode_interface.MIN_MTU, "maximum": decode_interface.MAX_MTU},
    ("InterfaceConfig", "hardware_addr"): _MAC | {"description": "A unicast MAC address, six hex octets."},
    ("InterfaceConfig", "gso_max_size"): _OFFLOAD_SIZE | {"description": "gso_max_size (BIG TCP; IPv6 and default)."},
    ("InterfaceConfig", "gro_max_size"): _OFFLOAD_SIZE | {"description": "gro_max_size."},
    ("InterfaceConfig", "gso_ipv4_max_size"): _OFFLOAD_SIZE | {"description": "gso_ipv4_max_size (Linux 6.3)."},
    ("InterfaceConfig", "gro_ipv4_max_size"): _OFFLOAD_SIZE | {"description": "gro_ipv4_max_size (Linux 6.3)."},
    ("InterfaceConfig", "disable_ebpf_programs"): {"description": "Detach XDP and tcx programs in the pod."},
    ("InterfaceConfig", "forwarding"): {"description": "net.ipv{4,6}.conf.<if>.forwarding in the pod."},
    ("InterfaceConfig", "arp_ignore"): {
        "description": "net.ipv4.conf.<if>.arp_ignore in the pod.",
        "enum": list(decode_interface.ARP_IGNORE_VALUES),
    },
    ("InterfaceConfig", "arp_announce"): {
        "description": "net.ipv4.conf.<if>.arp_announce in the pod.",
        "minimum": 0,
        "maximum": decode_interface.MAX_ARP_ANNOUNCE,
    },
    ("InterfaceConfig", "vrf"): {"description": "A VRF device in the pod the NIC is enslaved to."},
    ("InterfaceConfig", "type"): {
        "description": "A sub-interface of the NIC in the pod instead of the NIC: macvlan or ipvlan (any case).",
        "pattern": "^([Mm][Aa][Cc]|[Ii][Pp])[Vv][Ll][Aa][Nn]$",
    },
    ("VrfConfig", "name"): _IFNAME | {"description": "The VRF device's name in the pod.", "required": True},
    ("VrfConfig", "table"): _TABLE
    | {"minimum": 1, "not": {"enum": sorted(decode_interface.RESERVED_TABLES)}, "description": "Its routing table."},
    ("RouteConfig", "destination"): {"description": "A network CIDR (10.0.0.0/8)."},
    ("RouteConfig", "gateway"): {"description": "An IP of the destination's family; required for universe scope."},
    ("RouteConfig", "source"): {"description": "The preferred source IP."},
    ("RouteConfig", "scope"): {
        "type": None,
        "enum": [*decode_routing.ROUTE_SCOPES, *decode_routing.ROUTE_SCOPES.values()],
        "default": "universe",
    },
    ("RouteConfig", "table"): _TABLE | {"description": "0: the main table."},
    ("RuleConfig", "priority"): {"minimum": 0, "maximum": decode_routing.MAX_RULE_PRIORITY},
    ("RuleConfig", "source"): {"description": "A CIDR.", "pattern": "/"},
    ("RuleConfig", "destination"): {"description": "A CIDR.", "pattern": "/"},
    ("RuleConfig", "table"): _TABLE | {"description": "The table to look up; 0: the main table."},
    ("NeighborConfig", "destination"): {"description": "An IP address (ipAddress is another name for it)."},
    ("NeighborConfig", "hardware_addr"): {"description": "Link-layer address: 6, 8 or 20 hex octets."},
    ("EthtoolConfig", "features"): {"propertyNames": {"minLength": 1}, "description": "feature name -> on."},
    ("EthtoolConfig", "private_flags"): {"propertyNames": {"minLength": 1}, "description": "flag name -> on."},
    ("RdmaConfig", "inject_env"): {"default": nc.RDMA_INJECT_ENV_DEFAULT},
    ("NumaConfig", "pin"): {"default": nc.NUMA_PIN_DEFAULT},
    ("SriovConfig", "vlan"): {"minimum": 0, "maximum": decode_sriov.MAX_VLAN, "description": "VLAN ID; 0: untagged."},
    ("SriovConfig", "vlan_qos"): {"minimum": 0, "maximum": decode_sriov.MAX_QOS, "description": "802.1p priority."},
    ("SriovConfig", "vlan_proto"): {"enum": list(decode_sriov.VLAN_PROTOS), "default": "802.1Q"},
    ("SriovConfig", "spoof_chk"): {"description": "The PF drops frames whose source MAC is not the VF's."},
    ("SriovConfig", "trust"): {"description": "The VF may change its MAC and go promiscuous."},
    ("SriovConfig", "min_tx_rate"): {"minimum": 0, "maximum": decode_sriov.MAX_RATE, "description": "Mbit/s."},
    ("SriovConfig", "max_tx_rate"): {"minimum": 0, "maximum": decode_sriov.MAX_RATE, "description": "Mbit/s; 0: none."},
    ("SriovConfig", "link_state"): {"enum": list(decode_sriov.LINK_STATES), "default": "auto"},
    ("SriovConfig", "driver"): {
        "enum": list(decode_sriov.VF_DRIVERS),
        "description": "vfio-pci: the VF goes to the pod on vfio-pci (its VFIO group), not as a netdev.",
    },
}

# JSON-only properties (no field of their own in the typed config), after the field named.
EXTRA_PROPERTIES: dict[str, list[tuple[str | None, str, JSON]]] = {
    "NetworkConfig": [
        (None, "apiVersion", {"enum": [nc.API_VERSION, None], "description": "Optional; if set, exactly this."}),
        (None, "kind", {"enum": [nc.KIND, None], "description": "Optional; if set, exactly this."}),
    ],
    "NeighborConfig": [("destination", "ipAddress", {"type": ["string", "null"], "description": "= destination."})],
}
OPTIONAL_IN_JSON = {("NeighborConfig", "destination")}
"""Fields the typed config requires that JSON may give under another name (``ipAddress``)."""


def _nullable(schema: JSON) -> JSON:
    """``schema`` or null: the decoder reads a null field as not set."""
    out = dict(schema)
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    elif "enum" not in out:
        return {"anyOf": [schema, {"type": "null"}]}
    return out


def _type_schema(tp: object, nested: set[type]) -> JSON:
    """The schema of a Python type of the typed config (``X | None``: the schema of ``X``)."""
    if get_origin(tp) in (Union, types.UnionType):
        (arg,) = [a for a in get_args(tp) if a is not type(None)]
        return _type_schema(arg, nested)
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is str:
        return {"type": "string"}
    if get_origin(tp) is tuple:
        return {"type": "array", "items": _type_schema(get_args(tp)[0], nested)}
    if get_origin(tp) is dict:
        return {"type": "object", "additionalProperties": _type_schema(get_args(tp)[1], nested)}
    if isinstance(tp, type) and is_dataclass(tp):
        nested.add(tp)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _merge_rule(schema: JSON, rule: JSON) -> JSON:
    out = dict(schema)
    for key, value in rule.items():
        if key == "required":
            continue
        if key == "type" and value is None:
            out.pop("type", None)
        elif key == "items" and isinstance(out.get("items"), dict):
            out["items"] = out["items"] | value
        else:
            out[key] = value
    return out


def _object_schema(cls: type, nested: set[type]) -> JSON:
    hints = get_type_hints(cls)
    properties: JSON = {}
    required: list[str] = []
    extras = EXTRA_PROPERTIES.get(cls.__name__, [])
    for _after, name, schema in (e for e in extras if e[0] is None):
        properties[name] = schema
    for f in fields(cls):
        schema = _type_schema(hints[f.name], nested)
        rule = FIELD_RULES.get((cls.__name__, f.name), {})
        schema = _merge_rule(schema, rule)
        if f.default is not MISSING and f.default is not None and "default" not in schema:
            schema["default"] = f.default
        must = (f.default is MISSING and f.default_factory is MISSING) or rule.get("required", False)
        if (cls.__name__, f.name) in OPTIONAL_IN_JSON:
            must = False
        if must:
            required.append(nc.json_name(f.name))
        # The decoder reads null as "not set": fine where a field may be left out.
        properties[nc.json_name(f.name)] = schema if must else _nullable(schema)
        for after, name, extra in extras:
            if after == f.name:
                properties[name] = extra
    doc = (cls.__doc__ or "").strip().split("\n")[0]
    out: JSON = {"type": "object", "description": doc, "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def network_config_schema() -> JSON:
    """``$defs`` of ``NetworkConfig`` and every object it holds, named by class."""
    defs: JSON = {}
    todo: set[type] = {nc.NetworkConfig}
    while todo:
        cls = todo.pop()
        if cls.__name__ in defs:
            continue
        nested: set[type] = set()
        defs[cls.__name__] = _object_schema(cls, nested)
        todo |= {c for c in nested if c.__name__ not in defs}
    return {name: defs[name] for name in sorted(defs)}


def _strict(properties: JSON, required: Iterable[str] = ()) -> JSON:
    out: JSON = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def _envelope_defs() -> JSON:
    """The Kubernetes objects from a claim document down to ``opaque.parameters`` (field names of
    resource.k8s.io/v1; requests and constraints are the apiserver's to check)."""
    ours = {"if": {"properties": {"driver": {"const": DRIVER_NAME}}, "required": ["driver"]}}
    opaque = _strict({"driver": {"type": "string"}, "parameters": {}}, ["driver", "parameters"])
    opaque |= ours | {"then": {"properties": {"parameters": {"$ref": "#/$defs/NetworkConfig"}}}}
    return {
        "ResourceClaimSpec": _strict({"devices": {"$ref": "#/$defs/DeviceClaim"}}),
        "DeviceClaim": _strict(
            {
                "requests": {"type": "array", "items": {"type": "object"}},
                "constraints": {"type": "array", "items": {"type": "object"}},
                "config": {"type": "array", "items": {"$ref": "#/$defs/DeviceClaimConfiguration"}},
            }
        ),
        "DeviceClaimConfiguration": _strict(
            {"requests": {"type": "array", "items": {"type": "string"}}, "opaque": {"$ref": "#/$defs/OpaqueConfig"}}
        ),
        "OpaqueConfig": opaque,
    }


def _document(kind: str, spec: JSON, extra: JSON) -> JSON:
    top = {
        "apiVersion": {"type": "string", "pattern": f"^{RESOURCE_GROUP}/".replace(".", "\\.")},
        "kind": {"const": kind},
        "metadata": {"type": "object"},
    }
    return _strict(top | {"spec": spec} | extra, ["apiVersion", "kind"])


def claim_schema() -> JSON:
    """The schema of a ResourceClaim or ResourceClaimTemplate document carrying ``dra.net`` configs."""
    template_spec = _strict({"metadata": {"type": "object"}, "spec": {"$ref": "#/$defs/ResourceClaimSpec"}})
    claim_spec = {"$ref": "#/$defs/ResourceClaimSpec"}
    return {
        "$schema": DRAFT,
        "title": f"ResourceClaim and ResourceClaimTemplate with {nc.API_VERSION} {nc.KIND} configs",
        "description": f"Generated from driver/api/v1alpha1 (hack/gen_schema.py); configs with driver {DRIVER_NAME}.",
        "oneOf": [
            {"$ref": "#/$defs/ResourceClaim"},
            {"$ref": "#/$defs/ResourceClaimTemplate"},
        ],
        "$defs": {
            "ResourceClaim": _document("ResourceClaim", claim_spec, {"status": {"type": "object"}}),
            "ResourceClaimTemplate": _document("ResourceClaimTemplate", template_spec, {}),
            **_envelope_defs(),
            **network_config_schema(),
        },
    }


CLAIM_KINDS = {"ResourceClaim": "spec", "ResourceClaimTemplate": "spec.spec"}
"""The documents that carry configs, and where their claim spec is."""


def _path(parts: Iterable[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _is_parameters(parts: list[str | int]) -> bool:
    """Inside ``opaque.parameters``: the decoder reports those (:func:`~driver.api.v1alpha1.decode.decode_config`)."""
    return any(parts[i : i + 2] == ["opaque", "parameters"] for i in range(len(parts) - 1))


def _reason(error: ValidationError) -> list[FieldError]:
    """The decoder's wording for one schema error (``unknown field (allowed: ...)``, ``is required``)."""
    parts = list(error.absolute_path)
    where = _path(parts) or "(document)"
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    value, instance = error.validator_value, error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        allowed = list(schema.get("properties") or {})
        unknown = [k for k in instance if k not in allowed]
        return [FieldError(_path([*parts, k]), f"unknown field (allowed: {', '.join(allowed)})") for k in unknown]
    if error.validator == "required" and isinstance(value, list) and isinstance(instance, dict):
        return [FieldError(_path([*parts, k]), "is required") for k in value if k not in instance]
    if error.validator == "type":
        return [FieldError(where, f"must be {_a(value)}, got {json_type_name(instance)}")]
    return [FieldError(where, error.message)]


def _a(kind: object) -> str:
    kinds = kind if isinstance(kind, list) else [kind]
    return " or ".join(f"an {k}" if str(k)[0] in "aeiou" else f"a {k}" for k in kinds)


@functools.cache
def _validator(kind: str) -> Validator:
    """A validator for one kind of claim document (built once per kind: it costs milliseconds)."""
    from jsonschema import Draft202012Validator  # only `dranet validate` needs it

    return Draft202012Validator({"$schema": DRAFT, "$ref": f"#/$defs/{kind}", "$defs": claim_schema()["$defs"]})


def document_errors(document: JSON) -> list[FieldError]:
    """What the apiserver's strict field validation refuses around the configs of a claim document:
    unknown fields and wrong types on the way to ``opaque.parameters`` (whose content the decoder
    judges). Objects of other kinds have nothing to say here."""
    kind = document.get("kind")
    if kind not in CLAIM_KINDS:
        return []
    out: list[FieldError] = []
    for error in sorted(_validator(kind).iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        if not _is_parameters(list(error.absolute_path)):
            out.extend(_reason(error))
    return out
