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

SCHEMA_VERSION = 7
"""Version of both state files. 1: device configs as raw ``{"opaque": [params, ...]}`` dicts,
pods with ``rdma_moved``/``host_up``; 2: each device's config in its canonical typed form; 3: configs
may carry dranet's remaining fields (rules, neighbors, VRF, sysctls, GSO/GRO sizes, eBPF, DHCP,
profile) and pods what the hooks changed for them; 4: pods record how each NIC is found again
(its host and pod ifindex and its identity) and the links the hooks created; 5: what each NIC
setting recorded to undo itself is kept per setting, by its name (``MovedDevice.records``), in
place of one field per setting; 6: configs may set an SR-IOV VF's settings through its PF
(``sriov``) and pods carry that setting's record; 7: a claim may hold a VF on vfio-pci
(``sriov.driver``) with the kernel driver it goes back to. An older driver would ignore those
fields (moving a NIC without its VRF, without its host addresses, a VF without its VLAN, looking
for the netdev of a VF on vfio-pci and never giving it back to its driver) or fail on them, so it
must refuse the file.

A file is written with the oldest version its content needs (:data:`COMPATIBLE_VERSION`,
:data:`CONFIG_FIELDS_VERSION`, :data:`IDENTITY_VERSION`, :data:`RECORDS_VERSION`,
:data:`SRIOV_VERSION`): until a claim uses a newer field, an older driver (the old instance of a
rolling update with surge, a downgrade) keeps reading the files this one writes."""
SRIOV_VERSION = 6
"""The version a file is written as when it needs only version 6's fields (a VF's settings through its
PF), not a VF on vfio-pci."""
RECORDS_VERSION = 5
"""The version a file is written as when it needs only version 5's fields (settings' records, a
claim's sub-interfaces), not an SR-IOV VF's settings."""
IDENTITY_VERSION = 4
"""The version a pods file is written as when it needs only version 4's fields (no setting records)."""
CONFIG_FIELDS_VERSION = 3
"""The version a claims file is written as when a config holds version 3's fields."""
COMPATIBLE_VERSION = 2
"""The version written while nothing in a file needs a newer one."""


def check_version(data: dict[str, Any]) -> None:
    """Raise :class:`CheckpointError` unless ``data`` is a document of :data:`SCHEMA_VERSION` (what
    :func:`migrate` gives for any version this driver knows)."""
    version = data.get("version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
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


_V4_RECORDS: dict[str, tuple[str, str | None]] = {
    "host_addresses": ("addresses", "addresses"),
    "host_routes": ("addresses", "routes"),
    "host_rules": ("rules", None),
    "host_neighbors": ("neighbors", None),
    "host_features": ("ethtool", "features"),
    "host_private_flags": ("ethtool", "private_flags"),
    "host_offload_sizes": ("offload_sizes", None),
    "host_sysctls": ("sysctls", None),
    "vrf": ("vrf", None),
    "ebpf_detached": ("ebpf", None),
    "dhcp_lease": ("dhcp", None),
    "rdma_device": ("rdma", None),
}
"""A version-4 NIC's field -> (the setting whose record it is, its key in that record; None: the
whole record). The names are the settings' (driver.nic_settings); empty values are no record."""


def _v4_records(device: dict[str, Any]) -> dict[str, Any]:
    """A version-4 NIC with its settings' fields moved into ``records``."""
    out = {k: v for k, v in device.items() if k not in _V4_RECORDS}
    records: dict[str, Any] = {}
    for name, (setting, key) in _V4_RECORDS.items():
        value = device.get(name)
        if value in (None, "", [], {}):
            continue
        if key is None:
            records[setting] = value
        else:
            records.setdefault(setting, {})[key] = value
    if records:
        out["records"] = records
    return out


def _v4_to_v5(data: dict[str, Any]) -> dict[str, Any]:
    """Each NIC's per-setting fields become its ``records``, by setting name; claims are unchanged."""
    if "pods" not in data:
        return {**data, "version": 5}
    pods = {uid: {**p, "devices": [_v4_records(d) for d in p.get("devices", [])]} for uid, p in data["pods"].items()}
    return {**data, "version": 5, "pods": pods}


def _v5_to_v6(data: dict[str, Any]) -> dict[str, Any]:
    """Version 6 only adds optional fields: a version-5 file is a valid version-6 file."""
    return {**data, "version": 6}


def _v6_to_v7(data: dict[str, Any]) -> dict[str, Any]:
    """Version 7 only adds optional fields: a version-6 file is a valid version-7 file."""
    return {**data, "version": 7}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
    4: _v4_to_v5,
    5: _v5_to_v6,
    6: _v6_to_v7,
}
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
