"""Shared NICs as published: the sharing filter, the capacities, the apiserver's canonical quantities."""

from __future__ import annotations

import pytest

from driver.checkpoint.state import DriverState, PreparedClaim, PreparedDevice
from driver.claims.claim_build import ClaimError
from driver.claims.prepare import record_claims
from driver.inventory.device_filter import FilterError
from driver.inventory.sharing import Sharing, share_of
from driver.model.device import (
    BANDWIDTH_CAPACITY,
    INTERFACES_CAPACITY,
    MAX_ATTRIBUTES_PER_DEVICE,
    Device,
    HostFacts,
    ShareCapacity,
    quantity,
    quantity_value,
)


def nic(name: str = "pci-0000-01-00-0", rate: int | None = 400, rdma: bool = True, ifname: str = "ib0") -> Device:
    attrs: dict = {"dra.net/rdma": rdma, "dra.net/numaNode": 0, "resource.kubernetes.io/pciBusID": "0000:01:00.0"}
    if rate is not None:
        attrs["dra.net/rateGbps"] = rate
    return Device(name, attrs, HostFacts(ifname=ifname or None))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (1, "1"),
        (16, "16"),
        (1000, "1k"),
        (400_000_000_000, "400G"),
        (4_000_000_000, "4G"),
        (1_500_000_000, "1500M"),
        (250_000_000, "250M"),
        (10**18, "1E"),
        (10**21, "1000E"),
    ],
)
def test_quantity_is_the_canonical_form(value: int, text: str) -> None:
    assert quantity(value) == text


def test_a_shared_nic_offers_its_rate_in_one_percent_steps_and_takes_it_all_by_default() -> None:
    api = Sharing('device.attributes["dra.net"].rdma', 8).apply([nic()])[0].to_api()
    assert api["allowMultipleAllocations"] is True
    assert api["capacity"][BANDWIDTH_CAPACITY] == {
        "value": "400G",
        "requestPolicy": {"default": "400G", "validRange": {"min": "4G", "max": "400G", "step": "4G"}},
    }
    assert api["capacity"][INTERFACES_CAPACITY] == {
        "value": "8",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}},
    }
    # Its attributes are those of the NIC: the same selectors find it.
    assert api["attributes"]["dra.net/rdma"] == {"bool": True}


def test_only_selected_nics_with_a_netdev_are_shared() -> None:
    devices = [nic("a", rdma=True), nic("b", rdma=False), nic("c", rdma=True, ifname="")]
    out = {d.name: d for d in Sharing('device.attributes["dra.net"].rdma == true', 16).apply(devices)}
    assert out["a"].share is not None
    assert out["b"].share is None and "capacity" not in out["b"].to_api()
    assert out["c"].share is None  # no netdev: nothing to make a sub-interface of


def test_an_evaluation_error_shares_nothing() -> None:
    """Unlike the admin filter (which keeps a device it cannot judge), sharing is never guessed."""
    out = Sharing('device.attributes["dra.net"].nosuch == "x"', 16).apply([nic()])
    assert out[0].share is None


def test_dranet_syntax_is_accepted_too() -> None:
    out = Sharing('attributes["dra.net/rdma"].BoolValue', 16).apply([nic()])
    assert out[0].share is not None


def test_empty_expression_shares_none_and_costs_nothing() -> None:
    sharing = Sharing("", 16)
    devices = [nic()]
    assert not sharing.enabled and sharing.apply(devices) is devices


def test_a_nic_without_a_rate_offers_only_the_interfaces_bound() -> None:
    api = Sharing("true", 4).apply([nic(rate=None)])[0].to_api()
    assert set(api["capacity"]) == {INTERFACES_CAPACITY}
    assert share_of(nic(rate=None), 4) == ShareCapacity(bandwidth=0, step=0, interfaces=4)


def test_attributes_and_capacities_stay_within_the_api_limit() -> None:
    device = nic()
    device.attributes.update(
        {f"dra.net/x{i:02d}": i for i in range(MAX_ATTRIBUTES_PER_DEVICE - len(device.attributes))}
    )
    assert len(device.attributes) == MAX_ATTRIBUTES_PER_DEVICE
    shared = Sharing("true", 16).apply([device])[0]
    assert len(shared.attributes) + len(shared.to_api()["capacity"]) <= MAX_ATTRIBUTES_PER_DEVICE
    # The ranked attributes the selectors use survive; the unranked ones go first.
    assert {"dra.net/rdma", "dra.net/numaNode", "resource.kubernetes.io/pciBusID"} <= set(shared.attributes)


@pytest.mark.parametrize(
    ("expression", "max_interfaces", "needle"),
    [
        ("device.attributes[", 16, "--sharing-filter: invalid CEL"),
        ('device.driver == "x" && attributes["a"].BoolValue', 16, "--sharing-filter: the expression reads both"),
        ("true", 0, "--sharing-max-interfaces: 0 is below 1"),
    ],
)
def test_bad_settings_name_the_flag(expression: str, max_interfaces: int, needle: str) -> None:
    with pytest.raises(FilterError, match=needle):
        Sharing(expression, max_interfaces)


def test_snapshot_round_trip_keeps_the_share_and_the_share_id() -> None:
    shared = Sharing("true", 16).apply([nic()])[0]
    assert Device.from_dict(shared.to_dict()) == shared
    plain = PreparedDevice("nic", "node", "pci-0000-01-00-0", nic(), share_id="uid-1")
    data = plain.to_dict()
    assert "share" not in data["snapshot"] and data["shareID"] == "uid-1"
    back = PreparedDevice.from_dict(data)
    assert back.share_id == "uid-1" and back.sub_interface and back.needed_version == 5
    assert PreparedDevice("nic", "node", "x", nic()).needed_version == 2


def _claim(uid: str, *devices: PreparedDevice) -> PreparedClaim:
    return PreparedClaim(uid=uid, namespace="ns", name=f"claim-{uid}", devices=list(devices))


def test_shares_of_one_nic_coexist_a_whole_claim_and_shares_do_not() -> None:
    state = DriverState()
    share = lambda s: PreparedDevice("nic", "node", "ib0", nic(), shared=True, share_id=s)
    whole = PreparedDevice("nic", "node", "ib0", nic())
    out = record_claims(state, [_claim("a", share("s1")), _claim("b", share("s2")), _claim("c", whole)])
    assert isinstance(out[0], PreparedClaim) and isinstance(out[1], PreparedClaim)
    assert isinstance(out[2], ClaimError) and "device ib0 is already held by ResourceClaim ns/claim-" in str(out[2])
    # And the other way: a NIC in a pod whole gets no sub-interfaces.
    state = DriverState()
    out = record_claims(state, [_claim("c", whole), _claim("a", share("s1"))])
    assert isinstance(out[0], PreparedClaim) and isinstance(out[1], ClaimError)
    # adminAccess still coexists with a whole holder.
    admin = PreparedDevice("nic", "node", "ib0", nic(), shared=True)
    assert isinstance(record_claims(state, [_claim("d", admin)])[0], PreparedClaim)


def test_a_share_refuses_settings_that_would_change_the_nic_itself() -> None:
    from driver.api.v1alpha1.decode import decode_config
    from driver.claims.claim_build import _check_sub_interface as _check_share

    config = decode_config({"ethtool": {"features": {"tcp-segmentation-offload": False}}}, "config")
    with pytest.raises(ClaimError, match="ethtool: device ib0 gets a sub-interface in the pod"):
        _check_share("claim: ", nic("ib0"), config)
    _check_share("claim: ", nic("ib0"), decode_config({"interface": {"name": "net1", "mtu": 1400}}, "config"))
    with pytest.raises(ClaimError, match="no netdev"):
        _check_share("claim: ", nic("x", ifname=""), decode_config({}, "config"))


@pytest.mark.parametrize(
    ("text", "value"),
    [("40G", 40 * 10**9), ("16", 16), ("1Gi", 2**30), ("1e9", 10**9), ("4k", 4000), ("500m", None), ("1.5G", None)],
)
def test_quantity_values(text: str, value: int | None) -> None:
    assert quantity_value(text) == value


def test_share_metrics_count_shares_and_capacity_per_nic() -> None:
    from prometheus_client import generate_latest

    from driver.checkpoint.state import share_usage
    from driver.metrics import Metrics

    state = DriverState()
    for i in range(3):
        share = PreparedDevice("nic", "node", "ib0", nic(), shared=True, share_id=f"s{i}")
        share.consumed = {"dra.net/bandwidth": "40G", "dra.net/interfaces": "1"}
        record_claims(state, [_claim(f"c{i}", share)])
    record_claims(state, [_claim("w", PreparedDevice("nic", "node", "ib1", nic("ib1")))])
    metrics = Metrics()
    metrics.watch_shares(lambda: share_usage(state))
    text = generate_latest(metrics.registry).decode()
    assert 'dranet_driver_nic_shares{device="ib0"} 3.0' in text
    assert 'dranet_driver_nic_capacity_consumed{capacity="dra.net/bandwidth",device="ib0"} 1.2e+11' in text
    assert 'device="ib1"' not in text  # held whole: not a shared NIC


def test_two_shares_of_one_nic_in_one_claim_are_refused_at_prepare() -> None:
    from driver.claims.claim_build import ClaimBuilder
    from driver.dra.protocol import ClaimRef

    def result(request: str, share: str) -> dict:
        return {"request": request, "driver": "dra.net", "pool": "node", "device": "ib0", "shareID": share}

    claim = {
        "metadata": {"uid": "u1"},
        "status": {"allocation": {"devices": {"results": [result("a", "s1"), result("b", "s2")]}}},
    }
    builder = ClaimBuilder(lambda: {"ib0": nic("ib0")}, "dra.net", "node")
    with pytest.raises(ClaimError, match="requests 'a' and 'b' both got a share of device ib0"):
        builder.build(ClaimRef("ns", "c", "u1"), claim)
    one = {**claim, "status": {"allocation": {"devices": {"results": [result("a", "s1")]}}}}
    [device] = builder.build(ClaimRef("ns", "c", "u1"), one).devices
    assert device.share_id == "s1" and device.sub_interface
