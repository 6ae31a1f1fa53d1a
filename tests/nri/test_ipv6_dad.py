"""IPv6 duplicate address detection through the real hooks: a pod's containers start with every IPv6
address of its NICs bindable, and RunPodSandbox never waits for the detection. The host's own
addresses (carried in, and back home) skip it; a claim's new address is detected optimistically
(bindable at once) and followed in the background (:mod:`driver.nri.dad_watch`): one in use on the
link keeps the pod's containers from starting, naming the address, and its claim says so. Where the
kernel cannot add it optimistically, the pod's containers wait (briefly) for the detection."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.nic_settings import sysctls
from driver.nri.claim_reports import HookError
from driver.nri.dad_watch import CONTAINER_WAIT_S
from harness.netns import NetnsFactory
from harness.nri import link_facts, prepare_claim
from tests.support.hook_node import Node, ipj, sh, sysctl

pytestmark = [pytest.mark.root, pytest.mark.kernel]


def _v6(netns: str, dev: str) -> dict[str, dict[str, object]]:
    """The link's global IPv6 addresses (CIDR) with what ``ip -j`` says of them."""
    (link,) = ipj(netns, "-6", "addr", "show", "dev", dev)
    return {f"{a['local']}/{a['prefixlen']}": a for a in link["addr_info"] if a.get("scope") == "global"}


def _bind(netns: str, *addresses: str) -> subprocess.CompletedProcess[str]:
    code = "import socket,sys\nfor a in sys.argv[1:]: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).bind((a, 0))"
    cmd = ["ip", "netns", "exec", netns, "python3", "-c", code, *addresses]
    return subprocess.run(cmd, capture_output=True, text=True)


def _container() -> api.Container:
    return json_format.ParseDict({"id": "c1", "name": "main"}, api.Container())


def _settled(netns: str, dev: str, cidr: str, timeout: float = 5.0) -> dict[str, object]:
    """The address once the kernel decided (not tentative any more, or found in use)."""
    deadline = time.monotonic() + timeout
    while True:
        got = _v6(netns, dev)[cidr]
        if not got.get("tentative") or got.get("dadfailed") or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


class Sink:
    """Records the hooks' status reports."""

    def __init__(self) -> None:
        self.failed: list[tuple[str, str, str, str]] = []
        self.ready: list[str] = []

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[Any]) -> None:
        self.ready.append(pod_uid)

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        self.failed.append((pod_uid, device, step, message))

    def nic_returned_unattended(self, *args: object, **kwargs: object) -> None:
        pass


def test_a_claims_ipv6_address_is_bindable_at_once_and_the_hook_does_not_wait_for_detection(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    node.run({"addresses": ["fd61::2/64"]})
    # Followed first, the address read after: the follower lets a pod go only once the kernel has
    # settled its address, so a tentative address read after means it was followed (on a slow
    # guest the detection may end between the two reads, never the other way round).
    followed = node.hooks.dad.pending()
    got = _v6(node.pod_ns, node.nic)
    assert sysctl(node.pod_ns, f"ipv6/conf/{node.nic}/optimistic_dad") == 1
    if got["fd61::2/64"].get("tentative"):
        # Still under detection when the hook returned (it did not wait), and optimistic: usable now.
        assert got["fd61::2/64"].get("optimistic"), got
        assert followed == 1
    # else: a slow guest's hook outlasted the detection itself
    bound = _bind(node.pod_ns, "fd61::2")
    assert bound.returncode == 0, bound.stderr
    assert node.hooks.dad.wait(node.uid, timeout=0), "optimistic: the containers need not wait"
    node.hooks.create_container(node.pod, _container())  # nothing to refuse
    settled = _settled(node.pod_ns, node.nic, "fd61::2/64")
    assert not settled.get("tentative") and not settled.get("dadfailed"), settled
    deadline = time.monotonic() + 5
    while node.hooks.dad.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.hooks.dad.pending() == 0, "the detection's outcome was followed to its end"
    assert node.hooks.dad.failure(node.uid) is None
    node.hooks.stop_pod_sandbox(node.pod)
    node.hooks.close()


def test_the_hosts_ipv6_address_is_usable_at_once_in_the_pod_and_back_home(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    sh(node.host, "-6", "addr", "add", "fd62::2/64", "dev", node.nic, "nodad")
    before = link_facts(node.nic, node.host)
    prepare_claim(node.store, node.uid, [{"ifname": node.nic}])
    node.hooks.run_pod_sandbox(node.pod)
    got = _v6(node.pod_ns, node.nic)
    # Added without detection: nothing followed, and bindable at once.
    assert "fd62::2/64" in got and not got["fd62::2/64"].get("tentative") and got["fd62::2/64"].get("nodad"), got
    assert node.hooks.dad.pending() == 0
    assert _bind(node.pod_ns, "fd62::2").returncode == 0
    node.hooks.stop_pod_sandbox(node.pod)
    home = _v6(node.host, node.nic)
    assert not home["fd62::2/64"].get("tentative"), home
    assert _bind(node.host, "fd62::2").returncode == 0
    assert link_facts(node.nic, node.host) == before


def test_an_ipv6_address_in_use_on_the_link_keeps_the_containers_from_starting(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    sink = Sink()
    problems: list[str] = []
    node.hooks.status = sink
    node.hooks.on_problem = problems.append
    sh(node.fabric, "-6", "addr", "add", "fd63::2/64", "dev", node.peer, "nodad")
    before = link_facts(node.nic, node.host)
    try:
        node.run({"addresses": ["fd63::2/64"]})  # the pod starts: detection goes on without it
    except HookError as exc:
        # A slow machine (a guest under emulation) can see the outcome before the hook ends: then
        # the pod is refused at once, its NIC home, as a failed RunPodSandbox is.
        assert "address failed: interface.addresses: fd63::2/64 is in use on the link" in str(exc), exc
        assert [(u, st) for u, _, st, _ in sink.failed] == [(node.uid, "address")]
        assert link_facts(node.nic, node.host) == before and node.store.read(lambda s: node.uid not in s.pods)
        node.hooks.close()
        return
    assert sink.ready == [node.uid]
    deadline = time.monotonic() + 5
    while not sink.failed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.failed, "the duplicate was reported"
    pod_uid, device, step, message = sink.failed[0]
    assert (pod_uid, device, step) == (
        node.uid,
        node.store.read(lambda s: s.pods[node.uid].devices[0].device),
        "address",
    )
    assert "fd63::2/64 is in use on the link" in message and "IPv6 duplicate address detection" in message
    assert problems == ["ipv6-address-in-use"]
    with pytest.raises(HookError) as info:
        node.hooks.create_container(node.pod, _container())
    assert "address failed: interface.addresses: fd63::2/64 is in use on the link" in str(info.value), info.value
    assert "containers do not start" in str(info.value)
    node.hooks.stop_pod_sandbox(node.pod)
    assert link_facts(node.nic, node.host) == before, "the NIC is back home as it was"
    assert node.store.read(lambda s: node.uid not in s.pods)
    assert node.hooks.dad.failure(node.uid) is None, "forgotten with the pod"
    node.hooks.close()


def test_where_the_kernel_cannot_detect_optimistically_the_containers_wait_for_detection(
    netns_factory: NetnsFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = sysctls.write

    def refuse_optimistic(ns_fd: int, ifname: str, values: dict[str, int], **kwargs: Any) -> None:
        if values == sysctls.OPTIMISTIC_DAD:
            raise sysctls.SysctlError(f"/proc/sys/net/ipv6/conf/{ifname}/optimistic_dad: no such setting")
        real_write(ns_fd, ifname, values, **kwargs)

    monkeypatch.setattr(sysctls, "write", refuse_optimistic)
    node = Node(netns_factory, tmp_path)
    node.run({"addresses": ["fd64::2/64"]})
    got = _v6(node.pod_ns, node.nic)["fd64::2/64"]
    assert got.get("tentative") and not got.get("optimistic"), got
    bound = _bind(node.pod_ns, "fd64::2")
    # Unless the detection ended meanwhile (a slow guest), such an address cannot be bound yet.
    settled = not _v6(node.pod_ns, node.nic)["fd64::2/64"].get("tentative")
    assert bound.returncode != 0 or settled, "a tentative address without the flag cannot be bound"
    start = time.monotonic()
    node.hooks.create_container(node.pod, _container())
    waited = time.monotonic() - start
    got = _v6(node.pod_ns, node.nic)["fd64::2/64"]
    if got.get("tentative"):  # the kernel took longer than the containers' wait: they start anyway
        assert waited >= CONTAINER_WAIT_S * 0.9
    else:
        assert _bind(node.pod_ns, "fd64::2").returncode == 0
    node.hooks.stop_pod_sandbox(node.pod)
    node.hooks.close()


def test_sixty_four_new_ipv6_addresses_are_bindable_when_the_hook_returns(
    netns_factory: NetnsFactory, tmp_path: Path
) -> None:
    node = Node(netns_factory, tmp_path)
    addresses = [f"fd65::{i + 2:x}/64" for i in range(64)]
    node.run({"addresses": addresses})
    got = _v6(node.pod_ns, node.nic)
    assert set(addresses) <= set(got)
    assert all(got[a].get("optimistic") or not got[a].get("tentative") for a in addresses), got
    bound = _bind(node.pod_ns, *(a.split("/")[0] for a in addresses))
    assert bound.returncode == 0, bound.stderr
    node.hooks.stop_pod_sandbox(node.pod)
    node.hooks.close()
