"""Strict decoding of a ``dra.net`` opaque config into a :class:`~driver.model.network_config.NetworkConfig`.

Users put the config in ``spec.devices.config[].opaque.parameters`` of a ResourceClaim (or a
DeviceClass) with ``opaque.driver: dra.net``. The same decoder runs in three places so a mistake
is reported identically everywhere: the admission webhook and ``dranet validate FILE...`` (both
through :mod:`driver.claims.validation`) and NodePrepareResources (:mod:`driver.claims.prepare`,
through :func:`driver.claims.merge.configs_for_request`). It runs once per claim: what prepare
decodes is stored typed in the checkpoint and never decoded again.

Decoding is strict: unknown fields and wrong types are errors, and every error names the full
field path (``spec.devices.config[1].opaque.parameters.interface.mtu``) and the reason.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from driver.claims.fields import (
    ConfigError,
    FieldErrors,
    json_type_name,
    read_bool,
    read_bool_map,
    read_int,
    read_ip,
    read_object,
    read_str,
)
from driver.model.network_config import (
    API_VERSION,
    KIND,
    EthtoolConfig,
    InterfaceConfig,
    NetworkConfig,
    NumaConfig,
    RdmaConfig,
    RouteConfig,
)

MAX_IFNAME_LENGTH = 15  # IFNAMSIZ - 1
MIN_MTU = 68  # RFC 791 minimum; the kernel refuses less for IPv4
MAX_MTU = 65536  # the largest max_mtu any Linux netdev reports (loopback)
MAX_ROUTE_TABLE = 2**32 - 1
ROUTE_SCOPES = {"universe": 0, "link": 253}  # the scopes a claim's route may name
# Matched with fullmatch: "$" would also accept a trailing newline ("net1\n").
_IFNAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
RESERVED_IFNAMES = frozenset({"all", "default"})
"""Names that collide with the kernel's per-interface sysctl directories
(``/proc/sys/net/ipv4/conf/{all,default}``): the kernel refuses to rename a NIC so."""


def _decode_ifname(raw: Any, path: str, errs: FieldErrors) -> str | None:
    name = read_str(raw, path, errs)
    if name is None:
        return None
    if not name:
        errs.add(path, "must not be empty")
    elif len(name) > MAX_IFNAME_LENGTH:
        errs.add(path, f"{name!r} is {len(name)} characters; Linux allows at most {MAX_IFNAME_LENGTH}")
    elif name in (".", ".."):
        errs.add(path, f"{name!r} is not a valid interface name")
    elif name in RESERVED_IFNAMES:
        errs.add(path, f"{name!r} is reserved (the kernel's per-interface settings use 'all' and 'default')")
    elif not _IFNAME_RE.fullmatch(name):
        errs.add(path, f"{name!r} may contain only letters, digits, '-', '_' and '.'")
    elif name == "lo":
        # Every pod namespace already has "lo"; the rename would fail at pod start.
        errs.add(path, "'lo' already exists in every pod network namespace")
    else:
        return name
    return None


def _decode_mac(raw: Any, path: str, errs: FieldErrors) -> str | None:
    mac = read_str(raw, path, errs)
    if mac is None:
        return None
    if not _MAC_RE.fullmatch(mac):
        errs.add(path, f"{mac!r} is not a MAC address (six hex octets separated by ':')")
        return None
    first = int(mac[:2], 16)
    if first & 1:
        errs.add(path, f"{mac!r} is a multicast address; a NIC needs a unicast address")
        return None
    if int(mac.replace(":", ""), 16) == 0:
        errs.add(path, "the all-zero MAC address cannot be assigned")
        return None
    return mac.lower()


def _decode_interface(raw: Any, path: str, errs: FieldErrors) -> InterfaceConfig | None:
    obj = read_object(raw, path, ["name", "addresses", "mtu", "hardwareAddr"], errs)
    if obj is None:
        return None
    addresses: tuple[str, ...] | None = None
    if obj.get("addresses") is not None:
        raw_addrs = obj["addresses"]
        if not isinstance(raw_addrs, list):
            errs.add(f"{path}.addresses", f"must be an array of CIDR strings, got {json_type_name(raw_addrs)}")
        else:
            seen: set[str] = set()
            out: list[str] = []
            for i, item in enumerate(raw_addrs):
                ipath = f"{path}.addresses[{i}]"
                text = read_str(item, ipath, errs)
                if text is None:
                    if item is None:
                        errs.add(ipath, "must be a CIDR string, got null")
                    continue
                if "/" not in text:
                    errs.add(ipath, f"{text!r} has no prefix length (write e.g. 192.0.2.5/24)")
                    continue
                if "%" in text:
                    errs.add(ipath, f"{text!r} has a zone (%...): the zone of an address in a pod is its interface")
                    continue
                try:
                    iface = ipaddress.ip_interface(text)
                except ValueError:
                    errs.add(ipath, f"{text!r} is not a CIDR address")
                    continue
                canonical = iface.with_prefixlen
                if canonical in seen:
                    errs.add(ipath, f"{text!r} is listed twice")
                    continue
                seen.add(canonical)
                out.append(canonical)
            addresses = tuple(out)
    return InterfaceConfig(
        name=_decode_ifname(obj.get("name"), f"{path}.name", errs),
        addresses=addresses,
        mtu=read_int(obj.get("mtu"), f"{path}.mtu", errs, MIN_MTU, MAX_MTU),
        hardware_addr=_decode_mac(obj.get("hardwareAddr"), f"{path}.hardwareAddr", errs),
    )


def _decode_route(raw: Any, path: str, errs: FieldErrors) -> RouteConfig | None:
    obj = read_object(raw, path, ["destination", "gateway", "source", "scope", "table"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    dest_text = read_str(obj.get("destination"), f"{path}.destination", errs)
    dest = None
    if obj.get("destination") is None:
        errs.add(f"{path}.destination", "is required (a CIDR, e.g. 10.0.0.0/8 or 0.0.0.0/0)")
    elif dest_text is not None and "%" in dest_text:
        errs.add(f"{path}.destination", f"{dest_text!r} has a zone (%...): a route's destination has none")
    elif dest_text is not None:
        try:
            dest = ipaddress.ip_network(dest_text, strict=True)
        except ValueError as exc:
            errs.add(f"{path}.destination", f"{dest_text!r} is not a network CIDR ({exc})")
    gateway = read_ip(obj.get("gateway"), f"{path}.gateway", errs)
    source = read_ip(obj.get("source"), f"{path}.source", errs)
    scope_raw = obj.get("scope")
    scope: int | None = 0
    if isinstance(scope_raw, str):
        scope = ROUTE_SCOPES.get(scope_raw)
        if scope is None:
            errs.add(f"{path}.scope", f"{scope_raw!r} is not a supported scope (universe, link, 0, 253)")
    elif scope_raw is not None:
        scope = read_int(scope_raw, f"{path}.scope", errs, 0, 255)
        if scope is not None and scope not in ROUTE_SCOPES.values():
            errs.add(f"{path}.scope", f"{scope} is not a supported scope (0 universe or 253 link)")
            scope = None
    table = read_int(obj.get("table"), f"{path}.table", errs, 0, MAX_ROUTE_TABLE)
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


def _decode_routes(raw: Any, path: str, errs: FieldErrors) -> tuple[RouteConfig, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        errs.add(path, f"must be an array of routes, got {json_type_name(raw)}")
        return None
    routes: list[RouteConfig] = []
    seen: set[tuple[str, int]] = set()
    for i, item in enumerate(raw):
        route = _decode_route(item, f"{path}[{i}]", errs)
        if route is None:
            continue
        key = (route.destination, route.table)
        if key in seen:
            errs.add(f"{path}[{i}].destination", f"{route.destination} in table {route.table} is listed twice")
            continue
        seen.add(key)
        routes.append(route)
    return tuple(routes)


def decode_config(raw: Any, path: str) -> NetworkConfig:
    """Decode ``opaque.parameters`` strictly; ``path`` is where ``raw`` sits in its object.

    Raises :class:`ConfigError` holding every problem found, each with its field path.
    ``apiVersion`` and ``kind`` are optional (configs written for the Go reference driver have
    none), but when present must be ``dra.net/v1alpha1`` and ``NetworkConfig``.
    """
    errs = FieldErrors()
    allowed = ["apiVersion", "kind", "interface", "routes", "ethtool", "rdma", "numa"]
    obj = read_object(raw, path, allowed, errs)
    if obj is None:
        raise ConfigError.of(errs.items)
    version = obj.get("apiVersion")
    if version is not None and version != API_VERSION:
        errs.add(f"{path}.apiVersion", f"unsupported version {version!r} (supported: {API_VERSION})")
    kind = obj.get("kind")
    if kind is not None and kind != KIND:
        errs.add(f"{path}.kind", f"unsupported kind {kind!r} (supported: {KIND})")

    interface = None
    if obj.get("interface") is not None:
        interface = _decode_interface(obj["interface"], f"{path}.interface", errs)
    ethtool = None
    if obj.get("ethtool") is not None:
        eobj = read_object(obj["ethtool"], f"{path}.ethtool", ["features", "privateFlags"], errs)
        if eobj is not None:
            ethtool = EthtoolConfig(
                features=read_bool_map(eobj.get("features"), f"{path}.ethtool.features", errs),
                private_flags=read_bool_map(eobj.get("privateFlags"), f"{path}.ethtool.privateFlags", errs),
            )
    rdma = None
    if obj.get("rdma") is not None:
        robj = read_object(obj["rdma"], f"{path}.rdma", ["injectEnv"], errs)
        if robj is not None:
            rdma = RdmaConfig(inject_env=read_bool(robj.get("injectEnv"), f"{path}.rdma.injectEnv", errs))
    numa = None
    if obj.get("numa") is not None:
        nobj = read_object(obj["numa"], f"{path}.numa", ["pin"], errs)
        if nobj is not None:
            numa = NumaConfig(pin=read_bool(nobj.get("pin"), f"{path}.numa.pin", errs))
    config = NetworkConfig(
        interface=interface,
        routes=_decode_routes(obj.get("routes"), f"{path}.routes", errs),
        ethtool=ethtool,
        rdma=rdma,
        numa=numa,
    )
    if errs.items:
        raise ConfigError.of(errs.items)
    return config
