"""Unit tests of claim-level validation (the webhook's and ``dranet validate``'s checks)."""

from __future__ import annotations

from driver.api.v1alpha1.validation import validate_claim_spec


def _claim(config_params, count=1, requests=("nic",)):
    return {
        "devices": {
            "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net", "count": count}}],
            "config": [
                {"opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": 1}}},
                {"requests": list(requests), "opaque": {"driver": "dra.net", "parameters": config_params}},
            ],
        }
    }


def test_validate_claim_spec_only_checks_our_driver():
    assert validate_claim_spec(_claim({"interface": {"mtu": 9000}}), "spec") == []
    problems = validate_claim_spec(_claim({"interface": {"mtu": 1}}), "spec.spec")
    assert [p.path for p in problems] == ["spec.spec.devices.config[1].opaque.parameters.interface.mtu"]


def test_validate_claim_spec_refuses_a_name_shared_by_several_nics():
    problems = validate_claim_spec(_claim({"interface": {"name": "net1"}}, count=4), "spec")
    assert len(problems) == 1
    assert problems[0].path == "spec.devices.config[1].opaque.parameters.interface.name"
    assert "count 4" in problems[0].reason
    assert validate_claim_spec(_claim({"interface": {"mtu": 9000}}, count=4), "spec") == []


def _routes(n: int) -> list[dict[str, str]]:
    return [{"destination": f"10.{i // 250}.{i % 250}.0/24", "gateway": "192.168.1.1"} for i in range(n)]


def test_one_nics_addresses_routes_rules_and_neighbors_are_bounded():
    from driver.api.v1alpha1.decode import MAX_NIC_ENTRIES

    params = {"interface": {"addresses": ["192.168.1.5/24"]}, "routes": _routes(MAX_NIC_ENTRIES)}
    problems = validate_claim_spec(_claim(params), "spec")
    assert [p.path for p in problems] == ["spec.devices.config[1].opaque.parameters"]
    assert f"{MAX_NIC_ENTRIES + 1} addresses, routes, rules and neighbors" in problems[0].reason
    assert f"at most {MAX_NIC_ENTRIES}" in problems[0].reason
    params["routes"] = _routes(MAX_NIC_ENTRIES - 1)
    assert validate_claim_spec(_claim(params), "spec") == []


def test_a_claims_nics_are_bounded_by_the_pods_netlink_batch():
    """4 NICs x (48 routes + 1 link-up) = 196 requests: admitted; x (50 + 1) = 204: refused, the
    limit and the arithmetic named. Counted for the largest alternative of a firstAvailable request."""
    from driver.api.v1alpha1.decode import MAX_POD_REQUESTS

    assert MAX_POD_REQUESTS == 200
    assert validate_claim_spec(_claim({"routes": _routes(48)}, count=4), "spec") == []
    problems = validate_claim_spec(_claim({"routes": _routes(50)}, count=4), "spec")
    assert [p.path for p in problems] == ["spec.devices.config"]
    assert "204 netlink requests" in problems[0].reason and "'nic': 4 NIC(s) x 51" in problems[0].reason
    assert f"at most {MAX_POD_REQUESTS}" in problems[0].reason
    # Two requests of one claim add up; a request without a dra.net config (the GPUs) costs nothing here.
    two = {
        "devices": {
            "requests": [
                {"name": "a", "exactly": {"deviceClassName": "dranet.net", "count": 2}},
                {"name": "b", "firstAvailable": [{"name": "x", "deviceClassName": "dranet.net", "count": 2}]},
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}},
            ],
            "config": [{"opaque": {"driver": "dra.net", "parameters": {"routes": _routes(50)}}}],
        }
    }
    (problem,) = validate_claim_spec(two, "spec")
    assert "'a': 2 NIC(s) x 51" in problem.reason and "'b/x': 2 NIC(s) x 51" in problem.reason
    # allocationMode All: how many NICs is known at prepare only (checked there).
    every = _claim({"routes": _routes(100)})
    every["devices"]["requests"][0]["exactly"] = {"deviceClassName": "dranet.net", "allocationMode": "All"}
    assert validate_claim_spec(every, "spec") == []
