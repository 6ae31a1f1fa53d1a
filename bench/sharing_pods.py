"""Pod starts on a running dev cluster whose ib0 is shared: the pod part of ``bench/bench_sharing.py``.

Arms, interleaved run by run: ``sub-interface`` (a 1% share of ib0), ``whole-nic`` (ib1, not
shared, moved in whole), ``no-claim``. Then ``load`` pods holding 1% shares of the shared NICs at
once: creation -> all Ready, one more share's start under that load, and the driver's RSS.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from bench.bench_pod_start import NAMESPACE, start_once
from bench.stats import pct
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster import node_host
from devcluster.cluster.controlplane import create_objects, wait_for
from devcluster.cluster.node_layout import NodeLayout
from devcluster.cluster.pods import workload_pod
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, KubeError
from driver.model.device import BANDWIDTH_CAPACITY


def _template(name: str, expression: str, bandwidth: str | None) -> dict[str, Any]:
    request: dict[str, Any] = {"deviceClassName": "dranet.net", "selectors": [{"cel": {"expression": expression}}]}
    if bandwidth:
        request["capacity"] = {"requests": {BANDWIDTH_CAPACITY: bandwidth}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": request}]}}},
    }


def _shared_step(kube: KubeClient, node: str) -> str:
    """The bandwidth step (1%) of the node's shared ib0, from its slice."""
    for s in kube.request("GET", f"{RESOURCE_API}/resourceslices")["items"]:
        if s["spec"].get("nodeName") != node or s["spec"]["driver"] != "dra.net":
            continue
        for d in s["spec"].get("devices") or []:
            if d["attributes"].get("dra.net/ifName", {}).get("string") == "ib0" and d.get("allowMultipleAllocations"):
                return str(d["capacity"][BANDWIDTH_CAPACITY]["requestPolicy"]["validRange"]["step"])
    raise SystemExit("ib0 is not published shared: up the cluster with --set sharing.filter=...")


def _driver_rss_mb(layout: NodeLayout) -> float:
    for pid in node_host.cgroup_pids(layout.node(0).cgroup_root):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"run" in cmd and any(a.endswith(b"/dranet") for a in cmd):
                status = Path(f"/proc/{pid}/status").read_text().splitlines()
                return next(int(x.split()[1]) for x in status if x.startswith("VmRSS:")) / 1024
        except OSError:
            continue
    return float("nan")


def run_pods(name: str, runs: int, load: int) -> None:
    st = cluster.running(NodeLayout(name=name))
    if st is None:
        raise SystemExit(f"no running devcluster {name!r}")
    layout = NodeLayout(name=name, nodes=st.nodes, cluster_cidr=st.cluster_cidr)
    kube = KubeClient.from_kubeconfig(st.kubeconfig)
    node = layout.node_name
    try:
        kube.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
    except Conflict:
        pass
    wait_for(lambda: kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"), 30, 0.1, "sa")
    step = _shared_step(kube, node)
    templates = [
        _template("share-ib0", 'device.attributes["dra.net"].ifName == "ib0"', step),
        _template("whole-ib1", 'device.attributes["dra.net"].ifName == "ib1"', None),
        _template("share-any", 'device.attributes["dra.net"].rdma == true', step),
    ]
    for t in templates:
        try:
            create_objects(kube, [t], NAMESPACE)
        except KubeError as exc:
            if not isinstance(exc, Conflict):
                raise
    if runs:
        _interleaved(kube, node, runs)
    if load:
        _under_load(kube, layout, node, load)


def _interleaved(kube: KubeClient, node: str, runs: int) -> None:
    arms = {"sub-interface": "share-ib0", "whole-nic": "whole-ib1", "no-claim": None}
    for arm, tmpl in arms.items():  # one-time costs (image, caches): not counted
        start_once(kube, node, f"warm-{arm}", tmpl)
    results: dict[str, list[float]] = {k: [] for k in arms}
    for i in range(runs):
        for arm, tmpl in list(arms.items()) if i % 2 == 0 else list(reversed(arms.items())):
            results[arm].append(1000 * start_once(kube, node, f"{arm}-{i}", tmpl))
    print(f"\npod start, creation -> Ready (ms), {runs} runs per arm, interleaved:")
    for arm, ms in results.items():
        print(f"  {arm:<14} median {statistics.median(ms):7.1f}   p99 {pct(ms, 99):7.1f}")
    base = statistics.median(results["no-claim"])
    for arm in ("sub-interface", "whole-nic"):
        print(f"  {arm} - no-claim: median +{statistics.median(results[arm]) - base:.1f} ms")


def _under_load(kube: KubeClient, layout: NodeLayout, node: str, load: int) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    rss0 = _driver_rss_mb(layout)
    t0 = time.monotonic()
    names = [f"load-{i}" for i in range(load)]
    for n in names:
        kube.request("POST", path, workload_pod(n, node, "share-any", namespace=NAMESPACE))

    def ready() -> bool:
        pods = kube.request("GET", path, query={"labelSelector": ""})["items"]
        up = [p for p in pods if p["metadata"]["name"].startswith("load-") and _is_ready(p)]
        return len(up) == load

    try:
        wait_for(ready, 60 + 10 * load, 0.5, f"{load} sharing pods Ready")
        all_ready = time.monotonic() - t0
        rss = _driver_rss_mb(layout)
        print(
            f"\n{load} pods sharing the shared NICs: all Ready in {all_ready:.1f} s "
            f"({1000 * all_ready / load:.0f} ms a pod)"
        )
        print(f"driver RSS {rss0:.1f} MiB before -> {rss:.1f} MiB with {load} shares")
        # Any shared NIC with room left (one may be full: its dra.net/interfaces bound).
        ms = [1000 * _start_among_others(kube, node, f"under-load-{i}") for i in range(5)]
        print(f"one more share's start under that load: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms")
    finally:
        for n in names:
            kube.request("DELETE", f"{path}/{n}")
        wait_for(lambda: not kube.request("GET", path)["items"], 60 + 5 * load, 0.5, "load pods deleted")


def _start_among_others(kube: KubeClient, node: str, name: str) -> float:
    """Seconds from creation to Ready of one more sharing pod while the load's pods run; then
    deleted (and gone) again, its share free."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    t0 = time.monotonic()
    kube.request("POST", path, workload_pod(name, node, "share-any", namespace=NAMESPACE))
    wait_for(lambda: _is_ready(kube.request("GET", f"{path}/{name}")), 120, 0.01, f"{name} Ready")
    elapsed = time.monotonic() - t0
    kube.request("DELETE", f"{path}/{name}")
    wait_for(lambda: all(p["metadata"]["name"] != name for p in kube.request("GET", path)["items"]), 120, 0.05, "gone")
    return elapsed


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
