"""State files of every older version, as those drivers wrote them, read by this one and written anew.

``tests/fixtures/state/v{2,3,4}/`` hold a ``checkpoint.json`` and a ``pods.json`` written by the
driver's own ``CheckpointStore`` at commit d424cda (the last one writing pods.json version 4), for a
pod holding three NICs: a plain one with an RDMA device (every version), one using every
per-setting field (rules, neighbors, ethtool, GSO/GRO sizes, sysctls, VRF, eBPF; versions 3 and 4)
and one with a DHCP lease (versions 3 and 4); version 4 adds the ifindexes and identities and the
VRF the hooks created. Version 2 files hold only the fields a version-2 driver knew.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from driver.checkpoint.schema import _V4_RECORDS, COMPATIBLE_VERSION, CONFIG_FIELDS_VERSION, RECORDS_VERSION
from driver.checkpoint.state import MovedDevice
from driver.checkpoint.store import CheckpointStore
from driver.netlink.rtnl import Route
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.rules import Rule

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "state"
POD = "5eed0000-0000-4000-8000-00000000000a"
CLAIM = "c0ffee00-0000-4000-8000-000000000001"


def _load(version: int, tmp: Path) -> CheckpointStore:
    state, run = tmp / "state", tmp / "run"
    state.mkdir()
    run.mkdir()
    shutil.copy(FIXTURES / f"v{version}" / "checkpoint.json", state)
    shutil.copy(FIXTURES / f"v{version}" / "pods.json", run)
    return CheckpointStore(state, run)


def _devices(store: CheckpointStore) -> dict[str, MovedDevice]:
    return store.read(lambda s: {m.device: m for m in s.pods[POD].devices})


@pytest.mark.parametrize("version", [2, 3, 4])
def test_every_older_version_is_read_with_each_settings_record_under_its_name(version: int, tmp_path: Path) -> None:
    old = json.loads((FIXTURES / f"v{version}" / "pods.json").read_text())
    assert old["version"] == version, "the fixture is what that version wrote"
    store = _load(version, tmp_path)
    assert not store.quarantined
    devices = _devices(store)
    plain = devices["pci-0000-81-00-0"]
    assert plain.step == "in-pod" and (plain.host_ifname, plain.pod_ifname, plain.host_mtu) == ("ens1f0", "net1", 1500)
    assert set(plain.records) == {"addresses", "rdma"}  # empty ethtool maps are no record
    assert plain.records["rdma"] == "mlx5_1"
    assert plain.records["addresses"]["addresses"] == ["192.0.2.11/24", "2001:db8::11/64"]
    routes = [Route.from_dict(r) for r in plain.records["addresses"]["routes"]]
    assert [(r.dst, r.gateway, r.table) for r in routes] == [
        ("10.10.0.0/16", "192.0.2.1", 254),
        ("2001:db8:1::/48", "2001:db8::1", 150),
    ]
    assert (plain.host_index, plain.pod_index, plain.identity is not None) == (
        (11, 11, True) if version == 4 else (None, None, False)
    )
    claim = store.read(lambda s: s.claims[CLAIM])
    assert [d.config.interface.name for d in claim.devices if d.config.interface] == ["net1", "net2", "net3"][
        : len(claim.devices)
    ]
    if version == 2:
        assert list(devices) == ["pci-0000-81-00-0"]
        return
    full, dhcp = devices["pci-0000-82-00-0"], devices["pci-0000-83-00-0"]
    assert set(full.records) == {
        "addresses",
        "rules",
        "neighbors",
        "ethtool",
        "offload_sizes",
        "sysctls",
        "vrf",
        "ebpf",
    }
    assert [Rule.from_dict(r) for r in full.records["rules"]] == [
        Rule(priority=150, src="192.0.2.0/24", table=150),
        Rule(priority=151, iifname="ens2f0", table=151),
    ]
    assert full.records["neighbors"] == [{"dst": "192.0.2.99", "lladdr": "02:00:00:00:00:99"}]
    assert full.records["ethtool"] == {"features": {"rx-gro": True}, "private_flags": {"disable-fw-lldp": False}}
    assert full.records["offload_sizes"]["gsoMaxSize"] == 65536
    assert full.records["sysctls"] == {"ipv4/arp_ignore": 0, "ipv4/forwarding": 0, "ipv6/forwarding": 0}
    assert full.records["vrf"] == "blue"
    assert [p["how"] for p in full.records["ebpf"]] == ["removed by the namespace move", "detached"]
    assert dhcp.records["dhcp"]["address"] == "198.51.100.23/24" and "routes" not in dhcp.records["addresses"]
    created = store.read(lambda s: s.pods[POD].created)
    assert created == ([{"index": 20, "kind": "vrf", "name": "blue"}] if version == 4 else [])


@pytest.mark.parametrize("version", [2, 3, 4])
def test_the_next_write_is_the_new_version_and_reads_back_the_same(version: int, tmp_path: Path) -> None:
    store = _load(version, tmp_path)
    before = store.read(lambda s: (s.claims[CLAIM], s.pods[POD]))
    store.update(lambda s: s.pods.__setitem__(POD, replace(s.pods[POD], name="pod-a")))  # any change: pods.json anew
    pods = json.loads(store.pods_path.read_text())
    assert pods["version"] == RECORDS_VERSION, "records alone need version 5; only a VF's settings need the newest"
    for device in pods["pods"][POD]["devices"]:
        assert not set(device) & set(_V4_RECORDS), "no per-setting field is written any more"
        assert device["records"]
    claims = json.loads(store.path.read_text())
    assert claims["version"] == (COMPATIBLE_VERSION if version == 2 else CONFIG_FIELDS_VERSION), "claims unchanged"
    again = CheckpointStore(store.directory, store.runtime_directory)
    assert again.read(lambda s: (s.claims[CLAIM], s.pods[POD])) == before


def test_the_records_are_where_the_settings_look_for_them(tmp_path: Path) -> None:
    """Each setting undoes from a migrated record: the restore batch of the NIC that used them all."""
    full = _devices(_load(4, tmp_path))["pci-0000-82-00-0"]
    steps = [r.step for s in SETTINGS for r in s.restore_requests(full, 12)]
    assert steps == [
        "restore offload sizes",
        "address",
        "address",
        "link-up",
        "route",
        "route",
        "neighbor",
        "rule",
        "rule",
        "sysctl",  # its IPv4 values, over rtnetlink at the index the NIC is found at
    ]


def test_every_migrated_record_belongs_to_a_registered_setting() -> None:
    names = {s.name for s in SETTINGS}
    assert {setting for setting, _key in _V4_RECORDS.values()} <= names
    assert len(names) == len(SETTINGS), "one name per setting"
