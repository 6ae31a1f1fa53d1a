"""The fields dranet's ``NetworkConfig`` has beyond name/addresses/MTU/MAC/routes/ethtool:
decoded strictly, errors naming the field path, stored in the typed model, canonical form round-trips."""

from __future__ import annotations

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.network_config import NeighborConfig, NetworkConfig, RuleConfig, VrfConfig

P = "spec.devices.config[0].opaque.parameters"

FULL = {
    "interface": {
        "name": "net1",
        "addresses": ["192.0.2.5/24"],
        "mtu": 9000,
        "hardwareAddr": "02:00:00:00:00:01",
        "gsoMaxSize": 65536,
        "groMaxSize": 65536,
        "gsoIPv4MaxSize": 65536,
        "groIPv4MaxSize": 65536,
        "disableEbpfPrograms": True,
        "forwarding": True,
        "arpIgnore": 1,
        "arpAnnounce": 2,
    },
    "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "table": 100}],
    "rules": [
        {"priority": 100, "source": "192.0.2.0/24", "table": 100},
        {"destination": "2001:db8::/32", "table": 200},
    ],
    "neighbors": [
        {"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:AA"},
        {"destination": "2001:db8::1", "hardwareAddr": "02-00-00-00-00-bb"},
    ],
    "ethtool": {"features": {"tso": False}},
    "profile": "rdma-fast",
    "rdma": {"injectEnv": True},
    "numa": {"pin": False},
}


def errors_of(raw: object) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        decode_config(raw, P)
    return {e.path: e.reason for e in info.value.errors}


def test_every_dranet_field_is_decoded_into_the_typed_model() -> None:
    config = decode_config(FULL, P)
    iface = config.interface
    assert iface is not None
    assert (iface.gso_max_size, iface.gro_max_size, iface.gso_ipv4_max_size, iface.gro_ipv4_max_size) == (65536,) * 4
    assert iface.offload_sizes == dict.fromkeys(("gsoMaxSize", "groMaxSize", "gsoIPv4MaxSize", "groIPv4MaxSize"), 65536)
    assert iface.disable_ebpf_programs and iface.forwarding and iface.sysctls_set
    assert (iface.arp_ignore, iface.arp_announce) == (1, 2)
    assert config.rules == (
        RuleConfig(priority=100, source="192.0.2.0/24", table=100),
        RuleConfig(destination="2001:db8::/32", table=200),
    )
    assert config.neighbors == (
        NeighborConfig("192.0.2.1", "02:00:00:00:00:aa"),
        NeighborConfig("2001:db8::1", "02:00:00:00:00:bb"),
    )
    assert config.profile == "rdma-fast"
    assert decode_config(config.to_parameters(), P) == config
    assert NetworkConfig.from_parameters(config.to_parameters()) == config


def test_dhcp_and_vrf_round_trip() -> None:
    config = decode_config({"interface": {"dhcp": True, "vrf": {"name": "vrf-blue", "table": 10}}}, P)
    assert config.interface is not None
    assert config.interface.dhcp is True and config.interface.vrf == VrfConfig("vrf-blue", 10)
    assert decode_config(config.to_parameters(), P) == config
    assert NetworkConfig.from_parameters(config.to_parameters()) == config
    no_table = decode_config({"interface": {"vrf": {"name": "v"}}}, P)
    assert no_table.interface is not None and no_table.interface.vrf == VrfConfig("v", None)
    assert decode_config(no_table.to_parameters(), P) == no_table


def test_rule_host_bits_are_dropped_like_the_kernel_matches() -> None:
    config = decode_config({"rules": [{"source": "10.1.2.3/16", "table": 5}]}, P)
    assert config.rules == (RuleConfig(source="10.1.0.0/16", table=5),)


def test_neighbor_ip_address_spelling_of_dranet_docs_is_accepted() -> None:
    config = decode_config({"neighbors": [{"ipAddress": "192.168.1.1", "hardwareAddr": "00:11:22:33:44:55"}]}, P)
    assert config.neighbors == (NeighborConfig("192.168.1.1", "00:11:22:33:44:55"),)
    assert "ipAddress" not in str(config.to_parameters())


def test_infiniband_neighbor_address_of_20_octets() -> None:
    lladdr = ":".join(["80"] + ["00"] * 19)
    config = decode_config({"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": lladdr}]}, P)
    assert config.neighbors is not None and config.neighbors[0].hardware_addr == lladdr


@pytest.mark.parametrize(
    "raw, path, fragment",
    [
        ({"interface": {"dhcp": "yes"}}, f"{P}.interface.dhcp", "must be a boolean"),
        ({"interface": {"dhcp": True, "addresses": ["192.0.2.5/24"]}}, f"{P}.interface.dhcp", "mutually exclusive"),
        ({"interface": {"gsoMaxSize": 0}}, f"{P}.interface.gsoMaxSize", "between 1 and 2147483647"),
        ({"interface": {"groIPv4MaxSize": 2**31}}, f"{P}.interface.groIPv4MaxSize", "between 1"),
        ({"interface": {"groMaxSize": "64k"}}, f"{P}.interface.groMaxSize", "must be an integer"),
        ({"interface": {"disableEbpfPrograms": 1}}, f"{P}.interface.disableEbpfPrograms", "must be a boolean"),
        ({"interface": {"forwarding": "true"}}, f"{P}.interface.forwarding", "must be a boolean"),
        ({"interface": {"arpIgnore": 4}}, f"{P}.interface.arpIgnore", "0, 1, 2, 3 or 8"),
        ({"interface": {"arpIgnore": 9}}, f"{P}.interface.arpIgnore", "between 0 and 8"),
        ({"interface": {"arpAnnounce": 3}}, f"{P}.interface.arpAnnounce", "between 0 and 2"),
        ({"interface": {"vrf": {}}}, f"{P}.interface.vrf.name", "is required"),
        ({"interface": {"vrf": {"name": "v", "table": 254}}}, f"{P}.interface.vrf.table", "main table"),
        ({"interface": {"vrf": {"name": "v", "table": 0}}}, f"{P}.interface.vrf.table", "between 1"),
        ({"interface": {"vrf": {"name": "v" * 16}}}, f"{P}.interface.vrf.name", "at most 15"),
        ({"interface": {"vrf": {"name": "v", "mode": 1}}}, f"{P}.interface.vrf.mode", "unknown field"),
        ({"interface": {"name": "n", "vrf": {"name": "n"}}}, f"{P}.interface.vrf.name", "own name"),
        (
            {"interface": {"vrf": {"name": "v"}}, "rules": [{"table": 1}]},
            f"{P}.rules",
            "cannot be combined with interface.vrf",
        ),
        ({"rules": [{"priority": 32768}]}, f"{P}.rules[0].priority", "between 0 and 32767"),
        ({"rules": [{"source": "10.0.0.1"}]}, f"{P}.rules[0].source", "not a CIDR"),
        ({"rules": [{"destination": "nope/8"}]}, f"{P}.rules[0].destination", "not a CIDR"),
        ({"rules": [{"source": "10.0.0.0/8", "destination": "::/0"}]}, f"{P}.rules[0]", "different IP families"),
        ({"rules": [{"table": -1}]}, f"{P}.rules[0].table", "between 0"),
        ({"rules": [{"table": 1}, {"table": 1}]}, f"{P}.rules[1]", "listed twice"),
        ({"rules": [{"iif": "eth0"}]}, f"{P}.rules[0].iif", "unknown field"),
        ({"rules": {}}, f"{P}.rules", "must be an array of rules"),
        ({"neighbors": [{"hardwareAddr": "02:00:00:00:00:01"}]}, f"{P}.neighbors[0].destination", "is required"),
        ({"neighbors": [{"destination": "10.0.0.1"}]}, f"{P}.neighbors[0].hardwareAddr", "is required"),
        (
            {"neighbors": [{"destination": "10.0.0.0/24", "hardwareAddr": "02:00:00:00:00:01"}]},
            f"{P}.neighbors[0].destination",
            "not an IP address",
        ),
        (
            {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00"}]},
            f"{P}.neighbors[0].hardwareAddr",
            "not a link-layer address",
        ),
        (
            {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00-00:00:00:01"}]},
            f"{P}.neighbors[0].hardwareAddr",
            "not a link-layer address",
        ),
        (
            {"neighbors": [{"destination": "10.0.0.1", "ipAddress": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:01"}]},
            f"{P}.neighbors[0].ipAddress",
            "give only one",
        ),
        (
            {
                "neighbors": [
                    {"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:01"},
                    {"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:02"},
                ]
            },
            f"{P}.neighbors[1]",
            "listed twice",
        ),
        ({"profile": ""}, f"{P}.profile", "1 to 253"),
        ({"profile": "a b"}, f"{P}.profile", "without spaces"),
        ({"profile": 3}, f"{P}.profile", "must be a string"),
    ],
)
def test_each_new_rule_names_the_field_path(raw: object, path: str, fragment: str) -> None:
    errors = errors_of(raw)
    assert path in errors, errors
    assert fragment in errors[path], errors[path]


def test_unknown_top_level_field_lists_the_new_ones() -> None:
    reason = errors_of({"bogus": 1})[f"{P}.bogus"]
    for name in ("rules", "neighbors", "profile", "rdma", "numa"):
        assert name in reason


def test_lists_replace_and_vrf_merges_field_by_field() -> None:
    base = decode_config({"rules": [{"table": 1}], "routes": [{"destination": "10.0.0.0/8", "scope": 253}]}, P)
    base = base.merged(decode_config({"interface": {"vrf": {"name": "a", "table": 10}}}, P))
    over = decode_config({"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:01"}]}, P)
    merged = base.merged(over).merged(decode_config({"interface": {"vrf": {"name": "b"}}}, P))
    assert merged.rules == (RuleConfig(table=1),)  # merged by hand here; configs_for_request refuses this mix
    assert merged.neighbors == over.neighbors
    assert merged.interface is not None and merged.interface.vrf == VrfConfig("b", 10)


def test_merged_configs_are_checked_for_combinations_too() -> None:
    from driver.api.v1alpha1.merge import configs_for_request
    from tests.support.claims import allocation_config

    configs = [
        allocation_config({"interface": {"vrf": {"name": "v"}}}, source="FromClass"),
        allocation_config({"rules": [{"table": 7}]}),
    ]
    with pytest.raises(ConfigError) as info:
        configs_for_request(configs, "nic")
    assert "merged for request 'nic'" in info.value.path and "interface.vrf" in info.value.reason
    dhcp = [allocation_config({"interface": {"dhcp": True}}), allocation_config({"interface": {"addresses": []}})]
    assert configs_for_request(dhcp, "nic").interface is not None


def test_vrfs_of_one_claim_must_agree() -> None:
    from driver.api.v1alpha1.validation import validate_claim_spec

    def spec(*configs: tuple[str, dict[str, object]]) -> dict[str, object]:
        requests = [{"name": r, "exactly": {"deviceClassName": "dra.net"}} for r, _ in configs]
        entries = [{"requests": [r], "opaque": {"driver": "dra.net", "parameters": p}} for r, p in configs]
        return {"devices": {"requests": requests, "config": entries}}

    def vrf(**fields: object) -> dict[str, object]:
        return {"interface": {"vrf": {"name": "v", **fields}}}

    assert validate_claim_spec(spec(("a", vrf()), ("b", vrf(table=5))), "spec") == []
    (error,) = validate_claim_spec(spec(("a", vrf(table=4)), ("b", vrf(table=5))), "spec")
    assert error.path == "spec.devices.config[1].opaque.parameters.interface.vrf"
    assert "share VRF 'v' but give it tables 4 and 5" in error.reason
    (error,) = validate_claim_spec(spec(("a", {"interface": {"name": "v"}}), ("b", vrf())), "spec")
    assert "wants VRF 'v', the interface name of request 'a'" in error.reason
