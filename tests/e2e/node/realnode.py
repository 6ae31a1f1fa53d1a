"""The real node the end-to-end tests share (see conftest.py for the session fixture).

A cluster of its own (random name, NIC prefix and pod subnet), so it never collides with a
person's ``python -m devcluster up`` on the same machine. Torn down with
``devcluster.cluster.down`` at the end of the session, after which the fixture checks that
nothing is left on the host: no process naming its directory, no veth or bridge, no mount,
no cgroup, no network namespace.
"""

from __future__ import annotations

import json
import random
import secrets
import string
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster import cluster, node_host
from devcluster.controlplane import wait_for
from devcluster.node_layout import DEFAULT_BASE, NodeLayout
from devcluster.pods import Kubectl
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound

E2E_MARKS = [pytest.mark.node, pytest.mark.root, pytest.mark.slow]


@dataclass
class RealNode:
    """A running cluster with one real node, and helpers the tests share."""

    layout: NodeLayout
    state: cluster.ClusterState
    kube: KubeClient
    kubectl: Kubectl

    @property
    def node(self) -> str:
        return self.layout.node_name

    def driver_pod(self) -> dict[str, Any]:
        """The (one) running dranet DaemonSet pod."""
        pods = self.kube.request(
            "GET",
            f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
            query={"labelSelector": "app.kubernetes.io/component=driver"},
        )["items"]
        running = [
            p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        assert running, f"no running driver pod: {[p['metadata']['name'] for p in pods]}"
        return running[0]

    def driver_logs(self) -> str:
        """Logs of every driver container that ran so far (current and previous)."""
        pod = self.driver_pod()["metadata"]["name"]
        out = self.kubectl.run("logs", "-n", cluster.NAMESPACE, pod, "--tail=-1")
        try:
            out = self.kubectl.run("logs", "-n", cluster.NAMESPACE, pod, "--previous", "--tail=-1") + out
        except Exception:  # noqa: BLE001 - no previous container
            pass
        return out

    def wait_driver_ready(self, timeout: float = 120) -> dict[str, Any]:
        """Wait until the DaemonSet's pod is Ready (after a restart)."""

        def ready() -> dict[str, Any] | None:
            try:
                pod = self.driver_pod()
            except AssertionError:
                return None
            conds = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            return pod if conds.get("Ready") == "True" else None

        return wait_for(ready, timeout, 0.5, "the driver pod Ready")

    def driver_pids(self) -> list[int]:
        """Host PIDs of the running ``dranet run`` processes (inside the node's cgroup root)."""
        out = []
        for pid in node_host.cgroup_pids(self.layout):
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

    def driver_usage(self) -> tuple[int, int]:
        """(RSS in KiB, open fds) of the one running driver process."""
        (pid,) = self.driver_pids()
        rss = next(
            int(line.split()[1])
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS:")
        )
        return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))

    def checkpoint(self) -> dict[str, Any]:
        """The driver's prepared-claims checkpoint (host side of its stateDir)."""
        path = self.layout.driver_state_dir / "checkpoint.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def pod_states(self) -> dict[str, Any]:
        """The driver's pod network state (host side of its runtimeDir)."""
        path = self.layout.driver_runtime_dir / "pods.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def host_nics(self) -> dict[str, dict[str, Any]]:
        """The node's NICs currently in the host namespace: name -> ``ip -j`` facts."""
        links = json.loads(
            subprocess.run(["ip", "-j", "-d", "addr", "show"], capture_output=True, text=True, check=True).stdout
        )
        return {link["ifname"]: link for link in links if link["ifname"] in self.layout.nics}

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


def random_layout() -> NodeLayout:
    letters = "".join(random.choice(string.ascii_lowercase) for _ in range(3))
    return NodeLayout(
        name="e" + letters + secrets.token_hex(2),
        root=DEFAULT_BASE,
        nic_prefix=f"t{letters}ib",
        pod_subnet=f"10.{random.randint(90, 99)}.{random.randint(0, 255)}.0/24",
    )


def leftovers(layout: NodeLayout) -> list[str]:
    """Everything of ``layout`` still on the host (empty after a clean ``down``)."""
    found = []
    pids = node_host.processes_naming(layout.base)
    found += [
        f"process {p}: {Path(f'/proc/{p}/cmdline').read_bytes()[:120]!r}" for p in pids if Path(f"/proc/{p}").exists()
    ]
    found += [f"link {n}" for n in (*layout.nics, layout.cni_bridge) if node_host.link_exists(n)]
    found += [f"netns {layout.fabric_netns}"] if Path(f"/run/netns/{layout.fabric_netns}").exists() else []
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
