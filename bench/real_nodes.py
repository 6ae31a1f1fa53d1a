"""The real two-node cluster a benchmark runs on, and the node driver's own figures.

:func:`bench_cluster`: the running ``python -m devcluster up`` when there is one (left running),
else a cluster of the benchmark's own, removed at the end. :func:`hook_buckets`: the driver's
NRI hook latency histogram, read from its /metrics on the node (the tests read it too).
"""

from __future__ import annotations

import contextlib
import re
import sys
import urllib.request
from collections.abc import Iterator

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.cluster_state import ClusterState
from devcluster.cluster.node_layout import NodeLayout
from driver.kube.client import KubeClient


@contextlib.contextmanager
def bench_cluster(name: str, cluster_cidr: str) -> Iterator[tuple[NodeLayout, ClusterState]]:
    """The dev cluster if it runs, else a new one named ``name`` on ``cluster_cidr`` (removed after)."""
    dev = NodeLayout()
    own = cluster.running(dev) is None
    layout = NodeLayout(name=name, cluster_cidr=cluster_cidr) if own else dev
    try:
        yield layout, cluster.up(layout, progress=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        if own:
            cluster.down(layout, progress=lambda _m: None)


def driver_metrics(kube: KubeClient, layout: NodeLayout, node: int = 0) -> str:
    """The /metrics text of the driver on node ``node`` (its probe port, on the node's address)."""
    pods = kube.request(
        "GET",
        f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
        query={
            "labelSelector": "app.kubernetes.io/component=driver",
            "fieldSelector": f"spec.nodeName={layout.node(node).name}",
        },
    )["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    args = running[0]["spec"]["containers"][0]["args"]
    port = int(next(a for a in args if a.startswith("--bind-address=")).rsplit(":", 1)[1])
    with urllib.request.urlopen(f"http://{layout.node(node).ip}:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def hook_buckets(metrics: str, method: str) -> dict[str, float]:
    """``le`` -> cumulative count of the successful ``method`` hooks, from a /metrics text."""
    out: dict[str, float] = {}
    for labels, value in re.findall(r"nri_plugin_requests_latency_seconds_bucket\{([^}]*)\} (\S+)", metrics):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if got.get("method") == method and got.get("status") == "success":
            out[got["le"]] = float(value)
    return out
