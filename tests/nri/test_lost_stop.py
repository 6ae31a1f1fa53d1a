"""NICs come back even when the runtime never sends StopPodSandbox (real netns and veths).

containerd (2.2, 2.3) keeps its NRI pod state in memory only; after a containerd restart it
relays neither StopPodSandbox nor RemovePodSandbox for pods created before (containerd#8426),
and its teardown then unmounts the pod's network namespace: a veth inside is destroyed, a
physical NIC falls back to the host unconfigured. Found on the real node (tests/e2e/
test_faults.py). The hooks keep the namespace of every pod holding NICs open, and the
kubelet's NodeUnprepareResources (it always comes, after the pod's sandbox is gone) returns
what is still out.
"""

from __future__ import annotations

import secrets
import subprocess
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import configure_host_nic, link_facts, pod_json, prepare_claim

pytestmark = pytest.mark.root


def _pod(uid: str, netns: str) -> api.PodSandbox:
    return json_format.ParseDict(pod_json(uid, netns), api.PodSandbox())


def test_unprepare_returns_nics_the_runtime_never_asked_back(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic, peer = netns_factory.veth()
    sub, routed = netns_factory.subnet(), netns_factory.subnet()
    configure_host_nic(nic, peer, sub.cidr(1), [[str(routed.v4), "via", sub.ip(254)]], mtu=1450)
    before = link_facts(nic)
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = secrets.token_hex(8)
    claim_uid = prepare_claim(store, uid, [{"ifname": nic}])
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
    hooks.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    assert link_facts(nic) is None and link_facts(nic, pod_ns) is not None

    # The runtime tears the sandbox down without telling us: the namespace is unmounted and
    # its last process is gone. Without the pin the veth would be destroyed right here.
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    netns_factory.namespaces.remove(pod_ns)

    claim = store.read(lambda s: s.claims[claim_uid])
    hooks.claim_unprepared(claim)
    assert link_facts(nic) == before, "the NIC must come back with its name, MTU, MAC, addresses, routes"
    assert store.read(lambda s: s.pods) == {}
    assert hooks.pins.fds == {}, "the namespace is released once its NICs are home"


def test_unprepare_after_a_normal_stop_changes_nothing(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [])
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = secrets.token_hex(8)
    claim_uid = prepare_claim(store, uid, [{"ifname": nic}])
    hooks = NRIHooks(store, host_netns="/proc/self/ns/net")
    pod = _pod(uid, f"/run/netns/{pod_ns}")
    hooks.run_pod_sandbox(pod)
    hooks.stop_pod_sandbox(pod)
    before = link_facts(nic)
    assert before is not None and hooks.pins.fds == {}
    hooks.claim_unprepared(store.read(lambda s: s.claims[claim_uid]))
    assert link_facts(nic) == before


class Unattended:
    """The hooks' status sink: what it was told of NICs of pods that ended with no driver connected."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, bool]] = []

    def pod_network_ready(self, *args: object) -> None:
        pass

    def pod_network_failed(self, *args: object) -> None:
        pass

    def nic_returned_unattended(self, pod_uid: str, claim: object, device: str, message: str, lost: bool) -> None:
        self.told.append((device, message, lost))


def test_a_veth_its_pod_ended_with_while_no_driver_ran_is_a_clean_reported_loss(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    """The driver restarted (no namespace pinned) and the pod ended meanwhile: its veth died with
    the namespace. The new driver's Synchronize (the pod is not in the runtime's list) forgets it,
    touches nothing else, and tells the claim (a PCI NIC, which comes back by itself, is restored:
    tests/inventory/test_real_pci_numa.py, in the stock-kernel tier)."""
    nic, peer = netns_factory.veth()
    configure_host_nic(nic, peer, netns_factory.subnet().cidr(1), [])
    pod_ns = netns_factory.netns()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    uid = secrets.token_hex(8)
    prepare_claim(store, uid, [{"ifname": nic, "device": "dev-veth"}])
    first = NRIHooks(store, host_netns="/proc/self/ns/net")
    first.run_pod_sandbox(_pod(uid, f"/run/netns/{pod_ns}"))
    first.pins.unpin(uid)  # the driver is gone: nothing holds the namespace
    first.close()
    subprocess.run(["ip", "netns", "del", pod_ns], check=True)
    netns_factory.namespaces.remove(pod_ns)
    sink = Unattended()
    restarted = NRIHooks(store, sink, host_netns="/proc/self/ns/net")  # type: ignore[arg-type]
    restarted.synchronize([], [])
    assert store.read(lambda s: s.pods) == {}
    ((device, message, lost),) = sink.told
    assert (device, lost) == ("dev-veth", True)
    assert "ended while no driver was connected" in message and "a virtual NIC dies with the pod's namespace" in message
