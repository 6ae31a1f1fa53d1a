"""``interface.dhcp: true``: a lease's routes (main table or the VRF's), and the lease through the NRI
hooks against a real DHCP server (busybox udhcpd).

The NIC is a veth whose far end sits in a namespace of the test's own, where udhcpd serves; the
hook moves the NIC into the pod's namespace, takes a lease there, and releases it at stop.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.config import DHCP_TIMEOUT
from driver.dhcp.wire import Lease
from driver.netlink.rtnl import Route
from driver.nic_settings.dhcp import lease_routes
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from driver.nri.pod_netns import pod_netns_path
from harness.netns import NetnsFactory
from harness.nri import DriverProcess, Harness, link_facts, pod_json, prepare_claim
from tests.support.dhcp_server import UdhcpdServer, start_udhcpd

DHCP = {"opaque": [{"interface": {"name": "net1", "dhcp": True}}]}
LEASE = Lease(
    address="10.77.4.11/24",
    server_id="10.77.4.1",
    client_mac="02:00:00:00:00:01",
    routes=(("10.204.0.0/16", "10.77.4.1"), ("10.205.0.9/32", None)),
)


def test_lease_routes_go_to_the_main_table_or_the_vrfs() -> None:
    assert lease_routes(LEASE) == [
        Route(dst="10.204.0.0/16", gateway="10.77.4.1", table=254, family=socket.AF_INET),
        Route(dst="10.205.0.9/32", gateway=None, scope=253, table=254, family=socket.AF_INET),
    ]
    assert {r.table for r in lease_routes(LEASE, 107)} == {107}


class Status:
    """A StatusSink that keeps what the hooks report."""

    def __init__(self) -> None:
        self.ready: list[Any] = []
        self.failed: list[tuple[str, str, str]] = []

    def pod_network_ready(self, pod_uid: str, claim: Any, results: list[Any]) -> None:
        self.ready += results

    def pod_network_failed(self, pod_uid: str, claim: Any, device: str, step: str, message: str) -> None:
        self.failed.append((device, step, message))


def _pod(uid: str, netns: str) -> api.PodSandbox:
    return json_format.ParseDict(pod_json(uid, netns), api.PodSandbox())


@dataclass
class Setup:
    """A prepared claim with one DHCP NIC for a pod, and the hooks that will move it."""

    store: CheckpointStore
    hooks: NRIHooks
    status: Status
    pod: api.PodSandbox
    claim_uid: str


def _setup(nic: str, netns_factory: NetnsFactory, tmp_path: Path, **device: Any) -> Setup:
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = secrets.token_hex(8)
    claim_uid = prepare_claim(store, uid, [{"ifname": nic, "config": DHCP, **device}])
    status = Status()
    hooks = NRIHooks(store, status=status, host_netns="/proc/self/ns/net")
    return Setup(store, hooks, status, _pod(uid, f"/run/netns/{pod_ns}"), claim_uid)


@pytest.fixture
def served_nic(netns_factory: NetnsFactory, tmp_path: Path) -> Iterator[tuple[str, UdhcpdServer]]:
    """(host NIC, the DHCP server on its far end): the NIC is up, without an address."""
    server_ns = netns_factory.netns()
    nic, peer = netns_factory.veth(peer_netns=server_ns)
    subprocess.run(["ip", "link", "set", nic, "up"], check=True)
    server = start_udhcpd(server_ns, peer, "10.77.4", tmp_path / "dhcp", routes=[("10.204.0.0/16", "10.77.4.1")])
    try:
        yield nic, server
    finally:
        server.stop()


@pytest.mark.root
def test_the_pod_gets_a_lease_and_stop_releases_it(
    served_nic: tuple[str, UdhcpdServer], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, server = served_nic
    before = link_facts(nic)
    assert before is not None
    t = _setup(nic, netns_factory, tmp_path)
    start = time.perf_counter()
    t.hooks.run_pod_sandbox(t.pod)
    took = time.perf_counter() - start
    inside = link_facts("net1", pod_netns_path(t.pod).rsplit("/", 1)[1])
    assert inside is not None and inside["up"]
    [address] = inside["addresses"]
    assert address.startswith("10.77.4.") and address.endswith("/24"), inside
    assert ("10.204.0.0/16", "10.77.4.1", "main", None) in inside["routes"], inside["routes"]
    assert not [r for r in inside["routes"] if r[0] == "default"], "the router option makes no default route"
    assert took < 1.0, f"RunPodSandbox with a DHCP exchange took {took:.3f}s"
    [moved] = t.store.read(lambda s: s.pods[t.pod.uid].devices)
    lease = moved.records.get("dhcp")
    assert lease is not None and lease["address"] == address
    assert lease["serverID"] == server.address
    assert [(r.interface_name, r.ips) for r in t.status.ready] == [("net1", [address])], (
        "the claim status shows the lease"
    )
    leased_ip, expires = server.leases()[before["mac"]]
    assert leased_ip == address.split("/")[0] and expires != "expired"

    t.hooks.stop_pod_sandbox(t.pod)
    assert server.released(before["mac"]), server.log()
    assert link_facts(nic) == before, "the NIC comes back as it was, without the leased address"
    assert t.store.read(lambda s: s.pods) == {}


@pytest.mark.root
def test_no_lease_fails_the_pod_naming_the_nic_and_gives_the_nic_back(
    served_nic: tuple[str, UdhcpdServer], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, server = served_nic
    server.stop()
    before = link_facts(nic)
    t = _setup(nic, netns_factory, tmp_path, device="dev-dhcp")
    start = time.perf_counter()
    with pytest.raises(HookError) as exc:
        t.hooks.run_pod_sandbox(t.pod)
    took = time.perf_counter() - start
    message = str(exc.value)
    assert f"device dev-dhcp: dhcp failed: net1: no DHCPOFFER within {DHCP_TIMEOUT:g}s" in message, message
    assert took < 2.0, f"the failed hook took {took:.3f}s: more than the runtime's 2 s"
    assert [(d, step) for d, step, _ in t.status.failed] == [("dev-dhcp", "dhcp")], "Ready=False names the step"
    assert link_facts(nic) == before, "the NIC is back on the host, returnable"
    assert t.store.read(lambda s: s.pods) == {}


@pytest.mark.root
def test_unprepare_without_stop_releases_the_lease_too(
    served_nic: tuple[str, UdhcpdServer], netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, server = served_nic
    mac = (link_facts(nic) or {})["mac"]
    t = _setup(nic, netns_factory, tmp_path)
    t.hooks.run_pod_sandbox(t.pod)
    t.hooks.claim_unprepared(t.store.read(lambda s: s.claims[t.claim_uid]))
    assert server.released(mac), server.log()
    assert link_facts(nic) is not None and link_facts(nic)["addresses"] == []  # type: ignore[index]


@pytest.mark.root
def test_two_dhcp_nics_lease_at_once_and_one_failure_releases_the_other(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    servers, nics = [], []
    try:
        for i, prefix in enumerate(("10.77.5", "10.77.6")):
            server_ns = netns_factory.netns()
            nic, peer = netns_factory.veth(peer_netns=server_ns)
            subprocess.run(["ip", "link", "set", nic, "up"], check=True)
            servers.append(start_udhcpd(server_ns, peer, prefix, tmp_path / f"dhcp{i}"))
            nics.append(nic)
        pod_ns = netns_factory.netns()
        store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
        uid = secrets.token_hex(8)
        devices = [
            {
                "ifname": nic,
                "device": f"dev{i}",
                "config": {"opaque": [{"interface": {"name": f"net{i}", "dhcp": True}}]},
            }
            for i, nic in enumerate(nics)
        ]
        prepare_claim(store, uid, devices)
        hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
        pod = _pod(uid, f"/run/netns/{pod_ns}")
        start = time.perf_counter()
        hooks.run_pod_sandbox(pod)
        took = time.perf_counter() - start
        assert [(link_facts(f"net{i}", pod_ns) or {})["addresses"][0][:8] for i in range(2)] == ["10.77.5.", "10.77.6."]
        assert took < 1.0, took
        hooks.stop_pod_sandbox(pod)
        macs = [(link_facts(nic) or {})["mac"] for nic in nics]
        assert all(s.released(m) for s, m in zip(servers, macs, strict=True))

        # The second server is gone: the pod fails, and the first NIC's fresh lease is given back.
        servers[1].stop()
        with pytest.raises(HookError, match="device dev1: dhcp failed: net1: no DHCPOFFER"):
            hooks.run_pod_sandbox(pod)
        assert servers[0].log().count("sending ACK") == 2, "the first NIC got a lease again"
        assert servers[0].released(macs[0]), servers[0].log()
        assert [(link_facts(nic) or {}).get("addresses") for nic in nics] == [[], []]
    finally:
        for s in servers:
            s.stop()


@pytest.mark.slow
@pytest.mark.root
def test_over_nri_the_lease_survives_a_driver_restart_and_stop_releases_it(
    served_nic: tuple[str, UdhcpdServer],
    netns_factory: NetnsFactory,
    nri_harness: Harness,
    driver_procs: list[DriverProcess],
    tmp_path: Path,
) -> None:
    """The real runtime side (containerd/nri's adaptation, 2 s request timeout) and a driver process."""
    nic, server = served_nic
    before = link_facts(nic)
    assert before is not None
    pod_ns = netns_factory.netns()
    uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(CheckpointStore(tmp_path), uid, [{"ifname": nic, "config": DHCP}])
    pod = pod_json(uid, f"/run/netns/{pod_ns}")
    first = DriverProcess.start(nri_harness.socket, str(tmp_path))
    driver_procs.append(first)
    assert nri_harness.cmd("wait-sync", count=1, timeout=15)["ok"], first.log()[-2000:]
    res = nri_harness.cmd("run", pod=pod)
    assert res["ok"], f"{res}\n{first.log()[-2000:]}"
    [address] = (link_facts("net1", pod_ns) or {})["addresses"]
    first.kill()  # the lease is in pods.json: a new driver process releases it
    second = DriverProcess.start(nri_harness.socket, str(tmp_path))
    driver_procs.append(second)
    assert nri_harness.cmd("wait-sync", count=2, timeout=15)["ok"], second.log()[-2000:]
    assert (link_facts("net1", pod_ns) or {})["addresses"] == [address], "Synchronize keeps a running pod's NIC"
    assert nri_harness.cmd("stop", pod=pod)["ok"], second.log()[-2000:]
    assert server.released(before["mac"]), server.log()
    assert link_facts(nic) == before


@pytest.mark.slow
@pytest.mark.root
def test_over_nri_no_lease_is_an_error_within_the_runtimes_timeout(
    served_nic: tuple[str, UdhcpdServer],
    netns_factory: NetnsFactory,
    nri_harness: Harness,
    driver_procs: list[DriverProcess],
    tmp_path: Path,
) -> None:
    nic, server = served_nic
    server.stop()
    before = link_facts(nic)
    pod_ns = netns_factory.netns()
    uid = f"uid-{secrets.token_hex(4)}"
    prepare_claim(CheckpointStore(tmp_path), uid, [{"ifname": nic, "config": DHCP, "device": "dev-dhcp"}])
    drv = DriverProcess.start(nri_harness.socket, str(tmp_path))
    driver_procs.append(drv)
    assert nri_harness.cmd("wait-sync", count=1, timeout=15)["ok"], drv.log()[-2000:]
    res = nri_harness.cmd("run", pod=pod_json(uid, f"/run/netns/{pod_ns}"))
    assert not res["ok"]
    assert "device dev-dhcp: dhcp failed: net1: no DHCPOFFER" in res["error"], res  # not a runtime timeout
    assert link_facts(nic) == before
