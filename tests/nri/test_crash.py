"""Kill the driver between every pair of hook steps; after a restart no NIC is stranded or misnamed.

DRANET_FAULT_AFTER=<step> makes the driver process ``os._exit(137)`` right after that step
(driver/nri/hook_steps.py). The runtime side is the real containerd/nri adaptation (Go harness),
which keeps the pod in its Synchronize list, so the restarted driver reconciles it.
NIC 0 also gets ethtool features, so every step checks their host values come back too.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.nri.step_clock import RUN_STEPS, STOP_STEPS
from harness.nri import (
    Harness,
    configure_host_nic,
    link_facts,
    pod_json,
    prepare_claim,
    restart_driver,
)
from tests.nic_settings.test_ethtool import ioctl_features

pytestmark = [pytest.mark.root, pytest.mark.slow]

NICS = 2
# One NIC renamed with a new MAC, MTU and offloads, the other keeps its host identity.
POD_CONFIG = {
    "opaque": [
        {
            "interface": {
                "name": "net1",
                "mtu": 1300,
                "hardwareAddr": "02:aa:bb:cc:dd:01",
                "addresses": ["192.168.50.2/24"],
            },
            "ethtool": {"features": {"tx": False, "gro": True}},
        }
    ]
}


def _expand(steps: list[str]) -> list[str]:
    return [s.format(i=i) for s in steps for i in (range(NICS) if "{i}" in s else [0])]


def _setup(netns_factory, tmp_path: Path) -> tuple[str, str, list[str], dict]:
    pod_ns = netns_factory.netns()
    names, before = [], {}
    for i in range(NICS):
        a, pa = netns_factory.veth()
        sub, routed, in_table = netns_factory.subnet(), netns_factory.subnet(), netns_factory.subnet()
        configure_host_nic(
            a,
            pa,
            sub.cidr(1),
            [
                [str(routed.v4), "via", sub.ip(254)],
                [str(in_table.v4), "via", sub.ip(254), "table", str(500 + i)],
            ],
            mtu=1400 + i,
        )
        names.append(a)
        before[a] = {**link_facts(a), "features": ioctl_features(a)}
    pod_uid = f"uid-{secrets.token_hex(4)}"
    cfg = POD_CONFIG
    prepare_claim(CheckpointStore(tmp_path), pod_uid, [{"ifname": names[0], "config": cfg}, {"ifname": names[1]}])
    return pod_ns, pod_uid, names, before


def _assert_on_host(names: list[str], before: dict, pod_ns: str) -> None:
    for a in names:
        assert {**link_facts(a), "features": ioctl_features(a)} == before[a], f"{a} not restored"
    assert link_facts("net1", netns=pod_ns) is None


@pytest.mark.parametrize("step", _expand(RUN_STEPS))
def test_crash_during_run_pod_sandbox(
    step: str, nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    pod_ns, pod_uid, names, before = _setup(netns_factory, tmp_path)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    drv = restart_driver(nri_harness, tmp_path, driver_procs, 1, fault=step)
    res = nri_harness.cmd("run", pod=pod)
    assert not res["ok"], "the driver died mid-hook: the runtime must see an error"
    assert drv.wait_exit() == 137, drv.log()[-2000:]

    restart_driver(nri_harness, tmp_path, driver_procs, 2)  # pod still exists: Synchronize reconciles
    if step == "run:committed":
        # The hook finished its work before dying: the NICs stay, fully configured, in the pod.
        net1 = link_facts("net1", netns=pod_ns)
        assert net1 is not None and net1["mac"] == "02:aa:bb:cc:dd:01" and net1["mtu"] == 1300
        inside = ioctl_features("net1", pod_ns)
        assert inside["rx-gro"] and not inside["tx-checksum-ip-generic"]
        assert link_facts(names[1], netns=pod_ns)["addresses"] == before[names[1]]["addresses"]
    else:
        _assert_on_host(names, before, pod_ns)
        assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)
    assert nri_harness.cmd("stop", pod=pod)["ok"]
    _assert_on_host(names, before, pod_ns)
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)


@pytest.mark.parametrize("step", _expand(STOP_STEPS))
def test_crash_during_stop_pod_sandbox(
    step: str, nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    pod_ns, pod_uid, names, before = _setup(netns_factory, tmp_path)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
    first = restart_driver(nri_harness, tmp_path, driver_procs, 1)
    assert nri_harness.cmd("run", pod=pod)["ok"]
    assert link_facts("net1", netns=pod_ns) is not None
    first.kill()  # SIGKILL with the NICs in the pod: they must stay there (pod still runs)
    drv = restart_driver(nri_harness, tmp_path, driver_procs, 2, fault=step)
    assert link_facts("net1", netns=pod_ns) is not None
    res = nri_harness.cmd("stop", pod=pod)
    assert drv.wait_exit() == 137, drv.log()[-2000:]
    assert not res["ok"]

    restart_driver(nri_harness, tmp_path, driver_procs, 3)  # Synchronize finishes the return
    _assert_on_host(names, before, pod_ns)
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)
    assert nri_harness.cmd("remove", pod=pod)["ok"]
    _assert_on_host(names, before, pod_ns)
