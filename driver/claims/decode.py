"""The ``dra.net`` claim configuration: schema, strict decoding and merging by request.

Users put a :class:`NetworkConfig` in ``spec.devices.config[].opaque.parameters`` of a
ResourceClaim (or a DeviceClass) with ``opaque.driver: dra.net``. The same decoder runs in
three places so a mistake is reported identically everywhere: the admission webhook and
``dranet validate FILE...`` (both through :mod:`driver.claims.validation`) and
NodePrepareResources (:mod:`driver.claims.prepare`, through :func:`prepare_decoder`). The NRI hooks read
the stored result back with :func:`stored_config`; :mod:`driver.claims.container_settings` turns it
into container environment and cpusets.

Decoding is strict: unknown fields and wrong types are errors, and every error names the full
field path (``spec.devices.config[1].opaque.parameters.interface.mtu``) and the reason.
Several configs may apply to one request; they are merged field by field in DRA order
(class configs, then claim configs, each in list order; later wins). See docs/configuration.md.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from driver.claims.fields import (FieldError, FieldErrors, json_type_name, read_bool, read_bool_map, read_int,
                                read_ip, read_object, read_str)
from driver.model.device import DRIVER_NAME

API_VERSION = "dra.net/v1alpha1"
"""The only schema version this driver understands (``apiVersion`` is optional; see docs)."""
KIND = "NetworkConfig"

MAX_IFNAME_LENGTH = 15  # IFNAMSIZ - 1
MIN_MTU = 68  # RFC 791 minimum; the kernel refuses less for IPv4
MAX_MTU = 65536  # the largest max_mtu any Linux netdev reports (loopback)
MAX_ROUTE_TABLE = 2**32 - 1
SCOPES = {"universe": 0, "link": 253}
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


# -- errors -----------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration is invalid. ``errors`` holds every problem found (at least one).

    ``ConfigError(path, reason)`` builds a single-error instance; :meth:`of` several.
    ``path``/``reason`` are those of the first error.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.errors: list[FieldError] = [FieldError(path, reason)]
        super().__init__(str(self))

    @classmethod
    def of(cls, errors: Sequence[FieldError]) -> "ConfigError":
        """One exception carrying all ``errors`` (must not be empty)."""
        if not errors:
            raise ValueError("ConfigError.of needs at least one error")
        exc = cls(errors[0].path, errors[0].reason)
        exc.errors = list(errors)
        exc.args = (str(exc),)
        return exc

    @property
    def path(self) -> str:
        """The field path of the first error."""
        return self.errors[0].path

    @property
    def reason(self) -> str:
        """The reason of the first error."""
        return self.errors[0].reason

    def __str__(self) -> str:
        return "; ".join(str(e) for e in self.errors)


# -- schema -----------------------------------------------------------------------------------
# Every field is optional and None means "not set", so configs can be merged field by field.


@dataclass(frozen=True)
class InterfaceConfig:
    """How the NIC looks inside the pod."""

    name: str | None = None  # interface name in the pod; default: the host name
    addresses: tuple[str, ...] | None = None  # CIDRs ("192.0.2.5/24"); default: keep the host's
    mtu: int | None = None
    hardware_addr: str | None = None  # JSON "hardwareAddr"


@dataclass(frozen=True)
class RouteConfig:
    """One route added in the pod namespace through this NIC."""

    destination: str
    gateway: str | None = None
    source: str | None = None
    scope: int = 0  # 0 universe, 253 link
    table: int = 0  # 0 = main


@dataclass(frozen=True)
class EthtoolConfig:
    """Offload features and private flags, set by name (checked against the NIC at prepare)."""

    features: dict[str, bool] | None = None
    private_flags: dict[str, bool] | None = None  # JSON "privateFlags"


@dataclass(frozen=True)
class RdmaConfig:
    """RDMA environment injection into the consuming containers."""

    inject_env: bool | None = None  # JSON "injectEnv"; default True for RDMA NICs


@dataclass(frozen=True)
class NumaConfig:
    """Opt-in NUMA pinning of the consuming containers."""

    pin: bool | None = None  # default False: cpuset.cpus and cpuset.mems of the NICs' NUMA node


@dataclass(frozen=True)
class NetworkConfig:
    """The whole ``opaque.parameters`` object for ``dra.net``."""

    interface: InterfaceConfig | None = None
    routes: tuple[RouteConfig, ...] | None = None
    ethtool: EthtoolConfig | None = None
    rdma: RdmaConfig | None = None
    numa: NumaConfig | None = None

    @property
    def rdma_env_enabled(self) -> bool:
        """Whether NCCL_IB_HCA / DRANET_RDMA_DEVICES are injected (on unless turned off)."""
        return not (self.rdma and self.rdma.inject_env is False)

    @property
    def numa_pin(self) -> bool:
        """Whether containers are pinned to the NICs' NUMA node (off unless turned on)."""
        return bool(self.numa and self.numa.pin)

    def to_parameters(self) -> dict[str, Any]:
        """The canonical JSON form; ``decode_config(c.to_parameters(), p) == c``."""
        out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
        out.update(_to_json(self))
        return out


_JSON_NAMES = {"hardware_addr": "hardwareAddr", "private_flags": "privateFlags", "inject_env": "injectEnv"}


def _to_json(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return [_to_json(o) for o in obj]
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return {
            _JSON_NAMES.get(f.name, f.name): _to_json(getattr(obj, f.name))
            for f in fields(obj)
            if getattr(obj, f.name) is not None
        }
    return obj


# -- decoding ---------------------------------------------------------------------------------


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
    elif not _IFNAME_RE.match(name):
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
    if not _MAC_RE.match(mac):
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
        scope = SCOPES.get(scope_raw)
        if scope is None:
            errs.add(f"{path}.scope", f"{scope_raw!r} is not a supported scope (universe, link, 0, 253)")
    elif scope_raw is not None:
        scope = read_int(scope_raw, f"{path}.scope", errs, 0, 255)
        if scope is not None and scope not in SCOPES.values():
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


# -- merging ----------------------------------------------------------------------------------


def merge(base: NetworkConfig, override: NetworkConfig) -> NetworkConfig:
    """``override`` on top of ``base``, field by field.

    Scalars and lists (``addresses``, ``routes``) set in ``override`` replace those of
    ``base``; maps (``ethtool.features``, ``ethtool.privateFlags``) merge key by key.
    """
    return _merge(base, override)


def _merge(base: Any, over: Any) -> Any:
    if over is None:
        return base
    if base is None:
        return over
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **over}
    if hasattr(base, "__dataclass_fields__") and type(base) is type(over):
        return replace(base, **{f.name: _merge(getattr(base, f.name), getattr(over, f.name)) for f in fields(base)})
    return over


def request_matches(requests: Any, request: str) -> bool:
    """Whether a config's ``requests`` list covers ``request``.

    DRA: an empty list applies to all requests; "req" also covers subrequests "req/sub".
    """
    if not requests:
        return True
    if not isinstance(requests, list):
        return False  # malformed (the API server rejects it); never substring-match a string
    base = request.split("/", 1)[0]
    return request in requests or base in requests


def configs_for_request(
    allocation_configs: list[dict[str, Any]], request: str, driver: str = DRIVER_NAME
) -> NetworkConfig:
    """The effective config of ``request`` from ``status.allocation.devices.config``.

    Configs for ``driver`` whose ``requests`` match are decoded and merged: ``FromClass``
    entries first, then ``FromClaim``, each in list order (DRA's precedence: later wins).
    Raises :class:`ConfigError` with every error of every applicable config.
    """
    base = "status.allocation.devices.config"
    indexed = list(enumerate(allocation_configs or []))
    # Stable sort: class configs before claim configs, list order kept within each source.
    indexed.sort(key=lambda item: 0 if isinstance(item[1], dict) and item[1].get("source") == "FromClass" else 1)
    result = NetworkConfig()
    errors: list[FieldError] = []
    for i, entry in indexed:
        if not isinstance(entry, dict):
            continue
        opaque = entry.get("opaque") or {}
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        if not request_matches(entry.get("requests"), request):
            continue
        try:
            result = merge(result, decode_config(opaque.get("parameters"), f"{base}[{i}].opaque.parameters"))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.of(errors)
    return result


def prepare_decoder(allocation_configs: list[dict[str, Any]], base: str, full: str, driver: str) -> dict[str, Any]:
    """``driver.claims.prepare.ConfigDecoder``: the validated, merged config of one allocated device.

    Returns ``{"opaque": [<canonical parameters>]}`` (the shape prepare's default decoder
    stores, so the NRI hooks read it unchanged); raises :class:`ConfigError` naming the
    ``status.allocation.devices.config[i]...`` path and the reason.
    """
    return {"opaque": [configs_for_request(allocation_configs, full or base, driver).to_parameters()]}


def stored_config(config: dict[str, Any] | None) -> NetworkConfig:
    """The :class:`NetworkConfig` of a ``PreparedDevice.config`` (flat parameters, or prepare's
    ``{"opaque": [params, ...]}``, merged in order)."""
    if not config:
        return NetworkConfig()
    if isinstance(config.get("opaque"), list):
        result = NetworkConfig()
        for i, params in enumerate(config["opaque"]):
            result = merge(result, decode_config(params if params is not None else {}, f"config.opaque[{i}]"))
        return result
    return decode_config(config, "config")
