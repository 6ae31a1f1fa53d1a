"""Unit tests of the dra.net claim configuration decoder and merging by request."""

from __future__ import annotations

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import NetworkConfig
from tests.support.claims import allocation_config

P = "spec.devices.config[1].opaque.parameters"


def errors_of(raw, path=P) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        decode_config(raw, path)
    return {e.path: e.reason for e in info.value.errors}


def test_full_config_round_trips():
    raw = {
        "apiVersion": "dra.net/v1alpha1",
        "kind": "NetworkConfig",
        "interface": {
            "name": "net1",
            "addresses": ["192.0.2.5/24", "2001:db8::5/64"],
            "mtu": 9000,
            "hardwareAddr": "02:AA:bb:cc:dd:ee",
        },
        "routes": [
            {"destination": "10.0.0.0/8", "gateway": "192.0.2.1"},
            {"destination": "198.51.100.0/24", "scope": "link", "table": 100},
        ],
        "ethtool": {"features": {"tso": False}, "privateFlags": {"x": True}},
        "rdma": {"injectEnv": False},
        "numa": {"pin": True},
    }
    config = decode_config(raw, P)
    assert config.interface.hardware_addr == "02:aa:bb:cc:dd:ee"
    assert config.routes[1].scope == 253 and config.routes[1].table == 100
    assert not config.rdma_env_enabled and config.numa_pin
    assert decode_config(config.to_parameters(), P) == config


def test_empty_config_is_valid_and_defaults():
    config = decode_config({}, P)
    assert config == NetworkConfig()
    assert config.rdma_env_enabled and not config.numa_pin


@pytest.mark.parametrize(
    "raw, path, fragment",
    [
        ({"bogus": 1}, f"{P}.bogus", "unknown field"),
        ({"interface": {"mtu": 67}}, f"{P}.interface.mtu", "between 68"),
        ({"interface": {"mtu": "9000"}}, f"{P}.interface.mtu", "must be an integer, got string"),
        ({"interface": {"mtu": True}}, f"{P}.interface.mtu", "must be an integer, got boolean"),
        ({"interface": {"name": "a" * 16}}, f"{P}.interface.name", "at most 15"),
        ({"interface": {"name": "a/b"}}, f"{P}.interface.name", "only letters"),
        ({"interface": {"name": ".."}}, f"{P}.interface.name", "not a valid"),
        ({"interface": {"name": "lo"}}, f"{P}.interface.name", "already exists"),
        ({"interface": {"hardwareAddr": "zz:00:00:00:00:00"}}, f"{P}.interface.hardwareAddr", "not a MAC"),
        ({"interface": {"hardwareAddr": "01:00:5e:00:00:01"}}, f"{P}.interface.hardwareAddr", "multicast"),
        ({"interface": {"addresses": ["192.0.2.5"]}}, f"{P}.interface.addresses[0]", "no prefix length"),
        ({"interface": {"addresses": ["192.0.2.5/33"]}}, f"{P}.interface.addresses[0]", "not a CIDR"),
        ({"interface": {"addresses": ["192.0.2.5/24", "192.0.2.5/24"]}}, f"{P}.interface.addresses[1]", "twice"),
        ({"routes": [{"gateway": "192.0.2.1"}]}, f"{P}.routes[0].destination", "required"),
        ({"routes": [{"destination": "10.0.0.0/8"}]}, f"{P}.routes[0].gateway", "universe-scope"),
        ({"routes": [{"destination": "10.0.0.0/8", "gateway": "2001:db8::1"}]}, f"{P}.routes[0].gateway", "IPv6"),
        (
            {"routes": [{"destination": "10.0.0.0/8", "scope": 200, "gateway": "10.0.0.1"}]},
            f"{P}.routes[0].scope",
            "not a supported scope",
        ),
        ({"routes": [{"destination": "10.0.0.0/8", "table": -1, "scope": 253}]}, f"{P}.routes[0].table", "between 0"),
        ({"ethtool": {"features": {"tso": "off"}}}, f"{P}.ethtool.features.tso", "must be a boolean"),
        ({"rdma": {"injectEnv": 1}}, f"{P}.rdma.injectEnv", "must be a boolean"),
        ({"numa": {"pin": True, "node": 1}}, f"{P}.numa.node", "unknown field"),
        ({"apiVersion": "dra.net/v2"}, f"{P}.apiVersion", "unsupported version"),
        ({"kind": "Other"}, f"{P}.kind", "unsupported kind"),
        ([], P, "must be an object"),
        (None, P, "must be an object, got null"),
    ],
)
def test_each_rule_names_the_field_path(raw, path, fragment):
    errors = errors_of(raw)
    assert path in errors, errors
    assert fragment in errors[path]


def test_all_errors_are_reported_at_once():
    errors = errors_of({"interface": {"name": "x" * 20, "mtu": 1}, "rules": {}})
    assert set(errors) == {f"{P}.interface.name", f"{P}.interface.mtu", f"{P}.rules"}


def test_configs_merge_class_first_then_claim_field_by_field():
    configs = [
        allocation_config({"interface": {"mtu": 9000}, "ethtool": {"features": {"a": True}}}, requests=["nic"]),
        allocation_config(
            {"interface": {"mtu": 1500, "name": "cls0"}, "ethtool": {"features": {"b": True}}}, source="FromClass"
        ),
        allocation_config({"interface": {"name": "other"}}, requests=["gpu"]),
        allocation_config({"interface": {"mtu": "bad"}}, driver="gpu.nvidia.com"),  # other driver: ignored
    ]
    config = configs_for_request(configs, "nic")
    # claim config (later) overrides mtu; the class config's name survives; maps merge key by key.
    assert config.interface.mtu == 9000
    assert config.interface.name == "cls0"
    assert config.ethtool.features == {"a": True, "b": True}


def test_config_for_request_applies_to_subrequests():
    configs = [allocation_config({"interface": {"mtu": 4000}}, requests=["nic"])]
    assert configs_for_request(configs, "nic/fast").interface.mtu == 4000
    assert configs_for_request(configs, "other").interface is None


def test_configs_for_request_errors_name_allocation_path():
    with pytest.raises(ConfigError) as info:
        configs_for_request([allocation_config({}), allocation_config({"interface": {"mtu": 1}})], "nic")
    assert info.value.path == "status.allocation.devices.config[1].opaque.parameters.interface.mtu"


def test_canonical_parameters_read_back_without_decoding():
    """The checkpoint's form: from_parameters is the exact inverse of to_parameters."""
    raw = {
        "interface": {"name": "net1", "addresses": ["192.0.2.5/24"], "mtu": 9000, "hardwareAddr": "02:aa:bb:cc:dd:ee"},
        "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"}],
        "ethtool": {"features": {"tso": False}, "privateFlags": {"x": True}},
        "rdma": {"injectEnv": False},
        "numa": {"pin": True},
    }
    config = decode_config(raw, P)
    assert NetworkConfig.from_parameters(config.to_parameters()) == config
    assert NetworkConfig.from_parameters(NetworkConfig().to_parameters()) == NetworkConfig()
