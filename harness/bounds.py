"""The heaviest claim configuration the API admits: two claims of two NICs each, at the bounds.

Per claim, one NIC with the most entries a NIC may have (:data:`MAX_NIC_ENTRIES`: addresses,
routes, rules and neighbors) and one taking the claim to the most netlink requests a claim may
take (:data:`MAX_POD_REQUESTS`); a pod holding both claims is configured with 400 requests. Used by
the hooks' test at the bounds and by ``bench_hooks --bounds``.
"""

from __future__ import annotations

from typing import Any

from driver.api.v1alpha1.decode import MAX_NIC_ENTRIES, MAX_POD_REQUESTS


def nic_params(i: int, routes: int, neighbors: int) -> dict[str, Any]:
    """NIC ``i``'s config: two addresses, two rules, ``routes`` routes (half in a table of its own)
    and ``neighbors`` permanent neighbors."""
    table = 100 + i
    return {
        "interface": {"name": f"heavy{i}", "addresses": [f"192.168.{i}.2/24", f"fd00:{i + 1}::2/64"]},
        "routes": [
            {"destination": f"10.{100 + i}.{k // 16}.{(k % 16) * 16}/28", "gateway": f"192.168.{i}.1"}
            | ({"table": table} if k % 2 else {})
            for k in range(routes)
        ],
        "rules": [
            {"priority": 1000 + 10 * i + k, "source": f"192.168.{i}.{16 + k}/32", "table": table} for k in range(2)
        ],
        "neighbors": [
            {"destination": f"192.168.{i}.{128 + k}", "hardwareAddr": f"02:00:00:{i:02x}:{k:02x}:01"}
            for k in range(neighbors)
        ],
    }


def entries(params: dict[str, Any]) -> int:
    """Addresses, routes, rules and neighbors of one NIC's config (its requests, less the link-up)."""
    return len(params["interface"]["addresses"]) + sum(len(params[k]) for k in ("routes", "rules", "neighbors"))


FULL_ROUTES = MAX_NIC_ENTRIES - 2 - 2 - 4
"""Routes of the NIC at the per-NIC bound (with 2 addresses, 2 rules and 4 neighbors)."""
REST_ROUTES = MAX_POD_REQUESTS - (MAX_NIC_ENTRIES + 1) - 1 - 2 - 2 - 6
"""Routes of the claim's other NIC, taking the claim to its bound (with 2 addresses, 2 rules, 6 neighbors)."""


def at_the_bounds() -> list[dict[str, Any]]:
    """Four NIC configs: NICs 0 and 1 are one claim, 2 and 3 the other, each claim at the bounds."""
    return [
        nic_params(0, FULL_ROUTES, 4),
        nic_params(1, REST_ROUTES, 6),
        nic_params(2, FULL_ROUTES, 4),
        nic_params(3, REST_ROUTES, 6),
    ]
