"""``--sriov-vfs`` (the chart's ``sriov.vfs``) in the daemon as ``dranet run`` builds it: decoded when
it is built (a bad entry stops it, naming the field), applied at start with the VFs that prepared
claims hold, and every PF that keeps another count than asked is a Warning event on the Node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver.config import VF_COUNT_REFUSED_EVENT
from driver.inventory.vf_counts import VfCountError
from harness.nri import prepare_claim
from tests.daemon.test_node_settings import NodeApi, _daemon
from tests.inventory.test_vf_counts import PF_A, PF_B, _numvfs, _pf


async def test_a_pf_whose_vf_is_held_and_a_count_above_its_total_are_events_on_the_node(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    _pf(sysfs, PF_A, "ens1f0", 7, 2)
    _pf(sysfs, PF_B, "ens2f0", 7, 0, device="0x1572")
    _pf(sysfs, "0000:c1:00.0", "ens3f0", 7, 0, device="0x1593")
    entries = [
        {"nicSelector": {"pfNames": ["ens1f0"]}, "numVfs": 4},
        {"nicSelector": {"rootDevices": [PF_B]}, "numVfs": 9},
        {"nicSelector": {"deviceID": "1593"}, "numVfs": 2},
    ]
    api = NodeApi()
    daemon = _daemon(tmp_path, api, sriov_vfs=json.dumps(entries))
    prepare_claim(daemon.store, "pod-1", [{"ifname": "ens1f0v1", "pci_address": "0000:41:00.2"}])
    await daemon._set_vf_counts()  # what run() does before its first scan
    assert (_numvfs(sysfs, PF_A), _numvfs(sysfs, PF_B), _numvfs(sysfs, "0000:c1:00.0")) == (2, 0, 2)
    (event,) = api.events
    assert event["reason"] == VF_COUNT_REFUSED_EVENT and event["type"] == "Warning"
    assert "sriov.vfs[0].numVfs: PF 0000:41:00.0 keeps 2 VFs: 0000:41:00.2 prepared" in event["message"]
    assert "sriov.vfs[1].numVfs: 9 is above PF 0000:81:00.0's sriov_totalvfs (7)" in event["message"]


async def test_counts_that_all_took_post_nothing(tmp_path: Path) -> None:
    _pf(tmp_path / "sys", PF_A, "ens1f0", 7, 0)
    api = NodeApi()
    daemon = _daemon(tmp_path, api, sriov_vfs='[{"nicSelector": {"vendor": "8086"}, "numVfs": 3}]')
    await daemon._set_vf_counts()
    assert _numvfs(tmp_path / "sys", PF_A) == 3 and api.events == []


def test_a_bad_entry_stops_the_daemon_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(VfCountError, match=r"sriov\.vfs\[0\]\.nicSelector: must name at least one"):
        _daemon(tmp_path, NodeApi(), sriov_vfs='[{"nicSelector": {}, "numVfs": 3}]')
