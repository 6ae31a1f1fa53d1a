"""Decoding of ``routes``, ``rules`` and ``neighbors`` of a ``dra.net`` config (part of :mod:`.decode`).

What the pod's routing gets through the NIC: routes (``ip route``), policy rules (``ip rule``)
and permanent neighbor entries (``ip neigh ... nud permanent``). Errors name the field path.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any, TypeVar

from driver.api.v1alpha1.fields import MAX_TABLE, FieldErrors, json_type_name, read_int, read_ip, read_object, read_str
from driver.api.v1alpha1.network_config import NeighborConfig, RouteConfig, RuleConfig

T = TypeVar("T")
MAX_RULE_PRIORITY = 32767  # dranet's bound (the kernel takes any u32)
ROUTE_SCOPES = {"universe": 0, "link": 253}  # the scopes a claim's route may name
# A neighbor's link-layer address: 6 (Ethernet), 8 (EUI-64) or 20 (IPoIB) octets, ':' or '-' between them.
_LLADDR_RE = re.compile(r"[0-9a-fA-F]{2}(?:([:-])[0-9a-fA-F]{2})(?:\1[0-9a-fA-F]{2})*")
LLADDR_OCTETS = (6, 8, 20)


def _decode_list(
    raw: Any, path: str, errs: FieldErrors, what: str, item: Callable[[Any, str, FieldErrors], T | None]
) -> list[tuple[int, T]] | None:
    """A JSON array decoded item by item: (index, value) of the items accepted."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        errs.add(path, f"must be an array of {what}, got {json_type_name(raw)}")
        return None
    decoded = ((i, item(v, f"{path}[{i}]", errs)) for i, v in enumerate(raw))
    return [(i, v) for i, v in decoded if v is not None]


def _route_destination(raw: Any, path: str, errs: FieldErrors) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A route's ``destination``: a network CIDR (no host bits), required."""
    text = read_str(raw, path, errs)
    if raw is None:
        errs.add(path, "is required (a CIDR, e.g. 10.0.0.0/8 or 0.0.0.0/0)")
    elif text is not None and "%" in text:
        errs.add(path, f"{text!r} has a zone (%...): a route's destination has none")
    elif text is not None:
        try:
            return ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            errs.add(path, f"{text!r} is not a network CIDR ({exc})")
    return None


def _route_scope(raw: Any, path: str, errs: FieldErrors) -> int | None:
    """A route's ``scope``: universe (0, the default) or link (253), by name or number."""
    if raw is None:
        return 0
    if isinstance(raw, str):
        scope = ROUTE_SCOPES.get(raw)
        if scope is None:
            errs.add(path, f"{raw!r} is not a supported scope (universe, link, 0, 253)")
        return scope
    number = read_int(raw, path, errs, 0, 255)
    if number is not None and number not in ROUTE_SCOPES.values():
        errs.add(path, f"{number} is not a supported scope (0 universe or 253 link)")
        return None
    return number


def _decode_route(raw: Any, path: str, errs: FieldErrors) -> RouteConfig | None:
    obj = read_object(raw, path, ["destination", "gateway", "source", "scope", "table"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    dest = _route_destination(obj.get("destination"), f"{path}.destination", errs)
    gateway = read_ip(obj.get("gateway"), f"{path}.gateway", errs)
    source = read_ip(obj.get("source"), f"{path}.source", errs)
    scope = _route_scope(obj.get("scope"), f"{path}.scope", errs)
    table = read_int(obj.get("table"), f"{path}.table", errs, 0, MAX_TABLE)
    if scope == 0 and gateway is None and obj.get("gateway") is None:
        errs.add(f"{path}.gateway", "is required for a universe-scope route (or set scope: link)")
    if dest is not None:
        for name, addr in (("gateway", gateway), ("source", source)):
            if addr is not None and addr.version != dest.version:
                errs.add(f"{path}.{name}", f"IPv{addr.version} address for an IPv{dest.version} destination")
    if len(errs.items) != before or dest is None:
        return None
    return RouteConfig(
        destination=dest.with_prefixlen,
        gateway=str(gateway) if gateway else None,
        source=str(source) if source else None,
        scope=scope or 0,
        table=table or 0,
    )


def decode_routes(raw: Any, path: str, errs: FieldErrors) -> tuple[RouteConfig, ...] | None:
    """``routes``: each route decoded; a (destination, table) pair listed twice is refused."""
    items = _decode_list(raw, path, errs, "routes", _decode_route)
    if items is None:
        return None
    routes: list[RouteConfig] = []
    seen: set[tuple[str, int]] = set()
    for i, route in items:
        key = (route.destination, route.table)
        if key in seen:
            errs.add(f"{path}[{i}].destination", f"{route.destination} in table {route.table} is listed twice")
            continue
        seen.add(key)
        routes.append(route)
    return tuple(routes)


def _rule_network(raw: Any, path: str, errs: FieldErrors) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """A rule's ``source``/``destination``: a CIDR; host bits are dropped (the kernel matches the prefix)."""
    text = read_str(raw, path, errs)
    if text is None:
        return None
    if "/" not in text or "%" in text:
        errs.add(path, f"{text!r} is not a CIDR (write e.g. 192.0.2.0/24, or 192.0.2.5/32 for one address)")
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        errs.add(path, f"{text!r} is not a CIDR")
        return None


def _decode_rule(raw: Any, path: str, errs: FieldErrors) -> RuleConfig | None:
    obj = read_object(raw, path, ["priority", "source", "destination", "table"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    priority = read_int(obj.get("priority"), f"{path}.priority", errs, 0, MAX_RULE_PRIORITY)
    source = _rule_network(obj.get("source"), f"{path}.source", errs)
    destination = _rule_network(obj.get("destination"), f"{path}.destination", errs)
    table = read_int(obj.get("table"), f"{path}.table", errs, 0, MAX_TABLE)
    if source is not None and destination is not None and source.version != destination.version:
        errs.add(path, f"source {source} and destination {destination} are of different IP families")
    if len(errs.items) != before:
        return None
    return RuleConfig(
        priority=priority,
        source=None if source is None else source.with_prefixlen,
        destination=None if destination is None else destination.with_prefixlen,
        table=table,
    )


def decode_rules(raw: Any, path: str, errs: FieldErrors) -> tuple[RuleConfig, ...] | None:
    """``rules``: each rule decoded; the same rule listed twice is refused (the kernel would refuse the second)."""
    items = _decode_list(raw, path, errs, "rules", _decode_rule)
    if items is None:
        return None
    seen: set[RuleConfig] = set()
    for i, rule in items:
        if rule in seen:
            errs.add(f"{path}[{i}]", "the same rule is listed twice")
        seen.add(rule)
    return tuple(dict.fromkeys(rule for _, rule in items))


def _decode_lladdr(raw: Any, path: str, errs: FieldErrors) -> str | None:
    text = read_str(raw, path, errs)
    if text is None:
        return None
    octets = len(text.replace("-", ":").split(":"))
    if not _LLADDR_RE.fullmatch(text) or octets not in LLADDR_OCTETS:
        errs.add(path, f"{text!r} is not a link-layer address (6, 8 or 20 hex octets separated by ':')")
        return None
    return text.replace("-", ":").lower()


def _decode_neighbor(raw: Any, path: str, errs: FieldErrors) -> NeighborConfig | None:
    # "ipAddress" is what dranet's documentation writes (its decoder only knows "destination").
    obj = read_object(raw, path, ["destination", "ipAddress", "hardwareAddr"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    key = "destination"
    if obj.get("ipAddress") is not None:
        key = "ipAddress"
        if obj.get("destination") is not None:
            errs.add(f"{path}.ipAddress", "is another name for destination: give only one of them")
    for name in (key, "hardwareAddr"):
        if obj.get(name) is None:
            errs.add(f"{path}.{name}", "is required")
    ip = read_ip(obj.get(key), f"{path}.{key}", errs)
    lladdr = _decode_lladdr(obj.get("hardwareAddr"), f"{path}.hardwareAddr", errs)
    if len(errs.items) != before or ip is None or lladdr is None:
        return None
    return NeighborConfig(destination=str(ip), hardware_addr=lladdr)


def decode_neighbors(raw: Any, path: str, errs: FieldErrors) -> tuple[NeighborConfig, ...] | None:
    """``neighbors``: permanent entries; one destination listed twice is refused."""
    items = _decode_list(raw, path, errs, "neighbors", _decode_neighbor)
    if items is None:
        return None
    seen: set[str] = set()
    out = []
    for i, neighbor in items:
        if neighbor.destination in seen:
            errs.add(f"{path}[{i}]", f"{neighbor.destination} is listed twice")
            continue
        seen.add(neighbor.destination)
        out.append(neighbor)
    return tuple(out)
