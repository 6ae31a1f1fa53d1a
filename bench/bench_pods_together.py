"""Pods starting together on one real node: the last Ready against one pod alone, IPv4 and IPv6.

``python -m bench.bench_pods_together [--runs 5] [--pods 8]`` (root; starts its own two-node
cluster, or uses a running ``python -m devcluster up``). An 8-GPU node starts its pods together
(one per GPU and rail), and the runtime hands a plugin one NRI event at a time for the whole node:
a hook that waits (as an IPv6 duplicate address detection did) makes every pod after it wait.

Per run and family, from the API create (wall clock) to Ready (polled every 50 ms): one pod alone,
then ``--pods`` pods created at once, each with a one-NIC claim giving it a new address of that
family (``rail i``: ``10.20i.0.5/24`` or ``fd7i::5/64``); the same with pods that claim nothing
(the kubelet's and the runtime's own time for pods starting together: the floor the driver's arms
are held against); then a pod whose claim gives one NIC 64 new IPv6 addresses (the most a claim's
requests allow beside a route or two), whose RunPodSandbox time is read from the driver's own hook
histogram (/metrics: the bucket it fell in). Pods are deleted, their NICs home, between runs. The
three arms rotate (IPv4, IPv6, no claim; then IPv6, no claim, IPv4; ...): drift hits them alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.real_nodes import bench_cluster, driver_metrics, hook_buckets
from bench.stats import median, pct
from devcluster.cluster.pods import workload_pod
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import NotFound

NAMESPACE = "bench-together"


def _claim(name: str, nic: str, addresses: list[str]) -> dict[str, Any]:
    selector = f'device.attributes["dra.net"]["ifName"] == "{nic}"'
    params = {"apiVersion": "dra.net/v1alpha1", "kind": "NetworkConfig", "interface": {"addresses": addresses}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "nic",
                        "exactly": {"deviceClassName": "dranet.net", "selectors": [{"cel": {"expression": selector}}]},
                    }
                ],
                "config": [{"requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": params}}],
            }
        },
    }


NO_CLAIM = 0
"""The arm whose pods claim nothing."""
ARMS = (4, 6, NO_CLAIM)
LABELS = {4: "IPv4", 6: "IPv6", NO_CLAIM: "no claim"}


def _address(family: int, rail: int, host: int = 5) -> str:
    return f"10.{200 + rail}.0.{host}/24" if family == 4 else f"fd{70 + rail}::{host:x}/64"


def _ready(kube: KubeClient, name: str) -> bool:
    pod = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _start(kube: KubeClient, node: str, specs: list[tuple[str, str, list[str]]], timeout: float = 180) -> list[float]:
    """Create each (pod, NIC, addresses) at once; seconds from the creates to each pod Ready. An
    empty NIC: a pod that claims nothing."""

    def create(spec: tuple[str, str, list[str]]) -> None:
        name, nic, addresses = spec
        if nic:
            kube.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims", _claim(name, nic, addresses))
        pod = workload_pod(name, node, claim=name if nic else None, namespace=NAMESPACE)
        kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(specs)) as pool:
        list(pool.map(create, specs))
    done: dict[str, float] = {}
    while len(done) < len(specs):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"pods not Ready after {timeout}s: {[s[0] for s in specs if s[0] not in done]}")
        for name, _, _ in specs:
            if name not in done and _ready(kube, name):
                done[name] = time.monotonic() - t0
        time.sleep(0.05)
    return [done[s[0]] for s in specs]


def _clean(kube: KubeClient, names: list[str]) -> None:
    """Delete the pods (a 1 s grace: the kubelet reclaims their claims before the pod object goes,
    so the next claim of the same NIC is not refused as still held) and their claims; wait until gone."""
    for name in names:
        for path in (
            f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
            f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims/{name}",
        ):
            try:
                kube.request("DELETE", path, {"gracePeriodSeconds": 1} if "/pods/" in path else None)
            except NotFound:
                pass
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        claims = kube.request("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")["items"]
        if not pods and not claims:
            return
        time.sleep(0.2)
    raise TimeoutError("pods or claims not gone")


def _bucket_of(before: dict[str, float], after: dict[str, float]) -> str:
    """The smallest bucket the one new hook fell in."""
    for le in sorted((k for k in after if k != "+Inf"), key=float):
        if after[le] - before.get(le, 0.0) >= 1:
            return f"<= {float(le) * 1e3:.0f} ms"
    return "> 10 s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per family")
    ap.add_argument("--pods", type=int, default=8, help="pods started together (one NIC each, at most the node's NICs)")
    a = ap.parse_args(argv)
    with bench_cluster("benchtog", "10.86.0.0/20") as (layout, st):
        kube = KubeClient.from_kubeconfig(st.kubeconfig)
        try:
            kube.request(
                "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
        except Exception:  # noqa: BLE001 - left by an earlier run
            pass
        time.sleep(1)  # the namespace's default service account
        nics = list(layout.nics[: a.pods])
        node = layout.node_name
        alone: dict[int, list[float]] = {arm: [] for arm in ARMS}
        together: dict[int, list[float]] = {arm: [] for arm in ARMS}
        for family in (4, 6):  # warm-up: the workload image's first start on the node
            _start(kube, node, [("warm", nics[0], [_address(family, 0)])])
            _clean(kube, ["warm"])
        for run in range(a.runs):
            for arm in ARMS[run % len(ARMS) :] + ARMS[: run % len(ARMS)]:
                specs = [(f"p{i}", nic if arm else "", [_address(arm, i)] if arm else []) for i, nic in enumerate(nics)]
                (t,) = _start(kube, node, [("alone", *specs[0][1:])])
                _clean(kube, ["alone"])
                alone[arm].append(t)
                times = _start(kube, node, specs)
                _clean(kube, [s[0] for s in specs])
                together[arm].append(max(times))
                print(
                    f"    {LABELS[arm]}: alone {t:5.2f} s, {len(specs)} together: last {max(times):5.2f} s",
                    file=sys.stderr,
                )
        before = hook_buckets(driver_metrics(kube, layout), "RunPodSandbox")
        (many,) = _start(kube, node, [("many", nics[0], [_address(6, 0, 2 + i) for i in range(64)])])
        bucket = _bucket_of(before, hook_buckets(driver_metrics(kube, layout), "RunPodSandbox"))
        _clean(kube, ["many"])
        print(f"\n{a.pods} one-NIC pods created at once on one node vs one alone, create -> Ready, {a.runs} runs each:")
        floor = median(together[NO_CLAIM])
        for arm in ARMS:
            one, last = median(alone[arm]), median(together[arm])
            print(
                f"  {LABELS[arm]}: alone median {one:5.2f} s (p99 {pct(alone[arm], 99):5.2f}); "
                f"{a.pods} together, the last: median {last:5.2f} s (p99 {pct(together[arm], 99):5.2f}); "
                f"ratio {last / one:4.2f}x; against {a.pods} pods that claim nothing {last / floor:4.2f}x"
            )
        print(f"  one pod with 64 new IPv6 addresses: Ready in {many:5.2f} s; its RunPodSandbox {bucket}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
