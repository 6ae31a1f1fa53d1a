"""The ``dra.net`` claim configuration: schema, strict decoder, merging and ``dranet validate``.

Users put a :class:`NetworkConfig` in ``spec.devices.config[].opaque.parameters`` of a
ResourceClaim (or a DeviceClass) with ``opaque.driver: dra.net``. The same decoder runs in
three places so a mistake is reported identically everywhere: the admission webhook
(:mod:`driver.webhook`), NodePrepareResources (:mod:`driver.prepare`, via
:func:`configs_for_request`) and ``dranet validate FILE...`` (:func:`cli_validate`).

Decoding is strict: unknown fields and wrong types are errors, and every error names the full
field path (``spec.devices.config[1].opaque.parameters.interface.mtu``) and the reason.
Several configs may apply to one request; they are merged field by field in DRA order
(class configs, then claim configs, each in list order; later wins). See docs/configuration.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from driver.model import DRIVER_NAME

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


@dataclass(frozen=True)
class FieldError:
    """One problem at one field path."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


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
        return self.errors[0].path

    @property
    def reason(self) -> str:
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


class _Errors:
    """Collects field errors so one pass reports every problem, not just the first."""

    def __init__(self) -> None:
        self.items: list[FieldError] = []

    def add(self, path: str, reason: str) -> None:
        self.items.append(FieldError(path, reason))


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _object(raw: Any, path: str, allowed: Iterable[str], errs: _Errors) -> dict[str, Any] | None:
    """``raw`` as an object with only ``allowed`` keys (unknown keys reported, then dropped)."""
    if not isinstance(raw, dict):
        errs.add(path, f"must be an object, got {_type_name(raw)}")
        return None
    allowed = list(allowed)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in allowed:
            errs.add(f"{path}.{key}", f"unknown field (allowed: {', '.join(allowed)})")
        else:
            out[key] = value
    return out


def _bool(raw: Any, path: str, errs: _Errors) -> bool | None:
    if raw is None:
        return None
    if not isinstance(raw, bool):
        errs.add(path, f"must be a boolean, got {_type_name(raw)}")
        return None
    return raw


def _int(raw: Any, path: str, errs: _Errors, lo: int, hi: int) -> int | None:
    if raw is None:
        return None
    # bool is an int in Python but not in JSON; 1500.0 from a JSON number is accepted as 1500.
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        errs.add(path, f"must be an integer, got {_type_name(raw)}")
        return None
    if not lo <= raw <= hi:
        errs.add(path, f"must be between {lo} and {hi}, got {raw}")
        return None
    return raw


def _str(raw: Any, path: str, errs: _Errors) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        errs.add(path, f"must be a string, got {_type_name(raw)}")
        return None
    return raw


def _ip(raw: Any, path: str, errs: _Errors) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = _str(raw, path, errs)
    if text is None:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        errs.add(path, f"{text!r} is not an IP address")
        return None


def _bool_map(raw: Any, path: str, errs: _Errors) -> dict[str, bool] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        errs.add(path, f"must be an object of name: boolean, got {_type_name(raw)}")
        return None
    out: dict[str, bool] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            errs.add(f"{path}.{key}", "name must be non-empty without whitespace")
            continue
        if not isinstance(value, bool):
            errs.add(f"{path}.{key}", f"must be a boolean, got {_type_name(value)}")
            continue
        out[key] = value
    return out


def _decode_ifname(raw: Any, path: str, errs: _Errors) -> str | None:
    name = _str(raw, path, errs)
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


def _decode_mac(raw: Any, path: str, errs: _Errors) -> str | None:
    mac = _str(raw, path, errs)
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


def _decode_interface(raw: Any, path: str, errs: _Errors) -> InterfaceConfig | None:
    obj = _object(raw, path, ["name", "addresses", "mtu", "hardwareAddr"], errs)
    if obj is None:
        return None
    addresses: tuple[str, ...] | None = None
    if obj.get("addresses") is not None:
        raw_addrs = obj["addresses"]
        if not isinstance(raw_addrs, list):
            errs.add(f"{path}.addresses", f"must be an array of CIDR strings, got {_type_name(raw_addrs)}")
        else:
            seen: set[str] = set()
            out: list[str] = []
            for i, item in enumerate(raw_addrs):
                ipath = f"{path}.addresses[{i}]"
                text = _str(item, ipath, errs)
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
        mtu=_int(obj.get("mtu"), f"{path}.mtu", errs, MIN_MTU, MAX_MTU),
        hardware_addr=_decode_mac(obj.get("hardwareAddr"), f"{path}.hardwareAddr", errs),
    )


def _decode_route(raw: Any, path: str, errs: _Errors) -> RouteConfig | None:
    obj = _object(raw, path, ["destination", "gateway", "source", "scope", "table"], errs)
    if obj is None:
        return None
    before = len(errs.items)
    dest_text = _str(obj.get("destination"), f"{path}.destination", errs)
    dest = None
    if obj.get("destination") is None:
        errs.add(f"{path}.destination", "is required (a CIDR, e.g. 10.0.0.0/8 or 0.0.0.0/0)")
    elif dest_text is not None:
        try:
            dest = ipaddress.ip_network(dest_text, strict=True)
        except ValueError as exc:
            errs.add(f"{path}.destination", f"{dest_text!r} is not a network CIDR ({exc})")
    gateway = _ip(obj.get("gateway"), f"{path}.gateway", errs)
    source = _ip(obj.get("source"), f"{path}.source", errs)
    scope_raw = obj.get("scope")
    scope: int | None = 0
    if isinstance(scope_raw, str):
        scope = SCOPES.get(scope_raw)
        if scope is None:
            errs.add(f"{path}.scope", f"{scope_raw!r} is not a supported scope (universe, link, 0, 253)")
    elif scope_raw is not None:
        scope = _int(scope_raw, f"{path}.scope", errs, 0, 255)
        if scope is not None and scope not in SCOPES.values():
            errs.add(f"{path}.scope", f"{scope} is not a supported scope (0 universe or 253 link)")
            scope = None
    table = _int(obj.get("table"), f"{path}.table", errs, 0, MAX_ROUTE_TABLE)
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


def _decode_routes(raw: Any, path: str, errs: _Errors) -> tuple[RouteConfig, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        errs.add(path, f"must be an array of routes, got {_type_name(raw)}")
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
    errs = _Errors()
    allowed = ["apiVersion", "kind", "interface", "routes", "ethtool", "rdma", "numa"]
    obj = _object(raw, path, allowed, errs)
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
        eobj = _object(obj["ethtool"], f"{path}.ethtool", ["features", "privateFlags"], errs)
        if eobj is not None:
            ethtool = EthtoolConfig(
                features=_bool_map(eobj.get("features"), f"{path}.ethtool.features", errs),
                private_flags=_bool_map(eobj.get("privateFlags"), f"{path}.ethtool.privateFlags", errs),
            )
    rdma = None
    if obj.get("rdma") is not None:
        robj = _object(obj["rdma"], f"{path}.rdma", ["injectEnv"], errs)
        if robj is not None:
            rdma = RdmaConfig(inject_env=_bool(robj.get("injectEnv"), f"{path}.rdma.injectEnv", errs))
    numa = None
    if obj.get("numa") is not None:
        nobj = _object(obj["numa"], f"{path}.numa", ["pin"], errs)
        if nobj is not None:
            numa = NumaConfig(pin=_bool(nobj.get("pin"), f"{path}.numa.pin", errs))
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


def _matches(requests: Any, request: str) -> bool:
    """DRA: an empty list applies to all requests; "req" also covers subrequests "req/sub"."""
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
        if not _matches(entry.get("requests"), request):
            continue
        try:
            result = merge(result, decode_config(opaque.get("parameters"), f"{base}[{i}].opaque.parameters"))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError.of(errors)
    return result


def prepare_decoder(allocation_configs: list[dict[str, Any]], base: str, full: str, driver: str) -> dict[str, Any]:
    """``driver.prepare.ConfigDecoder``: the validated, merged config of one allocated device.

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


# -- claim-level validation -------------------------------------------------------------------


def _multi_device_requests(devices: dict[str, Any]) -> dict[str, str]:
    """Requests (and subrequests) that may allocate several devices -> why."""
    out: dict[str, str] = {}
    for req in devices.get("requests") or []:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            continue
        subs = [(req["name"], req.get("exactly"))] if req.get("exactly") else [
            (f"{req['name']}/{s.get('name')}", s) for s in req.get("firstAvailable") or [] if isinstance(s, dict)
        ]
        for name, spec in subs:
            if not isinstance(spec, dict):
                continue
            if spec.get("allocationMode") == "All":
                out[name] = "allocationMode All"
            elif isinstance(spec.get("count"), int) and spec["count"] > 1:
                out[name] = f"count {spec['count']}"
    return out


def validate_claim_spec(spec: Any, path: str) -> list[ConfigError]:
    """Validate the ``dra.net`` configs of a ResourceClaim spec (or a template's ``spec.spec``).

    Returns one :class:`ConfigError` per problem (empty when valid). Configs for other
    drivers are ignored. Besides decoding, it refuses per-device settings (interface name,
    addresses, MAC) on a request that can allocate several devices: every NIC would get the
    same name or address in the pod and the second one would fail at pod start.
    """
    if not isinstance(spec, dict):
        return [ConfigError(path, f"must be an object, got {_type_name(spec)}")]
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return []
    configs = devices.get("config")
    if not isinstance(configs, list):
        return []
    multi = _multi_device_requests(devices)
    problems: list[ConfigError] = []
    for i, entry in enumerate(configs):
        if not isinstance(entry, dict):
            continue
        opaque = entry.get("opaque")
        if not isinstance(opaque, dict) or opaque.get("driver") != DRIVER_NAME:
            continue
        ppath = f"{path}.devices.config[{i}].opaque.parameters"
        try:
            config = decode_config(opaque.get("parameters"), ppath)
        except ConfigError as exc:
            problems.extend(ConfigError(e.path, e.reason) for e in exc.errors)
            continue
        problems.extend(_per_device_conflicts(config, entry.get("requests"), multi, ppath))
    return problems


def _per_device_conflicts(
    config: NetworkConfig, requests: Any, multi: dict[str, str], ppath: str
) -> list[ConfigError]:
    iface = config.interface
    if iface is None:
        return []
    targets = [r for r in multi if _matches(requests, r)]
    if not targets:
        return []
    out = []
    for fname, value in (("name", iface.name), ("addresses", iface.addresses), ("hardwareAddr", iface.hardware_addr)):
        if value:
            req = targets[0]
            out.append(ConfigError(
                f"{ppath}.interface.{fname}",
                f"applies to request {req!r} ({multi[req]}), which can allocate several NICs; "
                "each would get the same value and pod start would fail (use one request per NIC)",
            ))
    return out


# -- container adjustments for the NRI hooks --------------------------------------------------


@dataclass(frozen=True)
class CpusetPlan:
    """cpuset for a container pinned to one NUMA node (``linux.resources.cpu``)."""

    numa_node: int
    cpus: str  # the node's cpulist, e.g. "0-23,48-71"
    mems: str  # the node number, e.g. "0"


def container_env(devices: Iterable[tuple[dict[str, Any], str | None]]) -> dict[str, str]:
    """Environment for containers consuming the given devices.

    ``devices``: ``(PreparedDevice.config, RDMA device name or None)`` per allocated device
    (``PreparedDevice.snapshot.host.rdma_device``); see :func:`stored_config`.
    Returns ``NCCL_IB_HCA="=mlx5_0,mlx5_1"`` (a leading ``=`` is NCCL's exact-match form, so
    ``mlx5_1`` does not also select ``mlx5_10``) and ``DRANET_RDMA_DEVICES="mlx5_0,mlx5_1"``;
    empty when no device has RDMA or every RDMA device has ``rdma.injectEnv: false``.
    """
    hcas: list[str] = []
    for params, rdma_device in devices:
        if not rdma_device:
            continue
        config = stored_config(params)
        if config.rdma_env_enabled and rdma_device not in hcas:
            hcas.append(rdma_device)
    if not hcas:
        return {}
    hcas.sort()
    return {"NCCL_IB_HCA": "=" + ",".join(hcas), "DRANET_RDMA_DEVICES": ",".join(hcas)}


def numa_pin_node(devices: Iterable[tuple[dict[str, Any], int | None, str]], path: str = "numa.pin") -> int | None:
    """The NUMA node to pin to, or None when no device asks for pinning.

    ``devices``: ``(PreparedDevice.config, NUMA node or None, device name)``. Raises
    :class:`ConfigError` when pinning is asked for and the NICs span several NUMA nodes or a
    NIC's node is unknown. prepare calls it to refuse the claim early; the NRI hooks again.
    """
    wanted = False
    nodes: dict[int, list[str]] = {}
    unknown: list[str] = []
    for params, node, name in devices:
        config = stored_config(params)
        wanted = wanted or config.numa_pin
        if node is None or node < 0:
            unknown.append(name)
        else:
            nodes.setdefault(node, []).append(name)
    if not wanted:
        return None
    if unknown:
        raise ConfigError(path, f"cannot pin: the NUMA node of {', '.join(sorted(unknown))} is unknown")
    if len(nodes) != 1:
        spans = "; ".join(f"node {n}: {', '.join(sorted(d))}" for n, d in sorted(nodes.items()))
        raise ConfigError(path, f"cannot pin to one NUMA node: the claim's NICs span several ({spans})")
    return next(iter(nodes))


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` -> {0,1,2,3,8,10,11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> ``"0-3,8"``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def cpuset_for(numa_node: int, sysfs_root: str = "/sys", requested: str | None = None) -> CpusetPlan:
    """The cpuset pinning a container to ``numa_node``.

    CPUs come from ``<sysfs>/devices/system/node/node<N>/cpulist``. ``requested`` is the
    cpuset the kubelet asked for in CreateContainer (``linux.resources.cpu.cpus``), if any. We
    only narrow it and never widen it: the result is the intersection, so CPUs the kubelet's
    static CPU manager gave another container exclusively are never added. An empty intersection
    raises :class:`ConfigError`. That happens when the kubelet gave this container exclusive CPUs
    on another node, and then the container must not be pinned.
    """
    cpulist = Path(sysfs_root, "devices/system/node", f"node{numa_node}", "cpulist")
    node_cpus = parse_cpulist(cpulist.read_text())
    if not node_cpus:
        raise ConfigError("numa.pin", f"NUMA node {numa_node} has no CPUs ({cpulist} is empty)")
    cpus = node_cpus
    if requested and requested.strip():
        cpus = node_cpus & parse_cpulist(requested)
        if not cpus:
            raise ConfigError("numa.pin", f"the container's CPUs ({requested}) are all outside NUMA node "
                                          f"{numa_node} ({format_cpulist(node_cpus)}); not pinning")
    return CpusetPlan(numa_node=numa_node, cpus=format_cpulist(cpus), mems=str(numa_node))


@dataclass(frozen=True)
class ContainerSettings:
    """What the NRI CreateContainer adjustment adds for a container's dra.net devices."""

    env: dict[str, str] = field(default_factory=dict)
    cpuset: CpusetPlan | None = None
    skipped_pin: str | None = None  # why numa.pin was asked for and not applied (for the log)


def container_settings(devices: Sequence[Any], sysfs_root: str = "/sys",
                       requested_cpus: str | None = None) -> ContainerSettings:
    """Env and cpuset for a container consuming ``devices`` (``checkpoint.PreparedDevice``).

    ``requested_cpus`` is the container's cpuset in the CreateContainer request
    (``container.linux.resources.cpu.cpus``). Pinning problems never fail the container: prepare
    already refused claims whose NICs span NUMA nodes, so what is left here (an empty
    intersection with the kubelet's exclusive CPUs, a missing cpulist) is reported in
    ``skipped_pin`` and the container runs unpinned.
    """
    env = container_env((d.config, d.snapshot.host.rdma_device) for d in devices)
    cpuset, skipped = None, None
    try:
        node = numa_pin_node(
            ((d.config, device_numa_node(d), d.device) for d in devices), "numa.pin")
        if node is not None:
            cpuset = cpuset_for(node, sysfs_root, requested_cpus)
    except ConfigError as exc:
        skipped = str(exc)
    except OSError as exc:
        skipped = f"numa.pin: cannot read the NUMA node's CPUs: {exc}"
    return ContainerSettings(env=env, cpuset=cpuset, skipped_pin=skipped)


def device_numa_node(device: Any) -> int | None:
    """The NUMA node of a ``PreparedDevice`` (its published attribute, else the host fact)."""
    attr = device.snapshot.attributes.get(f"{DRIVER_NAME}/numaNode")
    if isinstance(attr, int) and not isinstance(attr, bool):
        return attr
    return device.snapshot.host.numa_node


# -- dranet validate --------------------------------------------------------------------------

_CLAIM_KINDS = {"ResourceClaim": "spec", "ResourceClaimTemplate": "spec.spec"}


def validate_object(obj: Any) -> list[ConfigError]:
    """Validate one manifest; objects other than ResourceClaim(Template) are accepted as is."""
    if not isinstance(obj, dict):
        return [ConfigError("(document)", f"must be an object, got {_type_name(obj)}")]
    kind = obj.get("kind")
    if kind not in _CLAIM_KINDS:
        return []
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, dict) else None
    if spec is None:
        return []
    return validate_claim_spec(spec, _CLAIM_KINDS[kind])


def validate_file(path: str) -> list[str]:
    """``file:doc: path: reason`` lines for every problem in a multi-document YAML file."""
    import yaml  # imported here: only the CLI needs it

    try:
        text = Path(path).read_text() if path != "-" else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        return [f"{path}:0: (file): cannot read: {exc}"]
    lines: list[str] = []
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        return [f"{path}:0: (file): invalid YAML: {' '.join(str(exc).split())}"]
    for n, doc in enumerate(docs, start=1):
        if doc is None:
            continue  # an empty document ("---" at the end) is not an error
        for error in validate_object(doc):
            lines.extend(f"{path}:{n}: {e.path}: {e.reason}" for e in error.errors)
    return lines


def cli_validate(args: argparse.Namespace) -> int:
    """``dranet validate FILE...``: print every problem; exit 1 if any, else 0."""
    failed = False
    for path in args.files:
        for line in validate_file(path):
            failed = True
            print(line)
    return 1 if failed else 0


def errors_as_json(errors: Sequence[ConfigError]) -> list[dict[str, str]]:
    """Errors as ``[{"path": ..., "reason": ...}]`` (for logs and events)."""
    return [{"path": e.path, "reason": e.reason} for err in errors for e in err.errors]


__all__ = [
    "API_VERSION", "KIND", "ConfigError", "FieldError", "NetworkConfig", "InterfaceConfig", "RouteConfig",
    "EthtoolConfig", "RdmaConfig", "NumaConfig", "CpusetPlan", "decode_config", "merge", "configs_for_request",
    "validate_claim_spec", "validate_object", "validate_file", "cli_validate", "container_env", "numa_pin_node", "device_numa_node",
    "cpuset_for", "ContainerSettings", "container_settings", "parse_cpulist", "format_cpulist", "errors_as_json", "prepare_decoder", "stored_config",
]
