"""The admin CEL filter: DeviceClass and Go-driver syntaxes, Go-driver error semantics, safe default."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.config import DEFAULT_FILTER
from driver.inventory.device_filter import DEVICECLASS, DRANET, DeviceFilter, FilterError, cel_device
from driver.inventory.discovery import Scanner
from driver.inventory.dranet_filter import dranet_attributes
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


# -- the Go driver's syntax (`attributes`, a map of v1.DeviceAttribute) ----------------------------

GO_DEFAULT = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue  != "veth"'
"""dranet's own --filter default (cmd/dranet/app.go), character for character."""


def test_dranet_default_filter_selects_what_ours_selects() -> None:
    f = DeviceFilter(GO_DEFAULT)
    assert f.syntax == DRANET
    assert f.apply([VETH, NIC, ERDMA]) == DeviceFilter(DEFAULT_FILTER).apply([VETH, NIC, ERDMA]) == [NIC, ERDMA]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ('device.attributes["dra.net"].type == "device"', 'attributes["dra.net/type"].StringValue == "device"'),
        ('device.attributes["dra.net"].rdma', 'attributes["dra.net/rdma"].BoolValue'),
        (
            'has(device.attributes["dra.net"].mtu) && device.attributes["dra.net"].mtu >= 1500',
            '"dra.net/mtu" in attributes && attributes["dra.net/mtu"].IntValue >= 1500',
        ),
        (
            'device.attributes["resource.kubernetes.io"].pciBusID.startsWith("0000:3b")',
            'attributes["resource.kubernetes.io/pciBusID"].StringValue.startsWith("0000:3b")',
        ),
        ('has(device.attributes["dra.net"].type)', '"dra.net/type" in attributes'),
    ],
)
def test_both_syntaxes_select_the_same_devices(ours: str, theirs: str) -> None:
    devices = [VETH, NIC, ERDMA]
    assert DeviceFilter(theirs).syntax == DRANET
    assert DeviceFilter(ours).syntax == DEVICECLASS
    assert DeviceFilter(theirs).apply(devices) == DeviceFilter(ours).apply(devices)


def test_both_syntaxes_on_fixture_nodes(nd_h100_sysfs: Path, sriov_sysfs: Path) -> None:
    """Real-shaped devices (ND H100 v5, SR-IOV): the same selections in either syntax."""
    pairs = [
        ('device.attributes["dra.net"].rdma == true', 'attributes["dra.net/rdma"].BoolValue == true'),
        (
            'has(device.attributes["dra.net"].numaNode) && device.attributes["dra.net"].numaNode == 1',
            '"dra.net/numaNode" in attributes && attributes["dra.net/numaNode"].IntValue == 1',
        ),
        (
            '!has(device.attributes["dra.net"].isSriovVf) || !device.attributes["dra.net"].isSriovVf',
            '!has(attributes["dra.net/isSriovVf"].BoolValue) || !attributes["dra.net/isSriovVf"].BoolValue',
        ),
        (
            'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName.startsWith("ib")',
            '("dra.net/ifName" in attributes) && attributes["dra.net/ifName"].StringValue.startsWith("ib")',
        ),
    ]
    for root in (nd_h100_sysfs, sriov_sysfs):
        devices = Scanner(str(root), pci_ids_paths=()).scan()
        assert devices
        sizes = []
        for ours, theirs in pairs:
            selected = DeviceFilter(ours).apply(devices)
            assert DeviceFilter(theirs).apply(devices) == selected, (root.name, theirs)
            sizes.append(len(selected))
        assert any(0 < n < len(devices) for n in sizes), sizes  # the filters do select something


def test_dranet_syntax_view_and_has() -> None:
    assert dranet_attributes(NIC) == {
        "dra.net/type": {"StringValue": "device"},
        "dra.net/rdma": {"BoolValue": True},
        "resource.kubernetes.io/pciBusID": {"StringValue": "0000:3b:00.0"},
    }
    assert dranet_attributes(Device("x", {"mtu": 9000, "resource.kubernetes.io/numaNode": [0, 1]})) == {
        "dra.net/mtu": {"IntValue": 9000},
        "resource.kubernetes.io/numaNode": {},  # a list: no scalar field
    }
    # has() on a field is true only for the field the attribute holds (the Go driver: a non-nil field).
    assert DeviceFilter('has(attributes["dra.net/type"].IntValue)').apply([NIC]) == []


def test_dranet_syntax_errors_name_the_flag() -> None:
    with pytest.raises(FilterError, match=r"--filter: attributes\[...\]\.Value: a DeviceAttribute has no such field"):
        DeviceFilter('attributes["dra.net/type"].Value == "device"')
    with pytest.raises(FilterError, match="--filter: the expression reads both `device`.*`attributes`"):
        DeviceFilter('device.driver == "dra.net" && attributes["dra.net/rdma"].BoolValue')
    with pytest.raises(FilterError, match="--filter: invalid CEL expression"):
        DeviceFilter('attributes["dra.net/type"].StringValue ==')
    # A "]." inside a string literal is no field read; methods on a value are not fields.
    ok = DeviceFilter('attributes["dra.net/alias"].StringValue.endsWith("].Name")')
    assert ok.syntax == DRANET


def test_dranet_syntax_eval_errors_and_non_bool_keep_the_device() -> None:
    # A missing key is an evaluation error: kept, as the Go driver does.
    assert DeviceFilter('attributes["dra.net/mtu"].IntValue > 9000').apply([VETH, NIC]) == [NIC]
    # A non-bool result keeps the device in the Go driver's syntax (not in the DeviceClass one).
    assert DeviceFilter('attributes["dra.net/mtu"].IntValue').apply([VETH]) == [VETH]
