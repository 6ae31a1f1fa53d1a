"""Which opaque configs apply to an allocated request, merged in DRA order.

Several configs may apply to one request: ``status.allocation.devices.config`` lists the
DeviceClass's configs (``FromClass``) and the claim's (``FromClaim``). Those for our driver whose
``requests`` match are decoded (:func:`driver.api.v1alpha1.decode.decode_config`) and merged field by
field (:meth:`~driver.api.v1alpha1.network_config.NetworkConfig.merged`): class configs first, then
claim configs, each in list order; later wins. See docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from driver.api.v1alpha1.decode import combination_errors, decode_config
from driver.api.v1alpha1.fields import ConfigError, FieldError
from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig, RouteConfig
from driver.config import DRIVER_NAME

T = TypeVar("T")


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
            result = result.merged(decode_config(opaque.get("parameters"), f"{base}[{i}].opaque.parameters"))
        except ConfigError as exc:
            errors.extend(exc.errors)
    if not errors:  # each config is valid alone; together they may set two halves of a conflict
        errors = combination_errors(result, f"{base}[*].opaque.parameters (merged for request {request!r})")
    if errors:
        raise ConfigError.of(errors)
    return result


def _last_wins(items: Iterable[T], key: Callable[[T], Hashable]) -> tuple[T, ...]:
    """``items`` without duplicates by ``key``, the last occurrence kept in its place (the Go driver's dedupe)."""
    items = list(items)
    seen: set[Hashable] = set()
    out: list[T] = []
    for item in reversed(items):
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return tuple(reversed(out))


def _route_key(route: RouteConfig) -> tuple[str, int]:
    return (route.destination, route.table)


def merge_under_cloud(cloud: NetworkConfig | None, claim: NetworkConfig) -> NetworkConfig:
    """The claim's config on top of the cloud provider's config for the same NIC (the Go driver's
    ``MergeNetworkConfig``: "user wins").

    Scalars set by the claim win; lists are the cloud's followed by the claim's with duplicates
    resolved in the claim's favour: addresses by value, routes by (destination, table) (the Go
    driver keys routes by destination alone, which would drop a cloud route of another table),
    rules by value; maps (ethtool) merge key by key.
    """
    if cloud is None:
        return claim
    merged = cloud.merged(claim)  # scalars and maps: claim wins; lists: the claim's replace the cloud's
    addresses = None
    c_iface, u_iface = cloud.interface or InterfaceConfig(), claim.interface or InterfaceConfig()
    if c_iface.addresses is not None or u_iface.addresses is not None:
        addresses = _last_wins([*(c_iface.addresses or ()), *(u_iface.addresses or ())], lambda a: a)
    routes = None
    if cloud.routes is not None or claim.routes is not None:
        routes = _last_wins([*(cloud.routes or ()), *(claim.routes or ())], _route_key)
    rules = None
    if cloud.rules is not None or claim.rules is not None:
        rules = _last_wins([*(cloud.rules or ()), *(claim.rules or ())], lambda r: r)
    interface = merged.interface
    if interface is not None:
        interface = replace(interface, addresses=addresses)
        if interface.vrf is not None:
            rules = claim.rules  # the claim's VRF table decides the lookup: the cloud's rules are left out
    return replace(merged, interface=interface, routes=routes, rules=rules)
