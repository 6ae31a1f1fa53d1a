"""Unit tests of the dra.net claim configuration decoder, merging and container helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.claim_config import (
    ConfigError,
    NetworkConfig,
    configs_for_request,
    container_env,
    cpuset_for,
    format_cpulist,
    parse_cpulist,
    decode_config,
    numa_pin_node,
    prepare_decoder,
    stored_config,
    validate_claim_spec,
)

P = "spec.devices.config[1].opaque.parameters"


def errors_of(raw, path=P) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        decode_config(raw, path)
    return {e.path: e.reason for e in info.value.errors}


def test_full_config_round_trips():
    raw = {
        "apiVersion": "dra.net/v1alpha1", "kind": "NetworkConfig",
        "interface": {"name": "net1", "addresses": ["192.0.2.5/24", "2001:db8::5/64"], "mtu": 9000,
                      "hardwareAddr": "02:AA:bb:cc:dd:ee"},
        "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1"},
                   {"destination": "198.51.100.0/24", "scope": "link", "table": 100}],
        "ethtool": {"features": {"tso": False}, "privateFlags": {"x": True}},
        "rdma": {"injectEnv": False}, "numa": {"pin": True},
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


@pytest.mark.parametrize("raw, path, fragment", [
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
    ({"routes": [{"destination": "10.0.0.0/8", "scope": 200, "gateway": "10.0.0.1"}]}, f"{P}.routes[0].scope",
     "not a supported scope"),
    ({"routes": [{"destination": "10.0.0.0/8", "table": -1, "scope": 253}]}, f"{P}.routes[0].table", "between 0"),
    ({"ethtool": {"features": {"tso": "off"}}}, f"{P}.ethtool.features.tso", "must be a boolean"),
    ({"rdma": {"injectEnv": 1}}, f"{P}.rdma.injectEnv", "must be a boolean"),
    ({"numa": {"pin": True, "node": 1}}, f"{P}.numa.node", "unknown field"),
    ({"apiVersion": "dra.net/v2"}, f"{P}.apiVersion", "unsupported version"),
    ({"kind": "Other"}, f"{P}.kind", "unsupported kind"),
    ([], P, "must be an object"),
    (None, P, "must be an object, got null"),
])
def test_each_rule_names_the_field_path(raw, path, fragment):
    errors = errors_of(raw)
    assert path in errors, errors
    assert fragment in errors[path]


def test_all_errors_are_reported_at_once():
    errors = errors_of({"interface": {"name": "x" * 20, "mtu": 1}, "rules": []})
    assert set(errors) == {f"{P}.interface.name", f"{P}.interface.mtu", f"{P}.rules"}


def _cfg(params, requests=None, source="FromClaim", driver="dra.net"):
    entry = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def test_configs_merge_class_first_then_claim_field_by_field():
    configs = [
        _cfg({"interface": {"mtu": 9000}, "ethtool": {"features": {"a": True}}}, requests=["nic"]),
        _cfg({"interface": {"mtu": 1500, "name": "cls0"}, "ethtool": {"features": {"b": True}}}, source="FromClass"),
        _cfg({"interface": {"name": "other"}}, requests=["gpu"]),
        _cfg({"interface": {"mtu": "bad"}}, driver="gpu.nvidia.com"),  # other driver: ignored
    ]
    config = configs_for_request(configs, "nic")
    # claim config (later) overrides mtu; the class config's name survives; maps merge key by key.
    assert config.interface.mtu == 9000
    assert config.interface.name == "cls0"
    assert config.ethtool.features == {"a": True, "b": True}


def test_config_for_request_applies_to_subrequests():
    configs = [_cfg({"interface": {"mtu": 4000}}, requests=["nic"])]
    assert configs_for_request(configs, "nic/fast").interface.mtu == 4000
    assert configs_for_request(configs, "other").interface is None


def test_configs_for_request_errors_name_allocation_path():
    with pytest.raises(ConfigError) as info:
        configs_for_request([_cfg({}), _cfg({"interface": {"mtu": 1}})], "nic")
    assert info.value.path == "status.allocation.devices.config[1].opaque.parameters.interface.mtu"


def _claim(config_params, count=1, requests=("nic",)):
    return {"devices": {
        "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net", "count": count}}],
        "config": [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"anything": 1}}},
                   {"requests": list(requests), "opaque": {"driver": "dra.net", "parameters": config_params}}],
    }}


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


def test_container_env_exact_match_and_opt_out():
    env = container_env([({}, "mlx5_1"), (None, "mlx5_0"), ({}, None)])
    assert env == {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "DRANET_RDMA_DEVICES": "mlx5_0,mlx5_1"}
    assert container_env([({"rdma": {"injectEnv": False}}, "mlx5_0")]) == {}
    assert container_env([({}, None)]) == {}


def test_numa_pin_node():
    pin = {"numa": {"pin": True}}
    assert numa_pin_node([({}, 0, "a"), ({}, 1, "b")]) is None  # not asked for
    assert numa_pin_node([(pin, 1, "a"), ({}, 1, "b")]) == 1
    with pytest.raises(ConfigError, match=r"span several \(node 0: a; node 1: b\)"):
        numa_pin_node([(pin, 0, "a"), (pin, 1, "b")])
    with pytest.raises(ConfigError, match="NUMA node of a is unknown"):
        numa_pin_node([(pin, -1, "a")])


def test_cpuset_for_reads_the_node_cpulist(tmp_path: Path):
    node = tmp_path / "devices/system/node/node1"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("24-47,72-95\n")
    plan = cpuset_for(1, str(tmp_path))
    assert (plan.cpus, plan.mems, plan.numa_node) == ("24-47,72-95", "1", 1)
    with pytest.raises(FileNotFoundError):
        cpuset_for(5, str(tmp_path))
    # Only ever narrowed: the kubelet's cpuset intersected with the node's CPUs.
    assert cpuset_for(1, str(tmp_path), requested="0-95").cpus == "24-47,72-95"
    assert cpuset_for(1, str(tmp_path), requested="20-30,80").cpus == "24-30,80"
    with pytest.raises(ConfigError, match="outside NUMA node 1"):
        cpuset_for(1, str(tmp_path), requested="0-3")


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert format_cpulist(parse_cpulist("")) == ""


def test_prepare_decoder_output_is_what_the_helpers_read():
    configs = [_cfg({"rdma": {"injectEnv": False}}, source="FromClass"),
               _cfg({"numa": {"pin": True}, "interface": {"mtu": 9000}}, requests=["nic"])]
    stored = prepare_decoder(configs, "nic", "nic/fast", "dra.net")
    assert list(stored) == ["opaque"] and len(stored["opaque"]) == 1
    config = stored_config(stored)
    assert config.numa_pin and not config.rdma_env_enabled and config.interface.mtu == 9000
    assert container_env([(stored, "mlx5_0")]) == {}
    assert numa_pin_node([(stored, 1, "nic-a")]) == 1
    # prepare's own (unvalidated) shape with several parameter objects is merged in order too.
    assert stored_config({"opaque": [{"interface": {"mtu": 1500}}, {"interface": {"mtu": 4000}}]}).interface.mtu == 4000
    with pytest.raises(ConfigError) as info:
        prepare_decoder([_cfg({"interface": {"mtu": 1}})], "nic", "nic", "dra.net")
    assert info.value.path == "status.allocation.devices.config[0].opaque.parameters.interface.mtu"


def _prepared(name, numa, rdma, config):
    from driver.checkpoint import PreparedDevice
    from driver.model import Device, HostFacts
    attrs = {"dra.net/numaNode": numa} if numa is not None else {}
    return PreparedDevice("nic", "node-a", name, Device(name, attrs, HostFacts(rdma_device=rdma)), config)


def test_container_settings_env_and_cpuset(tmp_path: Path):
    from driver.claim_config import container_settings
    for n, cpus in ((0, "0-47"), (1, "48-95")):
        d = tmp_path / f"devices/system/node/node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus)
    pin = prepare_decoder([_cfg({"numa": {"pin": True}})], "nic", "nic", "dra.net")
    devs = [_prepared("a", 1, "mlx5_4", pin), _prepared("b", 1, "mlx5_5", pin)]
    out = container_settings(devs, str(tmp_path), requested_cpus="0-95")
    assert out.env == {"NCCL_IB_HCA": "=mlx5_4,mlx5_5", "DRANET_RDMA_DEVICES": "mlx5_4,mlx5_5"}
    assert (out.cpuset.cpus, out.cpuset.mems, out.skipped_pin) == ("48-95", "1", None)
    # Exclusive CPUs on the other node: not pinned, with the reason.
    out = container_settings(devs, str(tmp_path), requested_cpus="2-3")
    assert out.cpuset is None and "outside NUMA node 1" in out.skipped_pin
    # Spanning nodes: not pinned, reason names the nodes; env still injected.
    out = container_settings([_prepared("a", 0, "mlx5_0", pin), _prepared("b", 1, "mlx5_5", pin)], str(tmp_path))
    assert out.cpuset is None and "node 0: a; node 1: b" in out.skipped_pin and out.env
    # No pin asked: no cpuset, no complaint.
    out = container_settings([_prepared("a", 0, None, {})], str(tmp_path))
    assert out == type(out)()
