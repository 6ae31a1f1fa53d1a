"""Claim-level validation of ``dra.net`` configs: the admission webhook and ``dranet validate``.

:func:`validate_claim_spec` is the one validator the webhook (:mod:`driver.webhook`) and the CLI
(:mod:`driver.api.validate_cli`) share. It decodes each ``dra.net`` config with
:func:`driver.api.v1alpha1.decode.decode_config` (the decoder NodePrepareResources runs too) and adds
the checks only a whole claim allows: per-device settings on a request that can allocate
several NICs. :func:`validate_object` judges a whole manifest, also what the apiserver's strict
field validation refuses around the configs (:func:`driver.api.v1alpha1.schema.document_errors`).
"""

from __future__ import annotations

from typing import Any

from driver.api.v1alpha1.conflicts import conflict_errors, interface_conflicts
from driver.api.v1alpha1.decode import MAX_POD_REQUESTS, configure_requests, decode_config
from driver.api.v1alpha1.fields import ConfigError, json_type_name
from driver.api.v1alpha1.merge import configs_for_request, request_matches
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.api.v1alpha1.schema import CLAIM_KINDS, document_errors
from driver.config import DRIVER_NAME


def _multi_device_requests(devices: dict[str, Any]) -> dict[str, str]:
    """Requests (and subrequests) that may allocate several devices -> why."""
    return {
        name: "allocationMode All" if count is None else f"count {count}"
        for alternatives in _device_counts(devices).values()
        for name, count in alternatives
        if count is None or count > 1
    }


def validate_claim_spec(spec: Any, path: str, driver_name: str = DRIVER_NAME) -> list[ConfigError]:
    """Validate the ``dra.net`` configs of a ResourceClaim spec (or a template's ``spec.spec``).

    Returns one :class:`ConfigError` per problem (empty when valid). Configs for other
    drivers are ignored. Besides decoding, it refuses per-device settings (interface name,
    addresses, MAC) on a request that can allocate several devices: every NIC would get the
    same name or address in the pod and the second one would fail at pod start.
    """
    if not isinstance(spec, dict):
        return [ConfigError(path, f"must be an object, got {json_type_name(spec)}")]
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
        if not isinstance(opaque, dict) or opaque.get("driver") != driver_name:
            continue
        ppath = f"{path}.devices.config[{i}].opaque.parameters"
        try:
            config = decode_config(opaque.get("parameters"), ppath)
        except ConfigError as exc:
            problems.extend(ConfigError(e.path, e.reason) for e in exc.errors)
            continue
        problems.extend(_per_device_conflicts(config, entry.get("requests"), multi, ppath))
    problems.extend(_cross_request_conflicts(devices, configs, path, driver_name))
    if not problems:
        problems.extend(_configure_budget(devices, configs, path, driver_name))
    return problems


def _device_counts(devices: dict[str, Any]) -> dict[str, list[tuple[str, int | None]]]:
    """Per request: its alternatives (the request itself, or its subrequests) and how many devices
    each allocates (None: ``allocationMode: All``, as many as the node has)."""
    out: dict[str, list[tuple[str, int | None]]] = {}
    for req in devices.get("requests") or []:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            continue
        subs = (
            [(req["name"], req.get("exactly"))]
            if req.get("exactly")
            else [(f"{req['name']}/{s.get('name')}", s) for s in req.get("firstAvailable") or [] if isinstance(s, dict)]
        )
        for name, spec in subs:
            if not isinstance(spec, dict):
                continue
            count = spec.get("count") if isinstance(spec.get("count"), int) else 1
            out.setdefault(req["name"], []).append((name, None if spec.get("allocationMode") == "All" else count))
    return out


def _configure_budget(devices: dict[str, Any], configs: list[Any], path: str, driver_name: str) -> list[ConfigError]:
    """The netlink requests that configure the claim's NICs in the pod (every request with a
    ``dra.net`` config, the largest of a request's alternatives), against :data:`MAX_POD_REQUESTS`.
    A request with ``allocationMode: All`` is counted at prepare, where its devices are known."""
    total, parts = 0, []
    for alternatives in _device_counts(devices).values():
        worst = (0, "")
        for name, count in alternatives:
            if count is None or not any(
                isinstance(c, dict)
                and isinstance(c.get("opaque"), dict)
                and c["opaque"].get("driver") == driver_name
                and request_matches(c.get("requests"), name)
                for c in configs
            ):
                continue
            try:
                each = configure_requests(configs_for_request(configs, name, driver_name))
            except ConfigError:
                continue  # reported by the decode
            worst = max(worst, (count * each, f"{name!r}: {count} NIC(s) x {each}"))
        if worst[0]:
            total += worst[0]
            parts.append(worst[1])
    if total <= MAX_POD_REQUESTS:
        return []
    reason = (
        f"the claim's NICs take {total} netlink requests to configure ({'; '.join(parts)}: one per address, "
        f"route, rule and neighbor, one per NIC, one per VRF); a pod's NICs may take at most {MAX_POD_REQUESTS} "
        "(they are sent in one batch, whose acknowledgements must fit the socket's receive buffer)"
    )
    return [ConfigError(f"{path}.devices.config", reason)]


def _request_names(devices: dict[str, Any]) -> list[str]:
    """Every request and subrequest name of a claim (``nic``, ``gpu/a100``)."""
    names = []
    for req in devices.get("requests") or []:
        if not isinstance(req, dict) or not isinstance(req.get("name"), str):
            continue
        subs = [s.get("name") for s in req.get("firstAvailable") or [] if isinstance(s, dict)]
        names += [f"{req['name']}/{s}" for s in subs if isinstance(s, str)] or [req["name"]]
    return names


def _cross_request_conflicts(
    devices: dict[str, Any], configs: list[Any], path: str, driver_name: str
) -> list[ConfigError]:
    """Two requests of one claim whose NICs would get the same name, address or MAC in the pod."""
    nics = []
    for name in _request_names(devices):
        try:
            nics.append((f"request {name!r}", name, configs_for_request(configs, name, driver_name)))
        except ConfigError:
            continue  # already reported by the decode above
    # Subrequests of one request are alternatives: only one of them is ever allocated.
    conflicts = [c for c in interface_conflicts(nics) if c.first_request.split("/", 1)[0] != c.request.split("/", 1)[0]]
    errors = conflict_errors(conflicts, configs, driver_name, f"{path}.devices.config")
    return [ConfigError(e.path, e.reason) for e in errors]


def _per_device_conflicts(config: NetworkConfig, requests: Any, multi: dict[str, str], ppath: str) -> list[ConfigError]:
    """Errors for interface settings that cannot be shared by the several NICs of one request."""
    iface = config.interface
    if iface is None:
        return []
    targets = [r for r in multi if request_matches(requests, r)]
    if not targets:
        return []
    out = []
    for fname, value in (("name", iface.name), ("addresses", iface.addresses), ("hardwareAddr", iface.hardware_addr)):
        if value:
            req = targets[0]
            out.append(
                ConfigError(
                    f"{ppath}.interface.{fname}",
                    f"applies to request {req!r} ({multi[req]}), which can allocate several NICs; "
                    "each would get the same value and pod start would fail (use one request per NIC)",
                )
            )
    return out


def validate_object(obj: Any) -> list[ConfigError]:
    """Validate one manifest; objects other than ResourceClaim(Template) are accepted as is.

    Besides the configs (:func:`validate_claim_spec`), what the apiserver's strict field
    validation refuses on the way to them: a ``config`` list in the wrong place would be dropped
    by an apiserver that does not validate strictly, and the NICs would get no config.
    """
    if not isinstance(obj, dict):
        return [ConfigError("(document)", f"must be an object, got {json_type_name(obj)}")]
    kind = obj.get("kind")
    if kind not in CLAIM_KINDS:
        return []
    problems = [ConfigError(e.path, e.reason) for e in document_errors(obj)]
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, dict) else None
    if spec is not None:
        said = {p.path for p in problems}  # a field the structure check refused is not judged twice
        problems += [p for p in validate_claim_spec(spec, CLAIM_KINDS[kind]) if p.path not in said]
    return problems
