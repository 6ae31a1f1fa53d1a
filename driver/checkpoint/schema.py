"""The versions of the state files: which this driver reads and writes, and how older ones migrate.

Each file carries ``version`` (:data:`SCHEMA_VERSION`); an older file is migrated when read
(:data:`MIGRATIONS`, one step per version), a newer one is refused: a downgraded driver must not
guess at state it cannot read. :func:`encode` gives a file's bytes with their version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from driver.api.v1alpha1.network_config import NetworkConfig
from driver.checkpoint.errors import CheckpointError

SCHEMA_VERSION = 4
"""Version of both state files. 1: device configs as raw ``{"opaque": [params, ...]}`` dicts,
pods with ``rdma_moved``/``host_up``; 2: each device's config in its canonical typed form; 3: configs
may carry dranet's remaining fields (rules, neighbors, VRF, sysctls, GSO/GRO sizes, eBPF, DHCP,
profile) and pods what the hooks changed for them; 4: pods record how each NIC is found again
(its host and pod ifindex and its identity) and the links the hooks created. An older driver would
ignore those fields (moving a NIC without its VRF) or fail on them, so it must refuse the file.

A file is written with the oldest version its content needs (:data:`COMPATIBLE_VERSION`,
:data:`CONFIG_FIELDS_VERSION`): until a claim uses one of those fields, an older driver (the old
instance of a rolling update with surge, a downgrade) keeps reading the files this one writes."""
CONFIG_FIELDS_VERSION = 3
"""The version a file is written as when it needs only version 3's fields."""
COMPATIBLE_VERSION = 2
"""The version written while nothing in a file needs a newer one."""


def check_version(data: dict[str, Any]) -> None:
    """Raise :class:`CheckpointError` unless ``data`` is a document of a version read as is."""
    version = data.get("version")
    # Versions 3 and 4 only add optional fields: an older file is a valid newer one (see COMPATIBLE_VERSION).
    if version not in (COMPATIBLE_VERSION, CONFIG_FIELDS_VERSION, SCHEMA_VERSION) or isinstance(version, bool):
        raise CheckpointError(f"checkpoint schema version {version!r} is not {SCHEMA_VERSION}")


def _v1_config(config: dict[str, Any] | None) -> dict[str, Any]:
    """A version-1 device config (flat parameters, or prepare's ``{"opaque": [params, ...]}``
    merged in order) as canonical parameters. Version-1 daemons stored only configs their strict
    decoder had accepted, in canonical form, so reading them back needs no validation."""
    config = config or {}
    params = config["opaque"] if isinstance(config.get("opaque"), list) else [config]
    merged = NetworkConfig()
    for p in params:
        merged = merged.merged(NetworkConfig.from_parameters(p or {}))
    return merged.to_parameters()


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    claims = {
        uid: {**c, "devices": [{**d, "config": _v1_config(d.get("config"))} for d in c.get("devices", [])]}
        for uid, c in data.get("claims", {}).items()
    }
    dropped = ("rdma_moved", "host_up")  # never read: a moved RDMA device follows its netdev; links come back up
    pods = {
        uid: {**p, "devices": [{k: v for k, v in d.items() if k not in dropped} for d in p.get("devices", [])]}
        for uid, p in data.get("pods", {}).items()
    }
    return {
        **data,
        "version": 2,
        **({"claims": claims} if "claims" in data else {}),
        **({"pods": pods} if "pods" in data else {}),
    }


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 only adds optional fields: a version-2 file is a valid version-3 file."""
    return {**data, "version": 3}


def _v3_to_v4(data: dict[str, Any]) -> dict[str, Any]:
    """Version 4 only adds optional fields: a NIC recorded without them is found as it was then."""
    return {**data, "version": 4}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
"""Version N -> the function that turns a version-N file into version N + 1."""


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A state file of any version this driver knows, brought to :data:`SCHEMA_VERSION`.

    Files without ``version`` are refused like any unknown version; so is a file from a newer
    driver, with a message that says so.
    """
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise CheckpointError(
            f"checkpoint schema version {version} was written by a newer driver (this one "
            f"reads versions 1 to {SCHEMA_VERSION}); refusing to start rather than lose state"
        )
    while version in MIGRATIONS:
        data = MIGRATIONS[version](data)
        version = data["version"]
    check_version(data)
    return data


def data_version(raw: bytes) -> Any:
    """The ``version`` of a state file's bytes, or None when they are not a JSON object."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return data.get("version") if isinstance(data, dict) else None


def encode(body: dict[str, Any], version: int = COMPATIBLE_VERSION) -> bytes:
    """A state file's bytes: ``body`` with ``version``, compact and with sorted keys (stable bytes,
    so an unchanged state compares equal and is not written again)."""
    return json.dumps({"version": version, **body}, sort_keys=True, separators=(",", ":")).encode()
