"""What a tenant writes in a claim, or does with NET_ADMIN in its pod, never touches a link the driver
does not own, and never strands a NIC.

The runtime side is the real containerd/nri adaptation (Go harness); the driver is a real process
(NRIPlugin + NRIHooks); the NICs are real veths. The node's namespace is a throwaway one (``host``:
the driver's --host-netns), with an uplink (default route) of its own: nothing here can touch the
machine's real links. Every NIC's peer lives in a ``fabric`` namespace, as a cable's far end would.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.store import CheckpointStore
from harness.netns import NetnsFactory
from harness.nri import DriverProcess, Harness, link_facts, pod_json, prepare_claim

pytestmark = [pytest.mark.root, pytest.mark.slow]


def ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True, text=True)


def routes(ns: str) -> str:
    """The routes someone added (not those the kernel makes, which come and go with IPv6 autoconf)."""
    out = subprocess.run(["ip", "-n", ns, "route", "show", "table", "all"], capture_output=True, text=True).stdout
    return "\n".join(
        line
        for line in out.splitlines()
        if "proto kernel" not in line and not line.startswith(("local ", "multicast ", "broadcast "))
    )


@dataclass
class Node:
    """A node in namespaces: ``host`` (with an uplink ``up0`` holding the default route), ``fabric``
    (the far ends), ``pod`` (with its own CNI ``eth0``), and NICs on the host."""

    factory: NetnsFactory
    state: Path
    host: str = ""
    fabric: str = ""
    pod: str = ""
    nics: list[str] = field(default_factory=list)
    peers: list[str] = field(default_factory=list)
    before: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.host, self.fabric, self.pod = self.factory.netns(), self.factory.netns(), self.factory.netns()
        self.factory.veth("up0", "up0p", netns=self.host, peer_netns=self.fabric)
        ip(self.host, "link", "set", "up0", "up")
        ip(self.fabric, "link", "set", "up0p", "up")
        ip(self.host, "addr", "add", "10.250.0.2/24", "dev", "up0")
        ip(self.host, "route", "add", "default", "via", "10.250.0.1", "dev", "up0")
        self.factory.veth("eth0", "cni0", netns=self.pod, peer_netns=self.fabric)  # the pod's own interface
        for i in range(2):
            nic, peer = f"nic{i}", f"nic{i}p"
            self.factory.veth(nic, peer, netns=self.host, peer_netns=self.fabric)
            ip(self.fabric, "link", "set", peer, "up")
            ip(self.host, "link", "set", nic, "up")
            ip(self.host, "addr", "add", f"10.6{i}.0.1/24", "dev", nic)
            ip(self.host, "route", "add", f"10.7{i}.0.0/16", "via", f"10.6{i}.0.254", "dev", nic)
            self.nics.append(nic)
            self.peers.append(peer)
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, Any]:
        """Every host link the test made (the uplink too), the host routes, the pod's own eth0."""
        out: dict[str, Any] = {n: link_facts(n, netns=self.host) for n in ["up0", *self.nics]}
        out["routes"] = routes(self.host)
        out["pod eth0"] = link_facts("eth0", netns=self.pod)
        return out

    def driver(self, h: Harness, procs: list[DriverProcess], sysfs_root: str = "/sys") -> DriverProcess:
        drv = DriverProcess.start(
            h.socket, str(self.state), host_netns=f"/run/netns/{self.host}", sysfs_root=sysfs_root
        )
        procs.append(drv)
        res = h.cmd("wait-sync", count=len(procs), timeout=15)
        assert res["ok"], f"{res}\n{drv.log()[-2000:]}"
        return drv

    def pod_json(self, uid: str) -> dict[str, Any]:
        return pod_json(uid, f"/run/netns/{self.pod}")


@pytest.fixture
def node(netns_factory: NetnsFactory, tmp_path: Path) -> Node:
    return Node(netns_factory, tmp_path)


def _claims(node: Node, *configs: dict[str, Any] | None, one_claim: bool = True) -> str:
    """Prepared claim(s) for a new pod: NIC i with ``configs[i]`` (None: no config)."""
    uid = f"uid-{secrets.token_hex(4)}"
    devices = [
        {"ifname": nic, **({"config": {"opaque": [cfg]}} if cfg else {})}
        for nic, cfg in zip(node.nics, configs, strict=False)
    ]
    store = CheckpointStore(node.state)
    if one_claim:
        prepare_claim(store, uid, devices)
    else:
        for d in devices:
            prepare_claim(store, uid, [d])
    return uid


def test_a_claim_mac_never_takes_over_the_uplink(node: Node, nri_harness: Harness, driver_procs) -> None:
    """Case: the claim sets the uplink's MAC; the NIC vanishes while in the pod (its far end is gone,
    as a VF removed or a virtual NIC's peer deleted). At stop the uplink is not taken for it: its
    name, MAC, address and the default route stay; the lost NIC is reported, once."""
    up0_mac = node.before["up0"]["mac"]
    uid = _claims(node, {"interface": {"name": "net1", "hardwareAddr": up0_mac}})
    drv = node.driver(nri_harness, driver_procs)
    pod = node.pod_json(uid)
    assert nri_harness.cmd("run", pod=pod)["ok"], drv.log()[-2000:]
    assert link_facts("net1", netns=node.pod)["mac"] == up0_mac
    ip(node.fabric, "link", "del", node.peers[0])  # the NIC is gone
    stop = nri_harness.cmd("stop", pod=pod)
    assert not stop["ok"] and "find failed" in stop.get("error", ""), stop
    after = node.snapshot()
    assert after["up0"] == node.before["up0"], "the uplink was touched"
    assert "default via 10.250.0.1 dev up0" in after["routes"]
    assert after["nic1"] == node.before["nic1"], "the other NIC is home as it was"
    assert nri_harness.cmd("remove", pod=pod)["ok"], "reported once, then forgotten"
    assert CheckpointStore(node.state).read(lambda s: uid not in s.pods)


@pytest.mark.parametrize(
    ("config", "step", "reason"),
    [
        ({"interface": {"name": "eth0"}}, "name", "the pod already has an interface 'eth0'"),
        ({"interface": {"name": "net1", "mtu": 65536}}, "mtu", "above the NIC's maximum MTU 65535"),
        ({"interface": {"name": "net1", "vrf": {"name": "eth0"}}}, "vrf", "the pod already has an interface 'eth0'"),
    ],
    ids=["name-taken-in-pod", "mtu-above-max", "vrf-named-like-pod-link"],
)
def test_a_config_the_kernel_would_refuse_in_the_pod_is_refused_before_any_move(
    node: Node, nri_harness: Harness, driver_procs, config: dict[str, Any], step: str, reason: str
) -> None:
    """Cases: a name the pod already has (its CNI eth0, a Multus net1), an MTU above the NIC's
    maximum, a VRF named like a link of the pod. The kernel would refuse them only with the NIC in
    the pod; here the pod fails naming the device, the step and the field, every NIC on the host as
    it was, the pod's eth0 untouched; and when the pod's namespace goes, nothing is lost."""
    uid = _claims(node, config, None)
    drv = node.driver(nri_harness, driver_procs)
    pod = node.pod_json(uid)
    res = nri_harness.cmd("run", pod=pod)
    assert not res["ok"]
    assert f"{step} failed" in res["error"] and reason in res["error"], res["error"]
    assert node.snapshot() == node.before
    assert CheckpointStore(node.state).read(lambda s: uid not in s.pods)
    assert nri_harness.cmd("stop", pod=pod)["ok"] and nri_harness.cmd("remove", pod=pod)["ok"]
    subprocess.run(["ip", "netns", "del", node.pod], check=True)
    node.factory.namespaces.remove(node.pod)
    assert {k: v for k, v in node.snapshot().items() if k != "pod eth0"} == {
        k: v for k, v in node.before.items() if k != "pod eth0"
    }
    assert "Traceback" not in drv.log()


def test_names_reused_across_claims_of_one_pod_are_refused_before_any_move(
    node: Node, nri_harness: Harness, driver_procs
) -> None:
    """Case: two claims of one pod, one naming its NIC net1, the other its VRF net1 (or its NIC net1
    too): each claim is fine alone; together they are refused, and the first claim's NIC is never
    deleted (it never moved)."""
    for second in ({"interface": {"vrf": {"name": "net1"}}}, {"interface": {"name": "net1"}}):
        uid = _claims(node, {"interface": {"name": "net1"}}, second, one_claim=False)
        if not driver_procs:
            node.driver(nri_harness, driver_procs)
        res = nri_harness.cmd("run", pod=node.pod_json(uid))
        assert not res["ok"], res
        assert "'net1'" in res["error"] and (
            "another claim" in res["error"] or "interface name of device" in res["error"]
        )
        assert node.snapshot() == node.before


def test_a_pod_cannot_swap_the_nic_for_its_own_link(node: Node, nri_harness: Harness, driver_procs) -> None:
    """Case: with NET_ADMIN in its namespace the pod renames net1 and makes a veth called net1 with
    the NIC's MAC. At stop the real NIC comes home (name, MAC, addresses, routes); the pod's veth
    stays in the pod, untouched."""
    uid = _claims(node, {"interface": {"name": "net1", "addresses": ["192.168.80.2/24"]}})
    node.driver(nri_harness, driver_procs)
    pod = node.pod_json(uid)
    assert nri_harness.cmd("run", pod=pod)["ok"]
    mac = link_facts("net1", netns=node.pod)["mac"]
    ip(node.pod, "link", "set", "net1", "down")
    ip(node.pod, "link", "set", "net1", "name", "hidden")
    ip(node.pod, "link", "add", "net1", "address", mac, "type", "veth", "peer", "name", "own1")
    ip(node.pod, "addr", "add", "192.168.80.2/24", "dev", "net1")
    assert nri_harness.cmd("stop", pod=pod)["ok"]
    assert node.snapshot() == node.before, "the real NIC is home as it was"
    impostor = link_facts("net1", netns=node.pod)
    assert impostor is not None and impostor["mac"] == mac and impostor["addresses"] == ["192.168.80.2/24"]
    assert link_facts("hidden", netns=node.pod) is None


def _vf_sysfs(root: Path, nic: str, pf_mtu: int) -> str:
    """A sysfs where ``nic`` is an SR-IOV VF whose PF ``pf0`` has MTU ``pf_mtu`` (the kernel's layout)."""
    pci = root / "devices" / "pci0000:00"
    vf, pf = pci / "0000:00:01.1", pci / "0000:00:01.0"
    (pf / "net" / "pf0").mkdir(parents=True)
    (pf / "net" / "pf0" / "mtu").write_text(f"{pf_mtu}\n")
    vf.mkdir(parents=True)
    os.symlink("../0000:00:01.0", vf / "physfn")
    (root / "class" / "net" / nic).mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.1", root / "class" / "net" / nic / "device")
    return str(root)


def test_a_vf_mtu_above_its_pfs_is_refused_before_the_move(
    node: Node, nri_harness: Harness, driver_procs, tmp_path: Path
) -> None:
    """Case: the documented VF check. A VF (nic0, by its sysfs) whose PF is at 9000, asked for 65000
    (within the VF's own maximum): refused naming the PF, before anything moves."""
    sysfs = _vf_sysfs(tmp_path / "sys", node.nics[0], 9000)
    uid = _claims(node, {"interface": {"name": "net1", "mtu": 65000}})
    node.driver(nri_harness, driver_procs, sysfs_root=sysfs)
    res = nri_harness.cmd("run", pod=node.pod_json(uid))
    assert not res["ok"] and "mtu failed" in res["error"], res
    assert "above the MTU 9000 of its PF pf0" in res["error"], res["error"]
    assert node.snapshot() == node.before


def test_an_mtu_below_ipv6s_minimum_for_a_nic_given_its_host_ipv6_addresses_is_refused(
    node: Node, nri_harness: Harness, driver_procs
) -> None:
    """The claim sets only an MTU below 1280; the NIC's host addresses, copied into the pod, include
    IPv6, which the kernel would refuse on such a link: refused before the move."""
    ip(node.host, "-6", "addr", "add", "fd60::1/64", "dev", node.nics[0], "nodad")
    node.before = node.snapshot()
    uid = _claims(node, {"interface": {"name": "net1", "mtu": 1200}})
    node.driver(nri_harness, driver_procs)
    res = nri_harness.cmd("run", pod=node.pod_json(uid))
    assert not res["ok"] and "mtu failed" in res["error"] and "IPv6 minimum" in res["error"], res
    assert node.snapshot() == node.before
