"""Builders for the ResourceClaim fragments the claim-config tests feed the decoder."""

from __future__ import annotations

from typing import Any


def allocation_config(
    params: Any, requests: list[str] | None = None, source: str = "FromClaim", driver: str = "dra.net"
) -> dict[str, Any]:
    """One ``status.allocation.devices.config[]`` entry holding opaque ``params`` for ``driver``."""
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry
