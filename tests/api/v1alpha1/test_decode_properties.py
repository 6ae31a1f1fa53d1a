"""Property tests: any JSON value decodes to a NetworkConfig or a ConfigError with a path."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.api.v1alpha1.validation import validate_claim_spec
from driver.claims.numa_pinning import format_cpulist, parse_cpulist

P = "spec.devices.config[0].opaque.parameters"

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=25,
)
# Values shaped like our schema, so the deep validation paths are exercised, not only the top level.
ip_like = st.sampled_from(["192.0.2.5/24", "10.0.0.0/8", "2001:db8::1/64", "192.0.2.1", "::1", "x", "1.2.3.4/40", ""])
shaped = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.sampled_from(["dra.net/v1alpha1", "v1"]) | json_scalars,
        "interface": st.fixed_dictionaries(
            {},
            optional={
                "name": st.text(max_size=18) | json_scalars,
                "addresses": st.lists(ip_like | json_scalars, max_size=3) | json_scalars,
                "mtu": st.integers(-10, 70000) | json_scalars,
                "hardwareAddr": st.sampled_from(["02:00:00:00:00:01", "01:00:00:00:00:00", "00:00:00:00:00:00"])
                | json_scalars,
            },
        )
        | json_values,
        "routes": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "destination": ip_like | json_scalars,
                    "gateway": ip_like | json_scalars,
                    "source": ip_like,
                    "scope": st.sampled_from([0, 253, 1, "link", "host"]) | json_scalars,
                    "table": st.integers(-5, 2**33) | json_scalars,
                },
            ),
            max_size=3,
        )
        | json_values,
        "ethtool": st.fixed_dictionaries({}, optional={"features": st.dictionaries(st.text(max_size=5), json_scalars)}),
        "rdma": st.fixed_dictionaries({}, optional={"injectEnv": json_scalars}),
        "numa": st.fixed_dictionaries({}, optional={"pin": json_scalars}) | json_values,
    },
)


def _check(raw):
    try:
        config = decode_config(raw, P)
    except ConfigError as exc:
        assert exc.errors, "a ConfigError must hold at least one error"
        for error in exc.errors:
            assert error.path.startswith(P), error
            assert error.reason
        return
    assert isinstance(config, NetworkConfig)
    # A valid config re-encodes to parameters that decode to the same config.
    assert decode_config(config.to_parameters(), P) == config


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_any_json_value(raw):
    _check(raw)


@settings(max_examples=600, deadline=None)
@given(shaped)
def test_schema_shaped_values(raw):
    _check(raw)


@settings(max_examples=200, deadline=None)
@given(json_values, json_values)
def test_claim_level_functions_never_crash(spec, params):
    for problem in validate_claim_spec(spec, "spec"):
        assert problem.path.startswith("spec")
    claim = {
        "devices": {
            "requests": spec if isinstance(spec, list) else [],
            "config": [{"opaque": {"driver": "dra.net", "parameters": params}}],
        }
    }
    for problem in validate_claim_spec(claim, "spec"):
        assert problem.path.startswith("spec.devices.config[0]")
    try:
        configs_for_request([{"opaque": {"driver": "dra.net", "parameters": params}}, spec], "nic")
    except ConfigError as exc:
        assert exc.path.startswith("status.allocation.devices.config[")


@given(st.sets(st.integers(0, 511), max_size=64))
def test_cpulist_format_parse_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == cpus
