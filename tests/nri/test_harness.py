"""End to end through containerd/nri's runtime adaptation (the Go harness) with real veth NICs.

Our plugin runs as a separate process; prepared claims are written into its checkpoint
directly (as NodePrepareResources would); pods get test-created network namespaces.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from harness.nri import (
    DriverProcess,
    Harness,
    configure_host_nic,
    link_facts,
    pod_json,
    prepare_claim,
    wait_for,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _start(nri_harness: Harness, state_dir: Path, driver_procs: list[DriverProcess], syncs: int = 1) -> DriverProcess:
    drv = DriverProcess.start(nri_harness.socket, str(state_dir))
    driver_procs.append(drv)
    res = nri_harness.cmd("wait-sync", count=syncs, timeout=15)
    assert res["ok"], f"{res}\nharness: {nri_harness.log()[-1500:]}\ndriver: {drv.log()[-1500:]}"
    return drv


def test_full_pod_lifecycle(nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path) -> None:
    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    b, pb = netns_factory.veth()
    sub_a, routed_a, in_table, sub_b, routed_b = (netns_factory.subnet() for _ in range(5))
    configure_host_nic(
        a,
        pa,
        sub_a.cidr(1),
        [[str(routed_a.v4), "via", sub_a.ip(254)], [str(in_table.v4), "via", sub_a.ip(254), "table", "1234"]],
        mtu=1400,
    )
    configure_host_nic(b, pb, sub_b.cidr(1), [[str(routed_b.v4), "via", sub_b.ip(254), "metric", "77"]])
    before = {a: link_facts(a), b: link_facts(b)}
    assert before[a]["routes"] and before[b]["routes"]

    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    cfg = {
        "opaque": [
            {
                "interface": {
                    "name": "net1",
                    "mtu": 1300,
                    "hardwareAddr": "02:11:22:33:44:55",
                    "addresses": ["192.168.77.2/24"],
                },
                "routes": [{"destination": "172.30.0.0/16", "gateway": "192.168.77.1"}],
            }
        ]
    }
    prepare_claim(
        store,
        pod_uid,
        [
            {
                "ifname": a,
                "config": cfg,
                "rdma_device": "mlx5_0",
                "char_devices": [
                    {"path": "/dev/infiniband/uverbs0", "major": 231, "minor": 192},
                    {"path": "/dev/infiniband/rdma_cm", "major": 10, "minor": 58},
                ],
            },
            {
                "ifname": b,
                "char_devices": [
                    {"path": "/dev/infiniband/uverbs0", "major": 231, "minor": 192},
                    {"path": "/dev/infiniband/uverbs1", "major": 231, "minor": 193},
                ],
            },
        ],
    )
    del store  # the driver process owns the checkpoint from now on
    _start(nri_harness, tmp_path, driver_procs)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")

    res = nri_harness.cmd("run", pod=pod)
    assert res["ok"], res
    # NIC a: renamed, MTU + MAC from the config, configured address and route.
    net1 = link_facts("net1", netns=pod_ns)
    assert net1 is not None and net1["mtu"] == 1300 and net1["mac"] == "02:11:22:33:44:55" and net1["up"]
    assert net1["addresses"] == ["192.168.77.2/24"]
    assert ("172.30.0.0/16", "192.168.77.1", "main", None) in net1["routes"]
    # NIC b: no config -> host name, host addresses and routes copied.
    nb = link_facts(b, netns=pod_ns)
    assert nb is not None and nb["addresses"] == [sub_b.cidr(1)] and nb["routes"] == before[b]["routes"]
    assert link_facts(a) is None and link_facts(b) is None

    res = nri_harness.cmd("create", pod=pod, container={"id": "c1", "name": "main"})
    assert res["ok"], res
    devices = res["adjust"]["linux"]["devices"]
    paths = [d["path"] for d in devices]
    assert sorted(paths) == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"]
    assert all(d["type"] == "c" and d["fileMode"]["value"] == 0o666 for d in devices)

    res = nri_harness.cmd("stop", pod=pod)
    assert res["ok"], res
    assert link_facts(a) == before[a]
    assert link_facts(b) == before[b]
    assert link_facts("net1", netns=pod_ns) is None
    # Idempotent: remove after stop is a no-op that succeeds.
    assert nri_harness.cmd("remove", pod=pod)["ok"]
    assert link_facts(a) == before[a]
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)


def test_host_network_pod_with_nic_is_refused(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    a, _ = netns_factory.veth()
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-a"}])
    del store
    _start(nri_harness, tmp_path, driver_procs)
    res = nri_harness.cmd("run", pod=pod_json(pod_uid, ""))
    assert not res["ok"]
    assert "nic-a" in res["error"] and "hostNetwork" in res["error"]
    assert link_facts(a) is not None


def test_failure_rolls_back_and_names_device(nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path) -> None:
    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    b, _ = netns_factory.veth()
    sub, routed = netns_factory.subnet(), netns_factory.subnet()
    configure_host_nic(a, pa, sub.cidr(1), [[str(routed.v4), "via", sub.ip(254)]])
    before = link_facts(a)
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    # Second NIC's route has an unreachable gateway: configure fails after both moved.
    bad = {
        "opaque": [
            {
                "interface": {"addresses": ["192.168.9.2/24"]},
                "routes": [{"destination": "172.31.0.0/16", "gateway": "203.0.113.1"}],
            }
        ]
    }
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-a"}, {"ifname": b, "device": "nic-b", "config": bad}])
    del store
    _start(nri_harness, tmp_path, driver_procs)
    res = nri_harness.cmd("run", pod=pod_json(pod_uid, f"/run/netns/{pod_ns}"))
    assert not res["ok"]
    assert "nic-b" in res["error"] and "route" in res["error"], res["error"]
    assert link_facts(a) == before
    assert link_facts(b) is not None and link_facts(b, netns=pod_ns) is None
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)


def test_synchronize_returns_nics_of_pods_gone_while_down(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    sub, routed = netns_factory.subnet(), netns_factory.subnet()
    configure_host_nic(a, pa, sub.cidr(1), [[str(routed.v4), "via", sub.ip(254)]])
    before = link_facts(a)
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(store, pod_uid, [{"ifname": a}])
    del store
    drv = _start(nri_harness, tmp_path, driver_procs)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    assert nri_harness.cmd("run", pod=pod)["ok"]
    assert link_facts(a, netns=pod_ns) is not None
    drv.kill()
    # The pod disappears while the driver is down; the restarted driver's Synchronize returns the NIC.
    assert nri_harness.cmd("set-pods", pods=[])["ok"]
    _start(nri_harness, tmp_path, driver_procs, syncs=2)
    assert link_facts(a) == before


def test_stop_after_netns_unmounted_still_returns_the_nic(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    """The runtime unmounted the pod namespace before Stop (containerd after its own restart
    never sends Stop at all): the driver's pin keeps the namespace, and its veth, alive."""
    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-v"}])
    del store
    _start(nri_harness, tmp_path, driver_procs)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    assert nri_harness.cmd("run", pod=pod)["ok"]
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    assert nri_harness.cmd("stop", pod=pod)["ok"]
    assert link_facts(a) is not None and link_facts(pa) is not None
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)


def test_stop_after_netns_deleted_reports_lost_virtual_nic_once(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    """The namespace died while no driver held it (driver down): its veth is gone for good."""
    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-v"}])
    del store
    drv = _start(nri_harness, tmp_path, driver_procs)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    assert nri_harness.cmd("run", pod=pod)["ok"]
    drv.kill()
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)  # a veth dies with its netns
    _start(nri_harness, tmp_path, driver_procs, syncs=2)
    res = nri_harness.cmd("stop", pod=pod)
    assert not res["ok"] and "nic-v" in res["error"] and "find" in res["error"]
    wait_for(lambda: link_facts(pa) is None)  # the pair dies with the netns (asynchronously)
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)
    assert nri_harness.cmd("remove", pod=pod)["ok"]  # no endless retries


def test_create_container_injects_exact_hcas_and_numa_cpuset(
    nri_harness: Harness, driver_procs, nd_h100_sysfs: Path, tmp_path: Path
) -> None:
    """Through the real runtime adaptation: NCCL_IB_HCA in exact-match form, the driver's own
    variable, and (numa.pin) the cpuset of the NICs' NUMA node from the node's sysfs."""
    store = CheckpointStore(tmp_path)
    pinned = {"opaque": [{"numa": {"pin": True}}]}
    pod_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(
        store,
        pod_uid,
        [
            {
                "rdma_device": "mlx5_5",
                "numa_node": 1,
                "config": pinned,
                "char_devices": [{"path": "/dev/infiniband/uverbs5", "major": 231, "minor": 197}],
            },
            {
                "rdma_device": "mlx5_4",
                "numa_node": 1,
                "char_devices": [{"path": "/dev/infiniband/uverbs4", "major": 231, "minor": 196}],
            },
        ],
    )
    other_uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(
        store,
        other_uid,
        [{"rdma_device": "mlx5_0", "numa_node": 0, "config": {"opaque": [{"rdma": {"injectEnv": False}}]}}],
    )
    del store
    drv = DriverProcess.start(nri_harness.socket, str(tmp_path), sysfs_root=str(nd_h100_sysfs))
    driver_procs.append(drv)
    assert nri_harness.cmd("wait-sync", count=1, timeout=15)["ok"], drv.log()[-1500:]

    res = nri_harness.cmd("create", pod=pod_json(pod_uid, ""), container={"id": "c1", "name": "train"})
    assert res["ok"], res
    env = {e["key"]: e["value"] for e in res["adjust"]["env"]}
    hcas = env["NCCL_IB_HCA"]
    assert hcas.startswith("=") and sorted(hcas[1:].split(",")) == ["mlx5_4", "mlx5_5"]
    assert sorted(env["DRANET_RDMA_DEVICES"].split(",")) == ["mlx5_4", "mlx5_5"]
    cpu = res["adjust"]["linux"]["resources"]["cpu"]
    node1 = (nd_h100_sysfs / "devices/system/node/node1/cpulist").read_text().strip()
    assert cpu["cpus"] == node1 and cpu["mems"] == "1"

    # rdma.injectEnv: false and no numa.pin: no env, no cpuset (char devices only, none here).
    res = nri_harness.cmd("create", pod=pod_json(other_uid, ""), container={"id": "c2", "name": "x"})
    assert res["ok"], res
    adjust = res.get("adjust") or {}
    cpu = adjust.get("linux", {}).get("resources", {}).get("cpu", {})
    assert not adjust.get("env") and not cpu.get("cpus") and not cpu.get("mems")


def test_ethtool_features_set_in_pod_and_restored_on_host(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    """claim config ethtool.features: applied inside the pod, host values back after StopPodSandbox."""
    from tests.nic_settings.test_ethtool import (
        ioctl_features,  # SIOCETHTOOL: not the genetlink code under test
    )

    pod_ns = netns_factory.netns()
    a, pa = netns_factory.veth()
    sub = netns_factory.subnet()
    configure_host_nic(a, pa, sub.cidr(1), [])
    before = ioctl_features(a)
    assert before["tx-checksum-ip-generic"] and not before["rx-gro"]
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    cfg = {
        "opaque": [
            {
                "interface": {"name": "net1"},
                "ethtool": {"features": {"tx-checksum-ip-generic": False, "generic-receive-offload": True}},
            }
        ]
    }
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-e", "config": cfg}])
    del store
    _start(nri_harness, tmp_path, driver_procs)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")

    assert nri_harness.cmd("run", pod=pod)["ok"]
    inside = ioctl_features("net1", pod_ns)
    assert not inside["tx-checksum-ip-generic"] and inside["rx-gro"]
    assert link_facts("net1", netns=pod_ns)["up"]
    moved = CheckpointStore(tmp_path).read(lambda s: s.pods[pod_uid].devices[0])
    assert moved.records["ethtool"]["features"] == {"tx-checksum-ip-generic": True, "rx-gro": False}  # write-ahead

    assert nri_harness.cmd("stop", pod=pod)["ok"]
    assert ioctl_features(a) == before
    assert link_facts(a)["addresses"] == [sub.cidr(1)]


def test_unknown_ethtool_feature_fails_before_any_move(
    nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    pod_ns = netns_factory.netns()
    a, _ = netns_factory.veth()
    before = link_facts(a)
    store = CheckpointStore(tmp_path)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    cfg = {"opaque": [{"ethtool": {"features": {"rx-warp-drive": True}}}]}
    prepare_claim(store, pod_uid, [{"ifname": a, "device": "nic-u", "config": cfg}])
    del store
    _start(nri_harness, tmp_path, driver_procs)
    res = nri_harness.cmd("run", pod=pod_json(pod_uid, f"/run/netns/{pod_ns}"))
    assert not res["ok"]
    assert "nic-u" in res["error"] and "ethtool" in res["error"] and "'rx-warp-drive'" in res["error"], res
    assert link_facts(a) == before
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)
