"""The ``sriov`` section: a VF's settings through its PF, decoded strictly with the kernel's ranges,
errors naming the field, the canonical form round-tripping and a request's merged config checked again."""

from __future__ import annotations

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.merge import configs_for_request
from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig, SriovConfig

P = "spec.devices.config[0].opaque.parameters"
FULL = {
    "vlan": 100,
    "vlanQoS": 3,
    "vlanProto": "802.1ad",
    "spoofChk": False,
    "trust": True,
    "minTxRate": 10,
    "maxTxRate": 1000,
    "linkState": "enable",
    "mac": "52:54:00:12:34:56",
}


def _errors(sriov: object, **rest: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        decode_config({"sriov": sriov, **rest}, P)
    return [str(e) for e in info.value.errors]


def test_every_field_is_decoded_into_the_typed_model_and_round_trips() -> None:
    config = decode_config({"sriov": FULL}, P)
    assert config.sriov == SriovConfig(
        vlan=100,
        vlan_qos=3,
        vlan_proto="802.1ad",
        spoof_chk=False,
        trust=True,
        min_tx_rate=10,
        max_tx_rate=1000,
        link_state="enable",
        mac="52:54:00:12:34:56",
    )
    params = config.to_parameters()
    assert params["sriov"] == FULL
    assert decode_config(params, P) == config
    assert NetworkConfig.from_parameters(params) == config


def test_an_unset_field_is_left_as_the_pf_has_it() -> None:
    config = decode_config({"sriov": {"trust": True}}, P)
    assert config.sriov == SriovConfig(trust=True)
    assert config.to_parameters()["sriov"] == {"trust": True}


@pytest.mark.parametrize(
    ("sriov", "expected"),
    [
        ({"vlan": 4095}, f"{P}.sriov.vlan: "),
        ({"vlan": -1}, f"{P}.sriov.vlan: "),
        ({"vlan": "100"}, f"{P}.sriov.vlan: "),
        ({"vlan": 5, "vlanQoS": 8}, f"{P}.sriov.vlanQoS: "),
        ({"vlan": 5, "vlanProto": "802.1x"}, f"{P}.sriov.vlanProto: '802.1x' is not one of 802.1Q, 802.1ad"),
        ({"linkState": "up"}, f"{P}.sriov.linkState: 'up' is not one of auto, enable, disable"),
        ({"maxTxRate": 2**32}, f"{P}.sriov.maxTxRate: "),
        ({"minTxRate": -5}, f"{P}.sriov.minTxRate: "),
        ({"trust": "yes"}, f"{P}.sriov.trust: "),
        ({"spoofchk": True}, f"{P}.sriov.spoofchk: unknown field"),
        ({"vlanQoS": 2}, f"{P}.sriov.vlanQoS: needs a vlan other than 0"),
        ({"vlan": 0, "vlanProto": "802.1ad"}, f"{P}.sriov.vlanProto: needs a vlan other than 0"),
        ({"minTxRate": 500, "maxTxRate": 100}, f"{P}.sriov.minTxRate: 500 Mbit/s is above maxTxRate (100 Mbit/s)"),
        ({"mac": "01:00:5e:00:00:01"}, f"{P}.sriov.mac: '01:00:5e:00:00:01' is a multicast address"),
        ({"mac": "00:00:00:00:00:00"}, f"{P}.sriov.mac: the all-zero MAC address cannot be assigned"),
        ({"mac": "52:54:00:12:34"}, f"{P}.sriov.mac: '52:54:00:12:34' is not a MAC address"),
        ("on", f"{P}.sriov: "),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(sriov: object, expected: str) -> None:
    errors = _errors(sriov)
    assert len(errors) == 1, errors
    assert errors[0].startswith(expected), errors


def test_every_bad_field_is_named_at_once() -> None:
    errors = _errors({"vlan": 9999, "linkState": "off", "trust": 1})
    assert sorted(e.split(":")[0] for e in errors) == [f"{P}.sriov.{f}" for f in ("linkState", "trust", "vlan")]


def test_the_qos_and_protocol_that_need_no_vlan_are_accepted() -> None:
    assert decode_config({"sriov": {"vlanQoS": 0, "vlanProto": "802.1Q"}}, P).sriov == SriovConfig(
        vlan_qos=0, vlan_proto="802.1Q"
    )


def test_a_sub_interface_of_a_vf_cannot_take_the_vfs_settings() -> None:
    errors = _errors({"vlan": 10}, interface={"type": "macvlan"})
    assert any(e.startswith(f"{P}.sriov: an SR-IOV VF's settings are its own") for e in errors), errors


def test_a_requests_merged_config_is_checked_again() -> None:
    """One config sets a floor, a later one a ceiling below it: each is valid, the merge is not."""
    first = decode_config({"sriov": {"minTxRate": 500}}, P)
    second = decode_config({"sriov": {"maxTxRate": 100}}, P)
    merged = first.merged(second)
    assert merged.sriov == SriovConfig(min_tx_rate=500, max_tx_rate=100)
    entries = [
        {"source": "FromClaim", "requests": ["nics"], "opaque": {"driver": "dra.net", "parameters": params}}
        for params in ({"sriov": {"minTxRate": 500}}, {"sriov": {"maxTxRate": 100}})
    ]
    with pytest.raises(ConfigError) as info:
        configs_for_request(entries, "nics")
    assert any("sriov.minTxRate: 500 Mbit/s is above maxTxRate" in str(e) for e in info.value.errors)


def test_a_vf_config_beside_an_interface_name_is_fine() -> None:
    config = decode_config({"interface": {"name": "net1"}, "sriov": {"vlan": 7}}, P)
    assert config.interface == InterfaceConfig(name="net1") and config.sriov == SriovConfig(vlan=7)


def test_a_vf_for_vfio_pci_decodes_and_round_trips() -> None:
    config = decode_config({"sriov": {"driver": "vfio-pci"}, "numa": {"pin": True}}, P)
    assert config.sriov == SriovConfig(driver="vfio-pci") and config.vfio
    assert decode_config(config.to_parameters(), P) == config
    assert NetworkConfig.from_parameters(config.to_parameters()) == config
    assert not decode_config({"sriov": {"vlan": 5}}, P).vfio


def test_a_vf_for_vfio_pci_takes_nothing_that_configures_a_netdev() -> None:
    errors = _errors(
        {"driver": "vfio-pci", "trust": True},
        interface={"mtu": 9000},
        routes=[{"destination": "10.0.0.0/8", "gateway": "10.1.0.1"}],
    )
    assert errors == [
        f"{P}.sriov.driver: sriov.driver vfio-pci hands the VF to the pod through its VFIO group, without a netdev: "
        "interface, routes cannot apply"
    ]
    with_pf_settings = {"driver": "vfio-pci", "vlan": 100, "mac": "52:54:00:00:00:07", "trust": True}
    assert decode_config({"sriov": with_pf_settings}, P).sriov == SriovConfig(
        driver="vfio-pci", vlan=100, mac="52:54:00:00:00:07", trust=True
    ), "the PF's settings of the VF apply on vfio-pci too"
    assert _errors({"driver": "uio_pci_generic"})[0].startswith(
        f"{P}.sriov.driver: 'uio_pci_generic' is not one of vfio-pci"
    )


def test_vfio_pci_in_one_config_and_an_interface_in_another_are_refused_together() -> None:
    entries = [
        {"source": "FromClass", "requests": ["vf"], "opaque": {"driver": "dra.net", "parameters": params}}
        for params in ({"sriov": {"driver": "vfio-pci"}}, {"interface": {"name": "net1"}})
    ]
    with pytest.raises(ConfigError) as info:
        configs_for_request(entries, "vf")
    assert any("sriov.driver: sriov.driver vfio-pci hands the VF" in str(e) for e in info.value.errors)


def test_a_vfs_mac_is_the_netdevs_in_the_pod_and_cannot_differ_from_the_interfaces() -> None:
    """``sriov.mac`` is what the PF gives the VF and what its netdev carries in the pod
    (``pod_mac``); the same MAC in ``interface.hardwareAddr`` is fine, another one is refused."""
    config = decode_config({"sriov": {"mac": "52:54:00:AB:CD:EF"}}, P)
    assert config.sriov == SriovConfig(mac="52:54:00:ab:cd:ef") and config.pod_mac == "52:54:00:ab:cd:ef"
    same = decode_config({"interface": {"hardwareAddr": "52:54:00:ab:cd:ef"}, "sriov": {"mac": "52:54:00:ab:cd:ef"}}, P)
    assert same.pod_mac == "52:54:00:ab:cd:ef"
    errors = _errors({"mac": "52:54:00:ab:cd:ef"}, interface={"hardwareAddr": "52:54:00:00:00:01"})
    assert errors == [
        f"{P}.sriov.mac: 52:54:00:ab:cd:ef differs from interface.hardwareAddr (52:54:00:00:00:01): the VF's "
        "netdev carries the MAC its PF gives it; set one of the two"
    ]
