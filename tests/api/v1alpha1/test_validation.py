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
