"""Strict decoding of a ``dra.net`` opaque config into a :class:`~driver.api.v1alpha1.network_config.NetworkConfig`.

Users put the config in ``spec.devices.config[].opaque.parameters`` of a ResourceClaim (or a
DeviceClass) with ``opaque.driver: dra.net``. The same decoder runs in three places so a mistake
is reported identically everywhere: the admission webhook and ``dranet validate FILE...`` (both
through :mod:`driver.api.v1alpha1.validation`) and NodePrepareResources (:mod:`driver.claims.prepare`,
through :func:`driver.api.v1alpha1.merge.configs_for_request`). It runs once per claim: what prepare
decodes is stored typed in the checkpoint and never decoded again.

Decoding is strict: unknown fields and wrong types are errors, and every error names the full
field path (``spec.devices.config[1].opaque.parameters.interface.mtu``) and the reason.
"""

from __future__ import annotations

from typing import Any

from driver.api.v1alpha1.decode_interface import decode_interface, ipv6_mtu_error
from driver.api.v1alpha1.decode_routing import decode_neighbors, decode_routes, decode_rules
from driver.api.v1alpha1.decode_sriov import decode_sriov, sriov_combination_errors, vfio_combination_errors
from driver.api.v1alpha1.fields import (
    ConfigError,
    FieldError,
    FieldErrors,
    read_bool,
    read_bool_map,
    read_object,
    read_str,
    shown,
)
from driver.api.v1alpha1.network_config import (
    API_VERSION,
    KIND,
    EthtoolConfig,
    NetworkConfig,
    NumaConfig,
    RdmaConfig,
    SriovConfig,
)

TOP_LEVEL_FIELDS = [
    "apiVersion",
    "kind",
    "interface",
    "routes",
    "rules",
    "neighbors",
    "ethtool",
    "profile",
    "rdma",
    "numa",
    "sriov",
]
MAX_PROFILE_LENGTH = 253


def _decode_profile(raw: Any, path: str, errs: FieldErrors) -> str | None:
    name = read_str(raw, path, errs)
    if name is None:
        return None
    if not name or len(name) > MAX_PROFILE_LENGTH or any(c.isspace() or not c.isprintable() for c in name):
        errs.add(path, f"must be a profile name of 1 to {MAX_PROFILE_LENGTH} printable characters without spaces")
        return None
    return name


def _sections(
    obj: dict[str, Any], path: str, errs: FieldErrors
) -> tuple[EthtoolConfig | None, RdmaConfig | None, NumaConfig | None, SriovConfig | None]:
    """The ``ethtool``, ``rdma``, ``numa`` and ``sriov`` sections (None: not set, or refused)."""
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
    sriov = None
    if obj.get("sriov") is not None:
        sriov = decode_sriov(obj["sriov"], f"{path}.sriov", errs)
    return ethtool, rdma, numa, sriov


def decode_config(raw: Any, path: str) -> NetworkConfig:
    """Decode ``opaque.parameters`` strictly; ``path`` is where ``raw`` sits in its object.

    Raises :class:`ConfigError` holding every problem found, each with its field path.
    ``apiVersion`` and ``kind`` are optional (configs written for the Go reference driver have
    none), but when present must be ``dra.net/v1alpha1`` and ``NetworkConfig``.
    """
    errs = FieldErrors()
    obj = read_object(raw, path, TOP_LEVEL_FIELDS, errs)
    if obj is None:
        raise ConfigError.of(errs.items)
    version = obj.get("apiVersion")
    if version is not None and version != API_VERSION:
        errs.add(f"{path}.apiVersion", f"unsupported version {shown(version)} (supported: {API_VERSION})")
    kind = obj.get("kind")
    if kind is not None and kind != KIND:
        errs.add(f"{path}.kind", f"unsupported kind {shown(kind)} (supported: {KIND})")

    interface = None
    if obj.get("interface") is not None:
        interface = decode_interface(obj["interface"], f"{path}.interface", errs)
    ethtool, rdma, numa, sriov = _sections(obj, path, errs)
    config = NetworkConfig(
        interface=interface,
        routes=decode_routes(obj.get("routes"), f"{path}.routes", errs),
        rules=decode_rules(obj.get("rules"), f"{path}.rules", errs),
        neighbors=decode_neighbors(obj.get("neighbors"), f"{path}.neighbors", errs),
        ethtool=ethtool,
        profile=_decode_profile(obj.get("profile"), f"{path}.profile", errs),
        rdma=rdma,
        numa=numa,
        sriov=sriov,
    )
    errs.items.extend(combination_errors(config, path))
    if errs.items:
        raise ConfigError.of(errs.items)
    return config


MAX_NIC_ENTRIES = 128
"""Addresses, routes, rules and neighbors one NIC's config may hold together: each is one netlink
request when the pod starts. Above what the API's 10 KiB of parameters per config can hold; named
here so a merged config (two configs for one request, a profile under it) is bounded too."""
MAX_POD_REQUESTS = 200
"""Netlink requests that configure a pod's NICs: one per address, route, rule and neighbor, one per
NIC to set it up, one more for a NIC in a VRF (:func:`configure_requests`). The NRI hook pipelines
them in windows that fit the socket's receive buffer (:class:`~driver.netlink.channel.NetlinkChannel`),
so any number applies; the bound keeps a pod start's configuration well inside the hook's 2-second
budget (docs/configuration.md, Limits)."""


def config_entries(config: NetworkConfig) -> int:
    """The addresses, routes, rules and neighbors of one NIC's config."""
    addresses = config.interface.addresses if config.interface else None
    return sum(len(items or ()) for items in (addresses, config.routes, config.rules, config.neighbors))


def configure_requests(config: NetworkConfig) -> int:
    """The netlink requests configuring one NIC with ``config`` in the pod (its host addresses and
    routes, copied when the config sets no addresses, are counted by the hook)."""
    vrf = config.interface is not None and config.interface.vrf is not None
    return config_entries(config) + 1 + vrf


def combination_errors(config: NetworkConfig, path: str) -> list[FieldError]:
    """Fields that are each valid but cannot go together; checked on each config and again on the
    merged config of a request (two configs may each set one half)."""
    out = []
    iface = config.interface
    if iface is not None and iface.dhcp and iface.addresses:
        reason = "dhcp and addresses are mutually exclusive (DHCP assigns the addresses)"
        out.append(FieldError(f"{path}.interface.dhcp", reason))
    mtu_error = ipv6_mtu_error(iface)
    if mtu_error:
        out.append(FieldError(f"{path}.interface.mtu", mtu_error))
    if iface is not None and iface.vrf is not None and iface.vrf.name is not None:
        if iface.vrf.name == iface.name:
            reason = f"{iface.name!r} is the interface's own name; the VRF device needs another"
            out.append(FieldError(f"{path}.interface.vrf.name", reason))
        if config.rules:
            reason = "rules cannot be combined with interface.vrf (the VRF's table decides the lookup)"
            out.append(FieldError(f"{path}.rules", reason))
    if config.sriov is not None and iface is not None and iface.type:
        reason = "an SR-IOV VF's settings are its own: a sub-interface (interface.type) of it cannot take them"
        out.append(FieldError(f"{path}.sriov", reason))
    if config.sriov is not None and config.sriov.mac and iface is not None and iface.hardware_addr:
        if iface.hardware_addr != config.sriov.mac:
            reason = (
                f"{config.sriov.mac} differs from interface.hardwareAddr ({iface.hardware_addr}): the VF's netdev "
                "carries the MAC its PF gives it; set one of the two"
            )
            out.append(FieldError(f"{path}.sriov.mac", reason))
    if config.sriov is not None:
        out.extend(sriov_combination_errors(config.sriov, f"{path}.sriov"))
        out.extend(vfio_combination_errors(config, path))
    entries = config_entries(config)
    if entries > MAX_NIC_ENTRIES:
        reason = (
            f"{entries} addresses, routes, rules and neighbors for one NIC; at most {MAX_NIC_ENTRIES} "
            "(each is a netlink request when the pod starts)"
        )
        out.append(FieldError(path, reason))
    return out
