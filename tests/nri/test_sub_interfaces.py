"""Shares of a NIC as sub-interfaces, on real namespaces: each pod gets its own macvlan of the NIC,
named, addressed and routed by its claim; the NIC never moves and keeps its host configuration."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from driver.nri.shares import SUB_INTERFACE
from driver.nri.step_clock import RUN_STEPS, STOP_STEPS
from harness.netns import NetnsFactory
from harness.nri import configure_host_nic, link_facts, pod_json, prepare_claim

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def _pod(uid: str, netns: str) -> api.PodSandbox:
    return json_format.ParseDict(pod_json(uid, netns), api.PodSandbox())


def _links(netns: str) -> dict[str, dict]:
    out = subprocess.run(["ip", "-j", "-d", "-n", netns, "addr"], capture_output=True, text=True, check=True)
    return {link["ifname"]: link for link in json.loads(out.stdout)}


def _udp_echo(sender_ns: str, listener_ns: str, address: str) -> bytes:
    """One UDP datagram from one pod's namespace to another's address, as the listener got it."""
    listen = (
        "import socket,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
        f"s.bind(('{address}',9999));s.settimeout(60);print('ready',flush=True);"
        "sys.stdout.buffer.write(s.recvfrom(64)[0])"
    )
    send = (
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
        f"[s.sendto(b'hello',('{address}',9999)) for _ in range(3)]"
    )
    listener = subprocess.Popen(
        ["ip", "netns", "exec", listener_ns, sys.executable, "-c", listen], stdout=subprocess.PIPE
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline() == b"ready\n"
        subprocess.run(["ip", "netns", "exec", sender_ns, sys.executable, "-c", send], check=True, timeout=60)
        out, _ = listener.communicate(timeout=70)  # the sender is a Python start: seconds under emulation
        return out
    finally:
        listener.kill()
        listener.wait()


def _config(name: str, address: str, mtu: int = 1400) -> dict:
    iface = {"name": name, "addresses": [address], "mtu": mtu}
    return {"opaque": [{"interface": iface, "routes": [{"destination": "10.99.0.0/16", "scope": 253}]}]}


def test_each_share_is_a_sub_interface_the_nic_stays_and_the_pods_reach_each_other(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, peer = netns_factory.veth()
    sub, routed = netns_factory.subnet(), netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [[str(routed.v4), "via", sub.ip(254)]], mtu=1500)
    before = link_facts(nic)
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None})
    pods = []
    for i in range(3):
        pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
        device = {"ifname": nic, "device": "shared-nic", "share_id": f"share-{i}"}
        prepare_claim(store, uid, [{**device, "config": _config("net1", f"10.77.0.{i + 1}/24")}])
        pod = _pod(uid, f"/run/netns/{pod_ns}")
        hooks.run_pod_sandbox(pod)
        pods.append((pod, pod_ns))
    assert link_facts(nic) == before, "the NIC stays on the host, untouched"
    macs = set()
    for i, (pod, pod_ns) in enumerate(pods):
        sub = _links(pod_ns)["net1"]
        assert sub["linkinfo"]["info_kind"] == "macvlan" and sub["mtu"] == 1400
        assert [a["local"] for a in sub["addr_info"] if a["family"] == "inet"] == [f"10.77.0.{i + 1}"]
        macs.add(sub["address"])
        state = store.read(lambda s, u=pod.uid: s.pods[u])
        [m] = state.devices
        assert m.step == "in-pod" and m.records[SUB_INTERFACE]["parent"] == nic and m.pod_index == sub["ifindex"]
    assert len(macs) == 3, "each pod has its own MAC"
    # macvlan bridge mode: pods on one NIC reach each other through it.
    assert _udp_echo(pods[0][1], pods[1][1], "10.77.0.2") == b"hello"
    for pod, pod_ns in pods:
        hooks.stop_pod_sandbox(pod)
        assert "net1" not in _links(pod_ns)
    assert link_facts(nic) == before and store.read(lambda s: s.pods) == {}


def test_two_shares_of_one_nic_in_one_pod_and_a_name_the_pod_has_are_refused(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [])
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None})
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    twice = [
        {"ifname": nic, "device": "shared-nic", "share_id": "a", "config": _config("net1", "10.78.0.1/24")},
        {"ifname": nic, "device": "shared-nic", "share_id": "b", "config": _config("net2", "10.78.0.2/24")},
    ]
    prepare_claim(store, uid, twice)
    with pytest.raises(HookError, match="two shares of this NIC"):
        hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    assert set(_links(pod_ns)) == {"lo"} and store.read(lambda s: s.pods) == {}


def test_a_gone_namespace_took_its_sub_interface_along(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [])
    before = link_facts(nic)
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None})
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    claim = prepare_claim(store, uid, [{"ifname": nic, "device": "shared-nic", "share_id": "x"}])
    hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    assert nic in _links(pod_ns), "no name in the claim: the sub-interface is named like its NIC"
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    netns_factory.namespaces.remove(pod_ns)
    hooks.claim_unprepared(store.read(lambda s: s.claims[claim]))
    assert store.read(lambda s: s.pods) == {} and hooks.pins.fds == {}
    assert link_facts(nic) == before


def _killed_at(step: str, work: Callable[[NRIHooks], None], store: CheckpointStore, nic: str) -> int:
    """Run ``work`` in a child whose hooks ``os._exit(137)`` right after ``step`` (kill -9 there)."""
    pid = os.fork()
    if pid == 0:  # the child: a driver that dies at the step
        code = 0
        try:
            work(NRIHooks(store, host_netns="/proc/self/ns/net", fault_after=step, pools={nic: None}))
        except BaseException:  # noqa: BLE001 - the child reports by exit code only
            code = 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.parametrize("pooled", [False, True], ids=["claim-address", "pool-lease"])
@pytest.mark.parametrize("step", [s.format(i=0) for s in RUN_STEPS + STOP_STEPS])
def test_killed_after_every_step_no_sub_interface_is_left_and_the_nic_is_untouched(
    step: str, pooled: bool, netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, peer = netns_factory.veth()
    sub, routed = netns_factory.subnet(), netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [[str(routed.v4), "via", sub.ip(254)]])
    before = link_facts(nic)
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    device = {"ifname": nic, "device": "shared-nic", "share_id": "s", "config": _config("net1", "10.79.0.1/24")}
    if pooled:  # no address in the claim: a lease of the NIC's subnet (its pool), which must not leak either
        device["config"] = {"opaque": [{"interface": {"name": "net1"}}]}
    prepare_claim(store, uid, [device])
    pod = _pod(uid, f"/run/netns/{pod_ns}")
    if step.startswith("stop:"):
        NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None}).run_pod_sandbox(pod)
        code = _killed_at(
            step,
            lambda h: h.stop_pod_sandbox(pod),
            CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run")),
            nic,
        )
    else:
        code = _killed_at(step, lambda h: h.run_pod_sandbox(pod), store, nic)
    assert code == 137, f"the driver was not killed at {step}"
    # The restarted driver: the runtime lists the pod (alive), the hook it died in never finished.
    restarted = NRIHooks(
        CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run")),
        host_netns="/proc/self/ns/net",
        pools={nic: None},
    )
    restarted.synchronize([pod], [])
    state = restarted.store.read(lambda s: s.pods.get(uid))
    if step == "run:committed":  # done before the kill: the pod keeps its sub-interface, recorded
        assert state is not None and "net1" in _links(pod_ns)
        restarted.stop_pod_sandbox(pod)
    assert set(_links(pod_ns)) == {"lo"}, f"killed after {step}: a sub-interface was left in the pod"
    assert restarted.store.read(lambda s: s.pods) == {}
    assert link_facts(nic) == before, "the NIC is never touched"


def _roce_sysfs(root: Path, address: str) -> str:
    """A RoCE device mlx5_0 whose port's GID table holds the host's IPv6 link-local GID (index 0, 1)
    and the IPv4 GIDs of the given sub-interface address (index 2 RoCE v1, 3 RoCE v2)."""
    port = root / "class/infiniband/mlx5_0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs/types").mkdir(parents=True)
    (port / "link_layer").write_text("Ethernet\n")
    octets = [int(p) for p in address.split(".")]
    mapped = f"0000:0000:0000:0000:0000:ffff:{octets[0]:02x}{octets[1]:02x}:{octets[2]:02x}{octets[3]:02x}"
    table = ["fe80:0000:0000:0000:0000:00ff:fe00:0001"] * 2 + [mapped] * 2
    for i, (gid, kind) in enumerate(zip(table, ["IB/RoCE v1", "RoCE v2", "IB/RoCE v1", "RoCE v2"], strict=True)):
        (port / "gids" / str(i)).write_text(gid + "\n")
        (port / "gid_attrs/types" / str(i)).write_text(kind + "\n")
    return str(root)


def test_every_pod_sharing_an_rdma_nic_gets_its_devices_and_the_gid_of_its_own_address(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [])
    sysfs = _roce_sysfs(tmp_path / "sys", "10.80.0.1")
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    rdma = {"rdma_device": "mlx5_0", "char_devices": [{"path": "/dev/infiniband/uverbs0", "major": 231, "minor": 192}]}
    share = {"ifname": nic, "device": "shared", **rdma}
    pods = []
    for i, address in enumerate(("10.80.0.1/24", "10.80.0.2/24")):
        uid, pod_ns = secrets.token_hex(8), netns_factory.netns()
        prepare_claim(store, uid, [{**share, "share_id": f"s{i}", "config": _config("net1", address)}])
        pods.append(_pod(uid, f"/run/netns/{pod_ns}"))
    settled: list[str] = []  # the daemon's device metadata sink waits here for the pod's rewrite
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", sysfs_root=sysfs, before_containers=settled.append)
    envs = []
    for pod in pods:
        hooks.run_pod_sandbox(pod)
        adjust = hooks.create_container(pod, api.Container(id="c", name="c"))
        # and the host's connection manager when it has one (rdma_ucm loaded: a node with RDMA does)
        rdma_cm = ["/dev/infiniband/rdma_cm"] if os.path.exists("/dev/infiniband/rdma_cm") else []
        assert adjust is not None and [d.path for d in adjust.linux.devices] == ["/dev/infiniband/uverbs0", *rdma_cm]
        envs.append({e.key: e.value for e in adjust.env})
    assert settled == [pod.uid for pod in pods]
    assert envs[0]["NCCL_IB_HCA"] == envs[1]["NCCL_IB_HCA"] == "=mlx5_0"
    assert envs[0]["NCCL_IB_GID_INDEX"] == "3", "the RoCE v2 GID of the pod's own address"
    assert "NCCL_IB_GID_INDEX" not in envs[1], "no GID for that address: NCCL chooses"
    for pod in pods:
        hooks.stop_pod_sandbox(pod)
    # In exclusive RDMA mode an RDMA device is in one namespace at a time: a share is refused.
    exclusive = NRIHooks(store, host_netns="/proc/self/ns/net", sysfs_root=sysfs, rdma_exclusive=True)
    with pytest.raises(HookError, match="RDMA namespace mode is exclusive"):
        exclusive.run_pod_sandbox(pods[0])
    assert store.read(lambda s: s.pods) == {}


def test_a_lost_pod_state_finds_the_sub_interface_and_its_lease_again(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """pods.json lost: Synchronize finds the pod's sub-interface (the kind asked, its NIC the
    parent), records it with its address as its lease, and the return deletes it; the NIC is never
    mistaken for a NIC the pod holds."""
    nic, peer = netns_factory.veth()
    sub = netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [])
    before = link_facts(nic)
    pod_ns, uid = netns_factory.netns(), secrets.token_hex(8)
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    prepare_claim(store, uid, [{"ifname": nic, "device": "shared", "share_id": "s"}])
    pod = _pod(uid, f"/run/netns/{pod_ns}")
    NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None}).run_pod_sandbox(pod)
    store.update(lambda s: s.pods.clear())  # the pod state is lost
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None})
    hooks.synchronize([pod], [])
    [m] = store.read(lambda s: s.pods[uid].devices)
    assert m.records[SUB_INTERFACE]["lease"] == sub.cidr(2) and m.records[SUB_INTERFACE]["parent"] == nic
    hooks.stop_pod_sandbox(pod)
    assert set(_links(pod_ns)) == {"lo"} and link_facts(nic) == before


def test_a_share_is_planned_against_its_nics_limits_and_refused_in_the_drivers_words(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """What the kernel would refuse with its own words ("Invalid argument" at create, "Address already
    in use" at link-up) is refused before anything is made, naming the field: an MTU above the
    NIC's, the NIC's own MAC, another share's MAC (naming its pod), a MAC for an ipvlan."""
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [], mtu=1500)
    before = link_facts(nic)
    assert before is not None
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net", pools={nic: None})

    def share(uid: str, interface: dict[str, object]) -> HookError | None:
        pod = _pod(uid, f"/run/netns/{netns_factory.netns()}")
        config = {"opaque": [{"interface": {"name": "net1", **interface}}]}
        prepare_claim(store, uid, [{"ifname": nic, "device": "shared-nic", "share_id": uid, "config": config}])
        try:
            hooks.run_pod_sandbox(pod)
        except HookError as exc:
            return exc
        return None

    too_big = share("mtu", {"mtu": 65000})
    assert too_big is not None and str(too_big).endswith(
        f"mtu failed: interface.mtu: 65000 is above the MTU 1500 of {nic}, the NIC this macvlan shares"
    )
    parents = share("parent-mac", {"hardwareAddr": str(before["mac"])})
    assert parents is not None and str(parents).endswith(
        f"mac failed: interface.hardwareAddr: {before['mac']} is the MAC of {nic}, the NIC this macvlan shares"
    )
    assert share("first", {"hardwareAddr": "02:00:00:00:21:01"}) is None
    again = share("second", {"hardwareAddr": "02:00:00:00:21:01"})
    assert again is not None and "is the MAC of another share of" in str(again) and "default/pod-first" in str(again)
    ipvlan = share("ipvlan", {"type": "ipvlan", "hardwareAddr": "02:00:00:00:21:02"})
    assert ipvlan is not None and "interface.hardwareAddr: an ipvlan has the MAC of its NIC" in str(ipvlan)
    assert link_facts(nic) == before, "the NIC untouched"
    assert set(store.read(lambda s: list(s.pods))) == {"first"}, "only the share that was made has state"
