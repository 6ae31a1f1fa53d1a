"""The shared vocabulary of a device: attribute values both ways, the quantities the API server
stores, a shared NIC's capacity, and a device's checkpoint form."""

from __future__ import annotations

import pytest

from driver.model.device import (
    BANDWIDTH_CAPACITY,
    INTERFACES_CAPACITY,
    RDMA_ATTRIBUTE,
    CharDevice,
    Device,
    HostFacts,
    ShareCapacity,
    attribute_from_api,
    attribute_to_api,
    first_int,
    quantity,
    quantity_value,
    rdma_count,
)


@pytest.mark.parametrize(
    ("value", "api"),
    [
        (True, {"bool": True}),
        (False, {"bool": False}),
        (0, {"int": 0}),
        ("eth0", {"string": "eth0"}),
        ([1, 0], {"ints": [1, 0]}),
    ],
)
def test_attribute_values_round_trip(value: object, api: dict[str, object]) -> None:
    assert attribute_to_api(value) == api
    assert attribute_from_api(api) == value and type(attribute_from_api(api)) is type(value)


def test_a_version_attribute_decodes_and_an_empty_one_is_refused() -> None:
    assert attribute_from_api({"version": "1.2.3"}) == "1.2.3"
    with pytest.raises(ValueError, match="no value field"):
        attribute_from_api({})


@pytest.mark.parametrize(
    ("value", "expected"), [(3, 3), ([1, 0], 1), ([], None), (True, None), ("3", None), (None, None)]
)
def test_first_int_is_an_int_or_a_lists_first(value: object, expected: int | None) -> None:
    assert first_int(value) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (16, "16"), (1500, "1500"), (100_000_000_000, "100G"), (1_500_000_000, "1500M"), (10**21, "1000E")],
)
def test_quantities_are_the_canonical_form_the_api_server_stores(value: int, text: str) -> None:
    assert quantity(value) == text
    assert quantity_value(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40G", 40 * 10**9),
        (" 16 ", 16),
        ("1Gi", 2**30),
        ("1e9", 10**9),
        ("2E3", 2000),
        ("500m", None),
        ("1.5G", None),
        ("G", None),
        ("", None),
    ],
)
def test_quantity_value_takes_whole_numbers_only(text: str, value: int | None) -> None:
    assert quantity_value(text) == value


def test_a_shared_nic_offers_its_bandwidth_in_steps_and_one_interface_per_allocation() -> None:
    capacity = ShareCapacity(bandwidth=100_000_000_000, step=1_000_000_000, interfaces=8).to_api()
    assert capacity[INTERFACES_CAPACITY] == {
        "value": "8",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}},
    }
    assert capacity[BANDWIDTH_CAPACITY] == {
        "value": "100G",
        "requestPolicy": {"default": "100G", "validRange": {"min": "1G", "max": "100G", "step": "1G"}},
    }
    assert BANDWIDTH_CAPACITY not in ShareCapacity(bandwidth=0, step=1, interfaces=2).to_api()  # unknown rate


def test_a_device_in_a_slice_and_in_the_checkpoint() -> None:
    host = HostFacts(pci_address="0000:81:00.0", char_devices=[CharDevice("/dev/infiniband/uverbs0", 231, 192)])
    device = Device("pci-0000-81-00-0", {RDMA_ATTRIBUTE: True, "dra.net/mtu": 1500}, host)
    assert device.to_api() == {
        "name": "pci-0000-81-00-0",
        "attributes": {"dra.net/mtu": {"int": 1500}, RDMA_ATTRIBUTE: {"bool": True}},  # sorted by name
    }
    assert Device.from_dict(device.to_dict()) == device
    shared = Device("eth1", share=ShareCapacity(10_000_000_000, 1_000_000_000, 4))
    assert shared.to_api()["allowMultipleAllocations"] is True and Device.from_dict(shared.to_dict()) == shared
    assert rdma_count([device, shared, Device("x", {RDMA_ATTRIBUTE: False})]) == 1
