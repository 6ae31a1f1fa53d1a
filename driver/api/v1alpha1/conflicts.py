"""Settings two NICs of one claim cannot share: interface name, static address, MAC (and a VRF's
name or table that contradict another NIC's).

All NICs of a claim go into the same pod namespace, so two of them with the same name, the
same address or the same MAC make pod start fail (or worse, half succeed). The webhook and
``dranet validate`` check the requests of a claim spec, NodePrepareResources the devices it
was allocated; both report the config entry that set the second value, by its field path.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError, FieldError
from driver.api.v1alpha1.merge import request_matches
from driver.api.v1alpha1.network_config import NetworkConfig

INTERFACE_FIELDS = ("name", "addresses", "hardwareAddr")


@dataclass(frozen=True)
class Conflict:
    """Two NICs (named by their request) that would get the same ``field`` value."""

    field: str
    value: str
    first: str
    second: str
    first_request: str
    request: str  # the request of ``second``: where its value comes from
    reason: str = ""  # the message, when "would both get" does not say it (VRFs)


def _values(config: NetworkConfig, field: str) -> list[str]:
    if field == "hardwareAddr":  # the interface's own or the one its PF gives a VF
        return [config.pod_mac.lower()] if config.pod_mac else []
    iface = config.interface
    if iface is None:
        return []
    if field == "name":
        return [iface.name] if iface.name else []
    if field == "vrf":
        return [iface.vrf.name] if iface.vrf and iface.vrf.name else []
    # An address is the same address whatever its prefix length.
    return [str(ipaddress.ip_interface(a).ip) for a in iface.addresses or ()]


def interface_conflicts(nics: Sequence[tuple[str, str, NetworkConfig]]) -> list[Conflict]:
    """``(label, request, config)`` per NIC -> every value a later NIC repeats, once per pair."""
    out: list[Conflict] = []
    for field in INTERFACE_FIELDS:
        seen: dict[str, tuple[str, str]] = {}
        for label, request, config in nics:
            for value in dict.fromkeys(_values(config, field)):
                if value in seen and seen[value][0] != label:
                    out.append(Conflict(field, value, seen[value][0], label, seen[value][1], request))
                else:
                    seen.setdefault(value, (label, request))
    return out + _vrf_conflicts(nics)


def _vrf_conflicts(nics: Sequence[tuple[str, str, NetworkConfig]]) -> list[Conflict]:
    """NICs of one pod naming one VRF share it: a VRF named like another NIC, or given two tables."""
    out: list[Conflict] = []
    names = {v: (label, request) for label, request, config in nics for v in _values(config, "name")}
    tables: dict[str, tuple[int, str, str]] = {}
    for label, request, config in nics:
        vrf = config.interface.vrf if config.interface else None
        if vrf is None or not vrf.name:
            continue
        if vrf.name in names and names[vrf.name][0] != label:
            first, first_request = names[vrf.name]
            why = f"{label} wants VRF {vrf.name!r}, the interface name of {first}: the pod cannot have both"
            out.append(Conflict("vrf", vrf.name, first, label, first_request, request, why))
        if vrf.table is None:
            continue
        table, first, first_request = tables.setdefault(vrf.name, (vrf.table, label, request))
        if table != vrf.table:
            why = f"{first} and {label} share VRF {vrf.name!r} but give it tables {table} and {vrf.table}"
            out.append(Conflict("vrf", vrf.name, first, label, first_request, request, why))
    return out


def source_index(configs: list[Any], request: str, driver: str, field: str) -> int | None:
    """Index in ``configs`` of the entry that gives ``request`` its ``interface.<field>``: the last
    applicable one setting it (class configs before claim configs, as prepare merges them)."""
    indexed = [(i, c) for i, c in enumerate(configs or []) if isinstance(c, dict)]
    indexed.sort(key=lambda item: 0 if item[1].get("source") == "FromClass" else 1)
    found = None
    for i, entry in indexed:
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        if not request_matches(entry.get("requests"), request):
            continue
        try:
            if _values(decode_config(opaque.get("parameters"), ""), field):
                found = i
        except ConfigError:
            continue  # reported by the decode itself
    return found


def _field_path(entry: Any, field: str) -> str:
    """Where in a config entry's parameters ``field`` was set (a VF's MAC may come from ``sriov.mac``)."""
    if field == "hardwareAddr":
        try:
            config = decode_config(entry["opaque"].get("parameters"), "")
        except (ConfigError, KeyError, TypeError, AttributeError):
            return f"interface.{field}"
        if not (config.interface and config.interface.hardware_addr) and config.sriov and config.sriov.mac:
            return "sriov.mac"
    return f"interface.{field}"


def conflict_errors(conflicts: Sequence[Conflict], configs: list[Any], driver: str, base: str) -> list[FieldError]:
    """One error per conflict, at the field path of the config entry that set the repeated value."""
    errors = []
    for c in conflicts:
        index = source_index(configs, c.request, driver, c.field)
        path = base
        if index is not None:
            path = f"{base}[{index}].opaque.parameters.{_field_path(configs[index], c.field)}"
        what = {"name": "interface name", "addresses": "address", "hardwareAddr": "MAC address"}.get(c.field)
        shared = f"{c.first} and {c.second} would both get {what} {c.value!r}: each NIC in a pod needs its own"
        reason = c.reason or shared
        errors.append(FieldError(path, reason))
    return errors
