"""Inside the runtime's budget on a real node, and no pod silently without its NICs.

- Eight one-NIC pods whose claims give new IPv6 addresses, started together: every one is Ready
  with its address usable (optimistic duplicate address detection: no hook waits for it, so the
  runtime's one-event-at-a-time NRI adaptation does not queue the pods behind each other), and no
  hook came near the runtime's 2 s.
- A pod with 64 new IPv6 addresses: all of them in the pod, its RunPodSandbox under 1 s.
- The driver's NRI connection dropped while pods start (its socket shut down from outside, the
  runtime's socket hidden for a while so it cannot reconnect at once): once it is back, each such
  pod has its NIC, its claim says its containers were created without the driver, a Warning event
  on the pod says so, and the metric counts it.

The wall-clock figures of the first two are measured by ``bench/bench_pods_together.py``; here
the hooks' own latency histogram (the driver's /metrics) bounds them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from bench.real_nodes import driver_metrics, hook_buckets
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import workload_pod
from driver.kube.client import RESOURCE_API
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    delete_pod,
    dra_conditions,
    events_for,
    nic_claim,
    nic_snapshot,
    pod_claim,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS
NRI_SOCKET = "/var/run/nri/nri.sock"
SYS_PIDFD_GETFD = 438  # x86_64 and aarch64


def _metrics(real_node: RealNode) -> str:
    return driver_metrics(real_node.kube, real_node.layout)


def _slow_hooks(real_node: RealNode, method: str, under: str) -> float:
    """How many ``method`` hooks took longer than ``under`` seconds (a bucket bound)."""
    buckets = hook_buckets(_metrics(real_node), method)
    assert buckets, "no latency histogram of the hook"
    return buckets["+Inf"] - buckets[under]


def _claimed_pod(real_node: RealNode, ns: str, name: str, nic: str, addresses: list[str]) -> None:
    real_node.kube.request(
        "POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", nic_claim(ns, name, nic, addresses)
    )
    pod = workload_pod(name, real_node.node, claim=name, namespace=ns)
    real_node.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)


def _pod_v6(real_node: RealNode, ns: str, pod: str, nic: str) -> dict[str, list[str]]:
    """CIDR -> the flags ``ip`` prints for it (tentative, optimistic, dadfailed), in the pod."""
    out = real_node.kubectl.exec(ns, pod, "ip", "-6", "addr", "show", "dev", nic)
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["inet6"] and "global" in words:
            found[words[1]] = words[words.index("global") + 1 :]
    return found


def test_eight_ipv6_pods_started_together_are_ready_with_their_addresses(real_node: RealNode, ns: str) -> None:
    nics = list(real_node.layout.nics[:8])
    before = nic_snapshot(real_node, nics)
    slow_before = _slow_hooks(real_node, "RunPodSandbox", "1.0")
    with ThreadPoolExecutor(len(nics)) as pool:
        list(pool.map(lambda i: _claimed_pod(real_node, ns, f"v6-{i}", nics[i], [f"fd{70 + i}::5/64"]), range(8)))
    for i, nic in enumerate(nics):
        wait_running(real_node, ns, f"v6-{i}", timeout=120)
        got = _pod_v6(real_node, ns, f"v6-{i}", nic)
        assert f"fd{70 + i}::5/64" in got and "dadfailed" not in got[f"fd{70 + i}::5/64"], got
        conds = dra_conditions(pod_claim(real_node, ns, f"v6-{i}"))
        assert all(c["Ready"]["status"] == "True" for c in conds.values()), conds
    assert _slow_hooks(real_node, "RunPodSandbox", "1.0") == slow_before, "a RunPodSandbox took over 1 s"
    for i in range(8):
        delete_pod(real_node, ns, f"v6-{i}")
    wait_nics_home(real_node, before)


def test_a_pod_with_sixty_four_ipv6_addresses_is_started_under_a_second(real_node: RealNode, ns: str) -> None:
    nic = real_node.layout.nics[0]
    before = nic_snapshot(real_node, [nic])
    addresses = [f"fd90::{i + 2:x}/64" for i in range(64)]
    slow_before = _slow_hooks(real_node, "RunPodSandbox", "1.0")
    _claimed_pod(real_node, ns, "many", nic, addresses)
    wait_running(real_node, ns, "many", timeout=120)
    got = _pod_v6(real_node, ns, "many", nic)
    assert set(addresses) <= set(got), sorted(set(addresses) - set(got))
    assert _slow_hooks(real_node, "RunPodSandbox", "1.0") == slow_before, "its RunPodSandbox took over 1 s"
    assert "NRI runtime connection closed" not in real_node.driver_logs()
    delete_pod(real_node, ns, "many")
    wait_nics_home(real_node, before)


def _driver_nri_fd(real_node: RealNode) -> tuple[int, int]:
    """(pid, fd) of the driver's connection to the runtime's NRI socket, found by its peer: the
    runtime's end of it is the one ``ss`` names by the socket's path."""
    out = subprocess.run(
        ["ip", "netns", "exec", real_node.spec(0).netns, "ss", "-xpn"], capture_output=True, text=True, check=True
    ).stdout
    (pid,) = real_node.driver_pids()
    # u_str ESTAB 0 0 <local address> <local inode> <peer address> <peer inode> users:(...)
    rows = [line.split() for line in out.splitlines() if line.startswith("u_str")]
    runtime_ends = {w[7] for w in rows if len(w) > 7 and w[4] in (NRI_SOCKET, NRI_SOCKET.removeprefix("/var"))}
    for w in rows:
        found = re.search(r"fd=(\d+)", " ".join(w[8:]))
        if len(w) > 7 and w[5] in runtime_ends and f"pid={pid}," in " ".join(w[8:]) and found:
            return pid, int(found.group(1))
    raise AssertionError(f"no NRI connection of the driver {pid} found in:\n{out}")


def _shut_down(pid: int, fd: int) -> None:
    """Shut the socket down as the process holds it (a copy through pidfd_getfd, Linux 5.6)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        assert mine >= 0, os.strerror(ctypes.get_errno())
        sock = socket.socket(fileno=mine)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    finally:
        os.close(pidfd)


@contextlib.contextmanager
def _runtime_socket_hidden(real_node: RealNode) -> Iterator[None]:
    """The runtime's NRI socket renamed in the node's mount namespace: a plugin cannot connect."""
    mnt = str(real_node.spec(0).mnt_ns_file)
    subprocess.run(["nsenter", f"--mount={mnt}", "mv", NRI_SOCKET, f"{NRI_SOCKET}.away"], check=True)
    try:
        yield
    finally:
        subprocess.run(["nsenter", f"--mount={mnt}", "mv", f"{NRI_SOCKET}.away", NRI_SOCKET], check=True)


def test_pods_started_while_the_nri_connection_is_down_get_their_nics_or_are_reported(
    real_node: RealNode, ns: str
) -> None:
    nics = list(real_node.layout.nics[4:6])
    before = nic_snapshot(real_node, nics)
    registered = real_node.driver_logs().count("NRI plugin registered")
    with _runtime_socket_hidden(real_node):
        _shut_down(*_driver_nri_fd(real_node))
        wait_for(lambda: "NRI runtime connection closed" in real_node.driver_logs(), 30, 0.2, "the driver saw it")
        for i, nic in enumerate(nics):
            _claimed_pod(real_node, ns, f"away-{i}", nic, [f"10.{200 + i}.0.5/24"])
        for i in range(len(nics)):
            wait_running(real_node, ns, f"away-{i}", timeout=120)
            out = real_node.kubectl.exec(ns, f"away-{i}", "ip", "-o", "link")
            assert nics[i] not in out, "the runtime started it without the driver: no NIC yet"
    wait_for(
        lambda: real_node.driver_logs().count("NRI plugin registered") > registered, 60, 0.5, "the driver reconnected"
    )
    for i, nic in enumerate(nics):
        name = f"away-{i}"

        def handled(name: str = name, nic: str = nic) -> bool:
            inside = nic in real_node.kubectl.exec(ns, name, "ip", "-o", "link")
            conds = dra_conditions(pod_claim(real_node, ns, name))
            return inside and any(c.get("Ready", {}).get("status") == "False" for c in conds.values())

        wait_for(handled, 30, 0.5, f"{name}: its NIC in the pod and its claim reporting it")
        ready = next(iter(dra_conditions(pod_claim(real_node, ns, name)).values()))["Ready"]
        assert ready["reason"] == "ContainerSetupFailed", ready
        assert "created while the driver was not connected to the container runtime" in ready["message"], ready
        assert any("not connected to the container runtime" in e for e in events_for(real_node, ns, name))
    problems = re.findall(r'pod_network_problems_total\{reason="started-without-driver"\} (\S+)', _metrics(real_node))
    assert problems and float(problems[0]) >= len(nics), problems
    for i in range(len(nics)):
        delete_pod(real_node, ns, f"away-{i}")
    wait_nics_home(real_node, before)
