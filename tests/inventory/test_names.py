"""Device names: DNS labels, stable, same scheme as the Go driver."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from driver.inventory.names import is_dns_label, netdev_device_name, pci_device_name


def test_pci_names() -> None:
    assert pci_device_name("0000:8a:00.0") == "pci-0000-8a-00-0"
    assert pci_device_name("0101:00:00.0") == "pci-0101-00-00-0"
    assert pci_device_name("A3C5:00:02.0") == "pci-a3c5-00-02-0"


def test_netdev_names() -> None:
    assert netdev_device_name("eth0") == "eth0"
    assert netdev_device_name("ens1f0np0") == "ens1f0np0"
    assert netdev_device_name("mlx5_6") == "net-nvwhqnk7gy"
    assert netdev_device_name("Eth0") == "net-iv2gqma"
    assert netdev_device_name("eth0.100") == "net-mv2gqmbogeyda"
    assert netdev_device_name("-x") != "-x"


def test_dns_label() -> None:
    assert is_dns_label("a") and is_dns_label("a-b1")
    assert not is_dns_label("") and not is_dns_label("a_b") and not is_dns_label("a-")
    assert not is_dns_label("x" * 64) and is_dns_label("x" * 63)


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=15))
def test_any_ifname_maps_to_a_stable_unique_label(ifname: str) -> None:
    name = netdev_device_name(ifname)
    assert is_dns_label(name)
    assert name == netdev_device_name(ifname)
    if name.startswith("net-") and name != ifname:
        encoded = name[4:].upper()
        assert base64.b32decode(encoded + "=" * (-len(encoded) % 8)).decode() == ifname
