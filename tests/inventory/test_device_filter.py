"""The admin CEL filter: DeviceClass syntax, Go-driver error semantics, safe default."""

from __future__ import annotations

import pytest

from driver.config import DEFAULT_FILTER
from driver.inventory.device_filter import DeviceFilter, FilterError, cel_device
from driver.model.device import Device

VETH = Device("veth1", {"dra.net/type": "veth", "dra.net/mtu": 1500})
NIC = Device(
    "pci-0000-3b-00-0",
    {"dra.net/type": "device", "dra.net/rdma": True, "resource.kubernetes.io/pciBusID": "0000:3b:00.0"},
)
ERDMA = Device("pci-0000-5e-00-0", {"dra.net/rdma": True})  # no type attribute at all


def test_default_filter_drops_veth_and_is_safe_without_type() -> None:
    assert DeviceFilter(DEFAULT_FILTER).apply([VETH, NIC, ERDMA]) == [NIC, ERDMA]


def test_empty_filter_keeps_everything() -> None:
    assert DeviceFilter("").apply([VETH, NIC]) == [VETH, NIC]
    assert DeviceFilter("   ").apply([VETH]) == [VETH]


def test_deviceclass_syntax() -> None:
    f = DeviceFilter(
        'device.driver == "dra.net" && has(device.attributes["resource.kubernetes.io"].pciBusID) && '
        'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:3b")'
    )
    assert f.apply([VETH, NIC, ERDMA]) == [NIC]
    # Without the has() guard a missing key is an eval error, which keeps the device (Go semantics).
    unguarded = DeviceFilter('device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:3b")')
    assert unguarded.apply([VETH, NIC, ERDMA]) == [VETH, NIC, ERDMA]


def test_invalid_expression_fails_at_construction() -> None:
    with pytest.raises(FilterError, match="--filter"):
        DeviceFilter('device.attributes["dra.net"].type ==')


def test_eval_error_keeps_device_and_non_bool_drops() -> None:
    missing = DeviceFilter('device.attributes["dra.net"].mtu > 1000')
    assert missing.apply([VETH, NIC]) == [VETH, NIC]  # NIC has no mtu: eval error -> kept
    assert DeviceFilter('device.attributes["dra.net"].mtu').apply([VETH]) == []


def test_cel_view() -> None:
    view = cel_device(NIC)
    assert view["driver"] == "dra.net"
    assert view["attributes"]["resource.kubernetes.io"] == {"pciBusID": "0000:3b:00.0"}
    assert cel_device(Device("x"))["attributes"] == {"dra.net": {}, "resource.kubernetes.io": {}}
