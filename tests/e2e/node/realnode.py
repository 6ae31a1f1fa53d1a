"""The real nodes the end-to-end tests share (see conftest.py for the package fixture).

A cluster of its own (random name and address range), so it never collides with a person's
``python -m devcluster up`` or another test run on the same machine. Tests that need one node
use node 0 (``RealNode.node``); the others name a node by index. Torn down with
``devcluster.cluster.down`` at the end, after which the fixture checks that nothing is left on
the host: no process naming its directory, no host link, no mount, no cgroup, no network
namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import string
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import fabric, node_host, node_ns
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.node_layout import DEFAULT_BASE, DEFAULT_IP_FAMILY, DEFAULT_RUNTIME, NodeLayout, NodeSpec
from devcluster.cluster.pods import Kubectl
from driver.checkpoint import journal
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound
from tests.plugins.least_privilege import forbidden_lines

E2E_MARKS = [pytest.mark.node, pytest.mark.root, pytest.mark.slow]
REUSE_ENV = "DRANET_E2E_CLUSTER"  # the name of a running `devcluster up` cluster to test instead


@dataclass
class RealNode:
    """A running cluster of real nodes, and helpers the tests share (``node``: node 0's name)."""

    layout: NodeLayout
    state: cluster.ClusterState
    kube: KubeClient
    kubectl: Kubectl

    @property
    def node(self) -> str:
        return self.layout.node_name

    def spec(self, node: int = 0) -> NodeSpec:
        return self.layout.node(node)

    def driver_pod(self, node: int = 0) -> dict[str, Any]:
        """The running dranet DaemonSet pod of ``node``."""
        pods = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
            query={
                "labelSelector": "app.kubernetes.io/component=driver",
                "fieldSelector": f"spec.nodeName={self.spec(node).name}",
            },
        )["items"]
        running = [
            p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        assert running, f"no running driver pod on {self.spec(node).name}: {[p['metadata']['name'] for p in pods]}"
        return running[0]

    def driver_logs(self, node: int = 0) -> str:
        """Logs of every driver container that ran so far on ``node`` (current and previous)."""
        pod = self.driver_pod(node)["metadata"]["name"]
        out = self.kubectl.run("logs", "-n", cluster.NAMESPACE, pod, "--tail=-1")
        try:
            out = self.kubectl.run("logs", "-n", cluster.NAMESPACE, pod, "--previous", "--tail=-1") + out
        except Exception:  # noqa: BLE001 - no previous container
            pass
        return out

    def wait_driver_ready(self, timeout: float = 120, node: int = 0) -> dict[str, Any]:
        """Wait until the DaemonSet's pod on ``node`` is Ready (after a restart)."""

        def ready() -> dict[str, Any] | None:
            try:
                pod = self.driver_pod(node)
            except AssertionError:
                return None
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            return pod if conds.get("Ready") == "True" else None

        return wait_for(ready, timeout, 0.5, f"the driver pod on {self.spec(node).name} Ready")

    def driver_pids(self, node: int = 0) -> list[int]:
        """Host PIDs of the running ``dranet run`` processes of ``node`` (in its cgroup tree)."""
        out = []
        for pid in node_host.cgroup_pids(self.spec(node).cgroup_root):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                b"run" in cmd
                and any(a.endswith(b"/dranet") for a in cmd)
                and any(a.startswith(b"--node-name") for a in cmd)
            ):
                out.append(pid)
        return out

    def kill_driver(self, meanwhile: Callable[[], object] | None = None, node: int = 0) -> None:
        """kill -9 the driver of ``node``, run ``meanwhile`` (before its container is restarted),
        and wait until it is back: a new process, in a restarted container that is Ready again (the
        pod's status alone can still say Ready from before the kill)."""
        (pid,) = self.driver_pids(node)
        restarts = self.driver_pod(node)["status"]["containerStatuses"][0]["restartCount"]
        os.kill(pid, signal.SIGKILL)
        if meanwhile is not None:
            meanwhile()
        wait_for(
            lambda: self.driver_pod(node)["status"]["containerStatuses"][0]["restartCount"] > restarts,
            60,
            0.2,
            "the driver container restarted",
        )
        self.wait_driver_ready(node=node)
        wait_for(lambda: self.driver_pids(node) and pid not in self.driver_pids(node), 30, 0.2, "a new driver process")

    def driver_usage(self, node: int = 0) -> tuple[int, int]:
        """(RSS in KiB, open fds) of the one running driver process of ``node``."""
        (pid,) = self.driver_pids(node)
        rss = next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))

    def checkpoint(self, node: int = 0) -> dict[str, Any]:
        """The driver's prepared claims as saved (host side of the node's stateDir): the snapshot
        with the journal's records for it applied, as the driver reads them at start."""
        state_dir = self.spec(node).driver_claims_dir
        path, journal_path = state_dir / "checkpoint.json", state_dir / "checkpoint.journal"
        snapshot = path.read_bytes() if path.exists() else None
        data: dict[str, Any] = json.loads(snapshot) if snapshot else {}
        if journal_path.exists():
            data["claims"] = journal.saved_claims(snapshot, journal_path.read_bytes())
        return data

    def pod_states(self, node: int = 0) -> dict[str, Any]:
        """The driver's pod network state (host side of the node's runtimeDir)."""
        path = self.spec(node).driver_runtime_dir / "pods.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def host_nics(self, node: int = 0) -> dict[str, dict[str, Any]]:
        """The node's NICs currently in its own network namespace: name -> ``ip -j`` facts."""
        return fabric.node_nics(self.spec(node))

    def namespace(self) -> str:
        """A fresh namespace with its default service account; deleted by the caller."""
        ns = f"e2e-{secrets.token_hex(3)}"
        self.kube.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        )
        wait_for(
            lambda: self.kube.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
            30,
            0.1,
            f"namespace {ns} default service account",
        )
        return ns

    def delete_namespace(self, ns: str, timeout: float = 120) -> None:
        """Delete ``ns`` and wait until its pods and claims are gone."""
        try:
            self.kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        except KubeError as exc:
            if not isinstance(exc, NotFound):
                raise

        def gone() -> bool:
            pods = self.kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            claims = self.kube.request("GET", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims")["items"]
            return not pods and not claims

        wait_for(gone, timeout, 0.5, f"namespace {ns} emptied")


CLUSTER_SECOND_OCTETS = range(104, 128)
"""The second octets of 10/8 the clusters' ranges come from (104 to 127). A cluster puts its
gateway address on a link in the host's namespace, and the netlink/NRI tier, running beside the
cluster lane, gives NICs in that namespace addresses of its own (10.64-10.103 among them, e.g. the
shares' 10.77.0.x): a cluster drawn there made a share's address look taken by the host. No test
names an address in this range (tests/repo/test_test_tiers.py checks)."""


def random_layout(nodes: int = 2, runtime: str = DEFAULT_RUNTIME, ip_family: str = DEFAULT_IP_FAMILY) -> NodeLayout:
    """A cluster name and a /20 no other cluster on this host uses (random, checked against the
    host's routes), in ``CLUSTER_SECOND_OCTETS``."""
    for _ in range(50):
        name = "e" + "".join(random.choice(string.ascii_lowercase) for _ in range(3)) + secrets.token_hex(2)
        cidr = f"10.{random.choice(CLUSTER_SECOND_OCTETS)}.{16 * random.randint(0, 15)}.0/20"
        layout = NodeLayout(
            name=name, root=DEFAULT_BASE, nodes=nodes, cluster_cidr=cidr, runtime=runtime, ip_family=ip_family
        )
        if not fabric.overlapping_routes(layout) and not layout.base.exists():
            return layout
    raise RuntimeError("no free address range for a test cluster (50 random /20s overlap host routes)")


def leftovers(layout: NodeLayout) -> list[str]:
    """Everything of ``layout`` still on the host (empty after a clean ``down``)."""
    found = []
    pids = node_host.processes_naming(layout.base)
    found += [
        f"process {p}: {Path(f'/proc/{p}/cmdline').read_bytes()[:120]!r}" for p in pids if Path(f"/proc/{p}").exists()
    ]
    found += [f"link {layout.host_link}"] if node_host.link_exists(layout.host_link) else []
    netns = [layout.fabric_netns, *(layout.node(i).netns for i in node_ns.node_indexes(layout))]
    found += [f"netns {n}" for n in netns if Path(f"/run/netns/{n}").exists()]
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(layout.base) in line.split()[4]
    ]
    found += [
        f"cgroup {m}{layout.cgroup_root}"
        for m in node_host.cgroup_mounts()
        if (m / layout.cgroup_root.lstrip("/")).exists()
    ]
    found += [f"dir {layout.base}"] if layout.base.exists() else []
    return found


@contextlib.contextmanager
def cluster_for_tests(
    request: pytest.FixtureRequest,
    new_layout: Callable[[], NodeLayout],
    reuse: str | None = None,
    set_values: Sequence[str] = (),
) -> Iterator[RealNode]:
    """A cluster ``devcluster up`` starts from ``new_layout()`` (chart values ``set_values`` over
    the dev ones), removed at the end, after which nothing of it may be left on the host; or the
    running cluster named ``reuse``, left running.
    A 403 anywhere in the drivers' logs (current and previous container) fails the run."""
    if os.geteuid() != 0:
        pytest.skip("the real node needs root")
    if reuse:
        found = cluster.running(NodeLayout(name=reuse))
        if found is None:
            pytest.fail(f"no running cluster named {reuse!r} to test")
        layout = NodeLayout(
            name=reuse,
            nodes=found.nodes,
            cluster_cidr=found.cluster_cidr,
            runtime=found.runtime,
            ip_family=found.ip_family,
        )
        st = found
    else:
        layout = new_layout()
        t0 = time.monotonic()
        capman = request.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            with capman.global_and_fixture_disabled():  # progress lines of a cold build stay visible
                st = cluster.up(layout, set_values=set_values)
        else:
            st = cluster.up(layout, set_values=set_values)
        print(
            f"\n[real nodes] {layout.name} ({layout.nodes} nodes, {layout.runtime}) up in "
            f"{time.monotonic() - t0:.1f}s ({st.timings})"
        )
    kube = KubeClient.from_kubeconfig(st.kubeconfig)
    node = RealNode(layout, st, kube, Kubectl(Path(st.kubectl), Path(st.kubeconfig)))
    denials: list[str] = []
    try:
        yield node
        denials = [line for s in layout.all_nodes for line in forbidden_lines(node.driver_logs(s.index))]
    finally:
        if not reuse:
            report = cluster.down(layout, progress=lambda _m: None)
            left = leftovers(layout)
            assert not report.problems and not left, f"down left: {report.problems + left}"
    assert not denials, f"the driver was refused (403): {denials[:5]}"
