"""CheckpointStore: round trips, damaged and newer files, and crash safety under real SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig
from driver.checkpoint.errors import CheckpointError
from driver.checkpoint.journal import Position, base_of, parse
from driver.checkpoint.schema import (
    COMPATIBLE_VERSION,
    CONFIG_FIELDS_VERSION,
    IDENTITY_VERSION,
    RECORDS_VERSION,
    SCHEMA_VERSION,
)
from driver.checkpoint.state import MovedDevice, PodNetState, PreparedClaim, PreparedDevice
from driver.checkpoint.store import CheckpointStore
from driver.model.device import CharDevice, Device, HostFacts

ROOT = Path(__file__).resolve().parents[2]


def _claim(uid: str) -> PreparedClaim:
    snap = Device(
        "pci-0000-8a-00-0",
        {"dra.net/rdma": True, "dra.net/mtu": 4096, "dra.net/ifName": "ib0"},
        HostFacts(
            pci_address="0000:8a:00.0",
            ifname="ib0",
            rdma_device="mlx5_0",
            numa_node=1,
            char_devices=[CharDevice("/dev/infiniband/uverbs0", 231, 192)],
        ),
    )
    return PreparedClaim(
        uid=uid,
        namespace="ns",
        name="c",
        pod_uids=["p1"],
        devices=[PreparedDevice("nic", "node", snap.name, snap, NetworkConfig(interface=InterfaceConfig(mtu=9000)))],
    )


def _with_device(pod: PodNetState, **change: object) -> PodNetState:
    """``pod`` with its first NIC changed (a pod's state is never changed in place)."""
    return replace(pod, devices=[replace(pod.devices[0], **change), *pod.devices[1:]])


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    store.update(
        lambda s: s.pods.__setitem__(
            "p1",
            PodNetState(
                "p1",
                netns_path="/var/run/netns/x",
                devices=[
                    MovedDevice(
                        "pci-0000-8a-00-0",
                        "ib0",
                        "net1",
                        step="in-pod",
                        records={"addresses": {"addresses": ["10.0.0.2/24"]}},
                    )
                ],
            ),
        )
    )
    again = CheckpointStore(tmp_path)
    assert again.read(lambda s: s.claims["u1"]) == _claim("u1")
    pod = again.read(lambda s: s.pods["p1"])
    assert pod.devices[0].step == "in-pod" and pod.devices[0].records == {"addresses": {"addresses": ["10.0.0.2/24"]}}
    assert again.read(lambda s: [c.uid for c in s.claims_for_pod("p1")]) == ["u1"]
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert oct(os.stat(tmp_path / "checkpoint.json").st_mode & 0o777) == "0o600"


def test_a_torn_file_is_kept_aside_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text("{torn")
    store = CheckpointStore(tmp_path)  # starts (empty); the damaged file is kept for a human
    assert [q.moved_to.read_text() for q in store.quarantined] == ["{torn"]
    (tmp_path / "checkpoint.json").write_text(json.dumps({"version": 99, "claims": {}}))
    with pytest.raises(CheckpointError, match="version 99"):
        CheckpointStore(tmp_path)


def test_failed_mutation_is_not_persisted_as_partial_write(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))

    def boom(state: object) -> None:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        store.update(boom)
    assert CheckpointStore(tmp_path).read(lambda s: list(s.claims)) == ["u1"]


WRITER = """
import sys
from driver.checkpoint.store import CheckpointStore
from tests.checkpoint.test_store import _claim
store = CheckpointStore(sys.argv[1])
i = 0
print("ready", flush=True)
while True:
    i += 1
    store.update(lambda s: s.claims.__setitem__(f"u{i}", _claim(f"u{i}")))
"""


def test_sigkill_during_writes_leaves_old_or_new_state(tmp_path: Path) -> None:
    """A writer process is SIGKILLed at arbitrary moments; the file always loads, claims are contiguous."""
    for round_ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            time.sleep(0.05 + 0.03 * round_)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        uids = CheckpointStore(tmp_path).read(lambda s: sorted(int(u[1:]) for u in s.claims))
        # Each round restarts numbering at u1 and overwrites; the set is always 1..n (no torn entries).
        assert uids == list(range(1, len(uids) + 1))
        (tmp_path / "checkpoint.json").unlink(missing_ok=True)


def test_failed_write_rolls_memory_back_to_disk(tmp_path: Path) -> None:
    from driver.checkpoint.errors import CheckpointWriteError
    from driver.checkpoint.files import FileOps

    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))

    def enospc(*args: object) -> None:
        raise OSError(28, "No space left on device")

    store.ops = FileOps(replace=enospc)
    with pytest.raises(CheckpointWriteError):
        store.update(lambda s: s.claims.__setitem__("u2", _claim("u2")))
    store.ops = FileOps()
    assert store.read(lambda s: sorted(s.claims)) == ["u1"]  # memory agrees with the disk
    with pytest.raises(RuntimeError):
        store.update(lambda s: (s.claims.pop("u1"), (_ for _ in ()).throw(RuntimeError("bug"))))
    assert store.read(lambda s: sorted(s.claims)) == ["u1"]


def test_serialisation_matches_asdict() -> None:
    from dataclasses import asdict

    from driver.checkpoint.state import _V4_POD_FIELDS, DriverState

    state = DriverState(
        claims={"u1": _claim("u1")},
        pods={
            "p1": PodNetState(
                "p1",
                devices=[MovedDevice("d", "eth0", "net1", records={"rules": [{"dst": "10.0.0.0/8", "table": 10}]})],
            )
        },
    )
    claim = asdict(state.claims["u1"])
    for stored, device in zip(claim["devices"], state.claims["u1"].devices, strict=True):
        stored["config"] = device.config.to_parameters()  # configs are stored in their canonical JSON form
        assert stored.pop("cloud_config") is None  # written only when a cloud provider gave one
        assert stored.pop("shared") is False  # written only when true (adminAccess)
        assert stored.pop("share_id") is None  # written only for a sub-interface (a shareID)
        assert stored.pop("consumed") == {}  # written only for a share (its consumedCapacity)
        assert stored.pop("metadata") is None  # written only with device metadata files (their facts)
        assert stored.pop("host_driver") is None  # written only for a VF on vfio-pci
        assert stored.pop("vf_settings") is None  # written only for a VF on vfio-pci with PF settings
        assert stored.pop("vfio_nodes") is None  # written only for a VF on vfio-pci
        assert stored["snapshot"].pop("share") is None  # re-derived at every scan, never stored
    pod = asdict(state.pods["p1"])
    assert pod.pop("created") == []  # written only when the hooks created a link
    for device in pod["devices"]:  # the version-4 device fields are written only when set
        for name in _V4_POD_FIELDS:
            assert not device.pop(name)
    expected = {"version": SCHEMA_VERSION, "claims": {"u1": claim}, "pods": {"p1": pod}}
    claims = {"claims": {k: v.to_dict() for k, v in state.claims.items()}}
    encoded = {"version": SCHEMA_VERSION, **claims, **state.pods_json()}
    assert json.dumps(encoded, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert DriverState.from_json(json.loads(json.dumps(encoded))) == state


def test_pods_live_in_the_runtime_dir_and_only_changed_files_are_written(tmp_path: Path) -> None:
    state, run = tmp_path / "state", tmp_path / "run"
    store = CheckpointStore(state, run)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    assert "u1" in json.loads((state / "checkpoint.json").read_text())["claims"]
    assert not (run / "pods.json").exists()  # nothing changed there: not written
    claims_mtime = (state / "checkpoint.json").stat().st_mtime_ns
    time.sleep(0.01)
    store.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1", netns_path="/var/run/netns/x")))
    assert (state / "checkpoint.json").stat().st_mtime_ns == claims_mtime  # claims untouched
    assert "p1" in json.loads((run / "pods.json").read_text())["pods"]
    assert (
        "pods" not in json.loads((state / "checkpoint.json").read_text())
        or not json.loads((state / "checkpoint.json").read_text())["pods"]
    )
    again = CheckpointStore(state, run)
    assert again.read(lambda s: (list(s.claims), list(s.pods))) == (["u1"], ["p1"])
    # A reboot clears the tmpfs runtime dir: claims remain, pod network state is gone.
    (run / "pods.json").unlink()
    assert CheckpointStore(state, run).read(lambda s: (list(s.claims), list(s.pods))) == (["u1"], [])


def test_single_file_checkpoint_from_before_the_split_keeps_its_pods(tmp_path: Path) -> None:
    legacy = CheckpointStore(tmp_path)  # runtime dir defaults to the state dir: one directory
    legacy.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1")))
    body = json.loads((tmp_path / "pods.json").read_text())
    (tmp_path / "pods.json").unlink()
    merged = {"version": body["version"], "claims": {}, "pods": body["pods"]}
    (tmp_path / "checkpoint.json").write_text(json.dumps(merged))
    store = CheckpointStore(tmp_path, tmp_path / "run")
    assert store.read(lambda s: list(s.pods)) == ["p1"]


def test_a_torn_pods_file_is_kept_aside(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "pods.json").write_text("{torn")
    store = CheckpointStore(tmp_path / "state", tmp_path / "run")
    assert [q.path.name for q in store.quarantined] == ["pods.json"]


def test_cached_claim_encoding_is_byte_identical_to_a_full_encode(tmp_path: Path) -> None:
    from driver.checkpoint.schema import encode

    store = CheckpointStore(tmp_path)
    for i in range(5):
        store.update(lambda s, i=i: s.claims.__setitem__(f"u{i}", _claim(f"u{i}")))
    store.update(lambda s: s.claims.pop("u2"))
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1-replaced")))  # a new object: re-encoded
    at = Position.from_json(json.loads((tmp_path / "checkpoint.json").read_bytes())["journal"])
    assert at is not None  # the journal position the file was written at (older drivers ignore it)
    body = store.read(lambda s: {"claims": {k: v.to_dict() for k, v in s.claims.items()}, "journal": at.to_json()})
    expected = encode(body)
    assert (tmp_path / "checkpoint.json").read_bytes() == expected
    assert sorted(json.loads(expected)["claims"]) == ["u0", "u1", "u3", "u4"]
    assert CheckpointStore(tmp_path).read(lambda s: s.claims["u1"].uid) == "u1-replaced"


V1_CLAIMS = {
    "version": 1,
    "claims": {
        "u1": {
            "uid": "u1",
            "namespace": "ns",
            "name": "c",
            "pod_uids": ["p1"],
            "devices": [
                {
                    "request": "nic",
                    "pool": "node",
                    "device": "pci-0000-8a-00-0",
                    "snapshot": {
                        "name": "pci-0000-8a-00-0",
                        "attributes": {"dra.net/rdma": True},
                        "host": {"ifname": "ib0", "rdma_device": "mlx5_0"},
                    },
                    "config": {
                        "opaque": [
                            {
                                "apiVersion": "dra.net/v1alpha1",
                                "kind": "NetworkConfig",
                                "interface": {"name": "net1", "mtu": 1500},
                            },
                            {"interface": {"mtu": 9000}, "rdma": {"injectEnv": False}},
                        ]
                    },
                },
                {
                    "request": "nic",
                    "pool": "node",
                    "device": "pci-0000-8a-00-1",
                    "snapshot": {"name": "pci-0000-8a-00-1"},
                    "config": {},
                },
            ],
        }
    },
}
V1_PODS = {
    "version": 1,
    "pods": {
        "p1": {
            "pod_uid": "p1",
            "netns_path": "/var/run/netns/x",
            "devices": [
                {
                    "device": "pci-0000-8a-00-0",
                    "host_ifname": "ib0",
                    "pod_ifname": "net1",
                    "rdma_moved": False,
                    "host_up": True,
                    "host_routes": [{"dst": None, "gateway": "10.0.0.1"}],
                    "step": "in-pod",
                }
            ],
        }
    },
}


def test_version_1_files_are_migrated_to_typed_configs(tmp_path: Path) -> None:
    from driver.api.v1alpha1.network_config import RdmaConfig

    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    run.mkdir()
    (state / "checkpoint.json").write_text(json.dumps(V1_CLAIMS))
    (run / "pods.json").write_text(json.dumps(V1_PODS))
    store = CheckpointStore(state, run)
    first, second = store.read(lambda s: s.claims["u1"].devices)
    # The stored parameter objects merged in order, as version-1 readers did on every hook.
    assert first.config == NetworkConfig(
        interface=InterfaceConfig(name="net1", mtu=9000), rdma=RdmaConfig(inject_env=False)
    )
    assert second.config == NetworkConfig()
    pod = store.read(lambda s: s.pods["p1"])
    assert pod.devices[0].step == "in-pod"
    assert pod.devices[0].records == {"addresses": {"routes": [{"dst": None, "gateway": "10.0.0.1"}]}}
    # The next write stores the claims as version 2 (nothing needs 3) and the pods as version 5 (the
    # host route is a setting's record now); reading them back gives the same state.
    store.update(lambda s: s.pods.__setitem__("p1", _with_device(s.pods["p1"], step="returning")))
    store.update(lambda s: s.claims.__setitem__("u2", _claim("u2")))
    assert json.loads((state / "checkpoint.json").read_text())["version"] == COMPATIBLE_VERSION
    assert json.loads((run / "pods.json").read_text())["version"] == RECORDS_VERSION
    assert "rdma_moved" not in (run / "pods.json").read_text()
    again = CheckpointStore(state, run)
    assert again.read(lambda s: s.claims["u1"].devices[0].config) == first.config


@pytest.mark.parametrize("name", ["checkpoint.json", "pods.json"])
def test_a_newer_version_is_refused_with_a_clear_message(tmp_path: Path, name: str) -> None:
    newer = SCHEMA_VERSION + 1
    (tmp_path / name).write_text(json.dumps({"version": newer, "claims": {}, "pods": {}}))
    with pytest.raises(CheckpointError, match=f"version {newer} was written by a newer driver"):
        CheckpointStore(tmp_path)
    assert json.loads((tmp_path / name).read_text())["version"] == newer  # kept for a human


def test_version_2_files_are_read_as_version_3(tmp_path: Path) -> None:
    """Version 3 only adds optional fields (dranet's remaining config fields, the pod state they need)."""
    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    data = json.loads((tmp_path / "checkpoint.json").read_text())
    (tmp_path / "checkpoint.json").write_text(json.dumps({**data, "version": 2}))
    again = CheckpointStore(tmp_path)
    assert again.read(lambda s: s.claims["u1"]) == store.read(lambda s: s.claims["u1"])


def test_a_file_without_version_is_kept_aside(tmp_path: Path) -> None:
    """Our driver never writes one: it is damage, not another version."""
    (tmp_path / "checkpoint.json").write_text(json.dumps({"claims": {}}))
    (quarantined,) = CheckpointStore(tmp_path).quarantined
    assert "version None" in quarantined.reason


def test_cloud_config_round_trips_and_older_files_have_none() -> None:
    from driver.api.v1alpha1.network_config import NetworkConfig, RouteConfig, RuleConfig
    from driver.checkpoint.state import PreparedDevice

    cloud = NetworkConfig(
        routes=(RouteConfig("0.0.0.0/0", "10.0.1.1", table=101),), rules=(RuleConfig(source="10.0.1.0/24", table=101),)
    )
    device = _claim("u1").devices[0]
    with_cloud = PreparedDevice(device.request, device.pool, device.device, device.snapshot, cloud, cloud)
    data = json.loads(json.dumps(with_cloud.to_dict()))
    assert data["cloudConfig"]["rules"] == [{"source": "10.0.1.0/24", "table": 101}]
    assert PreparedDevice.from_dict(data) == with_cloud
    del data["cloudConfig"]  # a file written before cloud configs existed
    assert PreparedDevice.from_dict(data).cloud_config is None


# -- two driver instances on one node (rolling update with surge) ---------------------------------


def test_a_second_store_sees_the_other_instances_writes(tmp_path: Path) -> None:
    """Prepared in one instance, unprepared in the other: each read sees the other's last write."""
    old, new = CheckpointStore(tmp_path / "s", tmp_path / "r"), CheckpointStore(tmp_path / "s", tmp_path / "r")
    new.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    assert old.read(lambda s: sorted(s.claims)) == ["u1"]
    old.update(lambda s: s.claims.pop("u1"))
    assert new.read(lambda s: sorted(s.claims)) == []
    old.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1", netns_path="/x")))
    assert new.read(lambda s: sorted(s.pods)) == ["p1"]
    assert not new.refresh()  # nothing changed since: no reload


def test_a_newer_schema_written_by_the_other_instance_is_refused_not_misread(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u1", _claim("u1")))
    data = json.loads(store.path.read_text())
    data["version"] = SCHEMA_VERSION + 1
    tmp = store.path.with_suffix(".other")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, store.path)
    with pytest.raises(CheckpointError, match="written by a newer driver"):
        store.read(lambda s: s.claims)


UPDATER = r"""
import sys
from driver.checkpoint.state import PodNetState
from driver.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1], sys.argv[1])
for i in range(int(sys.argv[3])):
    store.update(lambda s: s.pods.__setitem__(f"{sys.argv[2]}-{i}", PodNetState(f"{sys.argv[2]}-{i}")))
"""


def test_concurrent_updates_of_two_processes_lose_nothing(tmp_path: Path) -> None:
    """Read-modify-write under the cross-process flock: 2 x 60 updates, every one is kept."""
    procs = [
        subprocess.Popen([sys.executable, "-c", UPDATER, str(tmp_path), who, "60"], cwd=ROOT) for who in ("a", "b")
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    pods = CheckpointStore(tmp_path).read(lambda s: set(s.pods))
    assert pods == {f"{w}-{i}" for w in "ab" for i in range(60)}


def test_a_newer_version_is_written_only_when_the_content_needs_it(tmp_path: Path) -> None:
    """A version-2 driver (the old instance of a rolling update, a downgrade) keeps reading our files
    until a claim uses one of dranet's later config fields or a NIC carries a setting's record; then
    it refuses them instead of misreading."""
    from dataclasses import replace

    from driver.api.v1alpha1.network_config import InterfaceConfig, NetworkConfig, RuleConfig

    def versions() -> tuple[int, int]:
        return tuple(json.loads((tmp_path / n).read_text())["version"] for n in ("checkpoint.json", "pods.json"))

    store = CheckpointStore(tmp_path)
    plain = _claim("u1")
    store.update(lambda s: s.claims.__setitem__("u1", plain))
    store.update(lambda s: s.pods.__setitem__("p1", PodNetState("p1", devices=[MovedDevice("d", "eth0", "net1")])))
    assert versions() == (COMPATIBLE_VERSION, COMPATIBLE_VERSION)
    assert "records" not in json.loads((tmp_path / "pods.json").read_text())["pods"]["p1"]["devices"][0]
    # A cloud provider's rules were stored in version 2 already: still version 2.
    cloud = NetworkConfig(rules=(RuleConfig(source="10.0.0.0/24", table=101),))
    device = replace(plain.devices[0], config=cloud, cloud_config=cloud)
    store.update(lambda s: s.claims.__setitem__("u1", replace(plain, devices=[device])))
    assert versions()[0] == COMPATIBLE_VERSION
    arp = NetworkConfig(interface=InterfaceConfig(arp_ignore=1))
    store.update(lambda s: s.claims.__setitem__("u2", replace(_claim("u2"), devices=[replace(device, config=arp)])))
    assert versions()[0] == CONFIG_FIELDS_VERSION
    # How a NIC is found again (its indexes and identity) is version 4: a version-3 driver refuses it.
    store.update(lambda s: s.pods.__setitem__("p1", _with_device(s.pods["p1"], pod_index=7)))
    assert versions()[1] == IDENTITY_VERSION
    store.update(lambda s: s.pods.__setitem__("p1", _with_device(s.pods["p1"], pod_index=None)))
    vrf = {"kind": "vrf", "index": 9, "name": "vrf-a"}
    store.update(lambda s: s.pods.__setitem__("p1", replace(s.pods["p1"], created=[vrf])))
    assert versions()[1] == IDENTITY_VERSION
    # A setting's record is version 5: a version-4 driver refuses it (it would not undo the setting).
    sysctls = {"sysctls": {"ipv4/arp_ignore": 0}}
    store.update(lambda s: s.pods.__setitem__("p1", _with_device(s.pods["p1"], records=sysctls)))
    assert versions() == (CONFIG_FIELDS_VERSION, RECORDS_VERSION)
    store.update(lambda s: s.pods.__setitem__("p1", _with_device(s.pods["p1"], records={})))
    assert versions()[1] == IDENTITY_VERSION
    store.update(lambda s: (s.claims.pop("u2"), s.pods.pop("p1")))
    assert versions() == (COMPATIBLE_VERSION, COMPATIBLE_VERSION)
    again = CheckpointStore(tmp_path)
    assert again.read(lambda s: s.claims["u1"]) == store.read(lambda s: s.claims["u1"])


def test_a_share_is_written_as_version_5_and_read_back_from_snapshot_and_journal(tmp_path: Path) -> None:
    """A claim holding a share of a NIC (a sub-interface): a driver before version 5 would move the
    NIC itself, so the file and the journal record that carry it say version 5."""
    store = CheckpointStore(tmp_path)
    store.update(lambda s: s.claims.__setitem__("u0", _claim("u0")))
    assert json.loads((tmp_path / "checkpoint.json").read_text())["version"] == COMPATIBLE_VERSION
    share = _claim("u1")
    share.devices[0].shared, share.devices[0].share_id = True, "3f2d"
    share.devices[0].consumed = {"dra.net/bandwidth": "40G"}
    store.update(lambda s: s.claims.__setitem__("u1", share))
    snapshot = (tmp_path / "checkpoint.json").read_bytes()
    journal = tmp_path / CheckpointStore.JOURNAL_FILENAME
    at = Position.from_json(json.loads(snapshot).get("journal"))
    parsed = parse(journal.read_bytes() if journal.exists() else b"", base_of(snapshot), at)
    on_disk = [json.loads(snapshot), *(json.loads(p) for p in parsed.payloads)]
    [holder] = [d for d in on_disk if "u1" in (d.get("claims") or d.get("put") or {})]
    assert holder["version"] == RECORDS_VERSION
    again = CheckpointStore(tmp_path).read(lambda s: s.claims["u1"].devices[0])
    assert (again.share_id, again.consumed, again.sub_interface) == ("3f2d", {"dra.net/bandwidth": "40G"}, True)
