"""pods.json corrupt at a restart: the NICs in a running pod are found in its namespace and still
come back to the host, with their name, MTU, MAC and addresses, when the pod stops.

The runtime side is the real containerd/nri adaptation (Go harness); the driver is a real
process; the NICs are real veths moved into a real network namespace.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from driver.checkpoint.store import CheckpointStore
from harness.nri import DriverProcess, Harness, configure_host_nic, link_facts, pod_json, prepare_claim

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _start(h: Harness, state: Path, procs: list[DriverProcess], syncs: int) -> DriverProcess:
    drv = DriverProcess.start(h.socket, str(state))
    procs.append(drv)
    res = h.cmd("wait-sync", count=syncs, timeout=15)
    assert res["ok"], f"{res}\n{drv.log()[-2000:]}"
    return drv


@pytest.mark.parametrize("damage", [b"{torn", b""], ids=["torn", "empty"])
def test_nics_of_a_running_pod_come_back_after_pods_json_was_lost(
    damage: bytes, nri_harness: Harness, netns_factory, driver_procs, tmp_path: Path
) -> None:
    pod_ns = netns_factory.netns()
    names, before = [], {}
    for i in range(2):
        a, pa = netns_factory.veth()
        configure_host_nic(a, pa, netns_factory.subnet().cidr(1), [], mtu=1450 + i)
        names.append(a)
        before[a] = link_facts(a)
    pod_uid = f"uid-{secrets.token_hex(4)}"
    devices = [
        {
            "ifname": a,
            "permanent_mac": before[a]["mac"],
            # What discovery published for the NIC when it was prepared (the snapshot).
            "attributes": {
                "dra.net/mac": before[a]["mac"],
                "dra.net/mtu": before[a]["mtu"],
                "dra.net/ipv4": ",".join(before[a]["addresses"]),
            },
        }
        for a in names
    ]
    devices[0]["config"] = {
        "opaque": [{"interface": {"name": "net1", "mtu": 1300, "hardwareAddr": "02:aa:00:00:00:01"}}]
    }
    prepare_claim(CheckpointStore(tmp_path), pod_uid, devices)
    pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")

    first = _start(nri_harness, tmp_path, driver_procs, 1)
    assert nri_harness.cmd("run", pod=pod)["ok"]
    assert link_facts("net1", netns=pod_ns)["mac"] == "02:aa:00:00:00:01"
    assert link_facts(names[1], netns=pod_ns) is not None
    first.kill()
    (tmp_path / "pods.json").write_bytes(damage)  # the pod state is gone; the NICs are in the pod

    second = _start(nri_harness, tmp_path, driver_procs, 2)
    log = second.log()
    assert "state file is corrupt" in log and "NICs found in the pod's namespace recorded again" in log
    assert list(tmp_path.glob("pods.json.corrupt-*"))
    pods = CheckpointStore(tmp_path).read(lambda s: {u: [m.step for m in p.devices] for u, p in s.pods.items()})
    assert pods == {pod_uid: ["in-pod", "in-pod"]}
    assert link_facts("net1", netns=pod_ns) is not None  # a running pod keeps its NICs

    assert nri_harness.cmd("stop", pod=pod)["ok"]
    for a in names:
        assert link_facts(a) == before[a], f"{a} not restored"  # name, MTU, MAC, addresses
    assert link_facts("net1", netns=pod_ns) is None
    assert CheckpointStore(tmp_path).read(lambda s: pod_uid not in s.pods)
