"""The scheduler against a simulated GPU cluster: how fast pods with NIC+GPU claims are allocated.

``python -m bench.bench_cluster_scale [--nodes 500,1000] [--kinds aligned,match] [--rounds 4]``
(``make bench-scale``; minutes). One real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager with the resourceclaim controller and the garbage collector); Node objects
without kubelets, as the scheduler's own performance tests use, each with this driver's
ResourceSlices (its discovery and publisher on a fixture sysfs tree: ND H100 v5, DGX H100, GB200
mixed 2:2:1, see :mod:`bench.scale_fleet`) and a GPU driver's slice.

A round: as many pods as the cluster holds (each with one claim from a template), created with a
scheduling gate; once the resourceclaim controller has made every claim, all gates are removed
together and the claims' allocations are timed from a watch. Reported per round: pods/s (pods /
(last allocation - first release)), p50/p99 of each pod's release-to-allocation time, and the
scheduler's own time per extension point and plugin (its ``/metrics``), optionally a Go CPU profile
of kube-scheduler (``--profile SECONDS``, ``go tool pprof``). Kinds of claim:

- ``aligned``: the training example's template (4 GPUs by ``pciBusID`` on NUMA node 0, 4 RDMA NICs with
  ``numaNode == 0``); on a DGX H100 the same with its own bus IDs, on a GB200 tray (2 GPUs per
  Grace) 2 + 2. One pod per node.
- ``match``: ``examples/distributed_training/resource-claim-template-match-numa.yaml`` (any 4 GPUs
  and 4 RDMA NICs sharing ``resource.kubernetes.io/numaNode``), 2 + 2 on GB200. Two pods per node.

Each kind runs in ABBA order with A = the devices as this driver publishes them and B = the same
devices cut to the Go driver's attribute set, in the same cluster: an attribute that costs the
scheduler time shows up as a difference. The scheduler and the controller-manager get a high
client QPS (``--kube-api-qps``) so the rate measured is the scheduler's, not its client rate limiter's
(the default of 50 requests/s would cap it near 25 pods/s: each pod costs a claim status write and
a binding).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.scale_fleet import GPU_DRIVER, MIX, SHAPES, VARIANTS, Fleet
from bench.stats import median, pct
from devcluster.builders.binaries import ensure_control_plane
from devcluster.cluster.controlplane import ControlPlane, ControlPlaneOptions, create_objects, load_yaml_docs, wait_for
from devcluster.demo.allocation import EXAMPLE_DIR, seed_docs
from driver.kube.client import RESOURCE_API, KubeClient, watch_events
from driver.kube.transport import ApiRequest

NS = "scale"
GATE = "dranet.bench/release"
QPS = "5000"


# -- templates and pods -------------------------------------------------------------------------


def templates(fleet: Fleet) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, shape) -> the ResourceClaimTemplate a pod for that shape uses."""
    (aligned,) = [t for t in seed_docs()[1] if t["metadata"]["name"].endswith("numa-aligned")]
    (match,) = load_yaml_docs(EXAMPLE_DIR / "resource-claim-template-match-numa.yaml")
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for shape, sd in fleet.shapes.items():
        numa0 = [g.bus_id for g in sd.gpus if g.numa == 0]
        a = copy.deepcopy(aligned)
        if shape != "nd":  # the ND H100 v5 template is the training example's, unchanged
            a["metadata"]["name"] = f"{shape}-aligned"
            gpu, nic = a["spec"]["spec"]["devices"]["requests"]
            ids = ", ".join(f'"{b}"' for b in numa0)
            gpu["exactly"]["selectors"][0]["cel"]["expression"] = (
                f'device.attributes["resource.kubernetes.io"]["pciBusID"] in [{ids}]'
            )
            gpu["exactly"]["count"] = nic["exactly"]["count"] = len(numa0)
        out[("aligned", shape)] = a
        m = copy.deepcopy(match)
        if len(numa0) != 4:  # GB200: 2 GPUs per NUMA node
            m["metadata"]["name"] = f"{shape}-same-numa"
            for r in m["spec"]["spec"]["devices"]["requests"]:
                r["exactly"]["count"] = len(numa0)
            # Only on its own shape: 2 + 2 would also fit half a NUMA node of a 4-GPU shape and
            # leave the 4 + 4 pods no room, so the cluster would never be full.
            product = f'device.attributes["{GPU_DRIVER}"].productName == "{sd.product}"'
            m["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": product}}]
        out[("match", shape)] = m
    return out


PODS_PER_NODE = {"aligned": 1, "match": 2}


def pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "devices"}]}}
            ],
        },
    }


# -- the scheduler's /metrics and profile -----------------------------------------------------------


def _scheduler_port(cp: ControlPlane) -> int:
    (proc,) = [p for p in cp.procs if p.name == "kube-scheduler"]
    (arg,) = [a for a in proc.popen.args if str(a).startswith("--secure-port=")]  # type: ignore[union-attr]
    return int(str(arg).split("=")[1])


def _get(url: str, timeout: float = 30.0) -> bytes:

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving cert, loopback only
    with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
        return bytes(r.read())


SCHED_METRICS = (
    "scheduler_framework_extension_point_duration_seconds",
    "scheduler_plugin_execution_duration_seconds",
    "scheduler_scheduling_algorithm_duration_seconds",
    "scheduler_schedule_attempts",
    "scheduler_pod_scheduling_attempts",
)


def scheduler_metrics(port: int) -> dict[str, float]:
    """Sums and counts of the scheduler's duration histograms and its attempt counters."""
    out: dict[str, float] = {}
    text = _get(f"https://127.0.0.1:{port}/metrics").decode()
    for fam in text_string_to_metric_families(text):
        if fam.name not in SCHED_METRICS:
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("profile", "le"))
            out[f"{s.name}{{{labels}}}"] = out.get(f"{s.name}{{{labels}}}", 0.0) + s.value
    return out


def metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def pprof_top(profile: Path, nodecount: int = 30) -> str:
    """``go tool pprof -top`` of a CPU profile (flat and cumulative)."""
    out = []
    for extra in ([], ["-cum"]):
        r = subprocess.run(
            ["go", "tool", "pprof", "-top", f"-nodecount={nodecount}", *extra, str(profile)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out.append(r.stdout or r.stderr)
    return "\n".join(out)


# -- one round ----------------------------------------------------------------------------------


@dataclass
class Round:
    nodes: int
    kind: str
    variant: str
    pods: int
    allocated: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    release_ms: float = 0.0  # from the first gate removal to the last
    sched: dict[str, float] = field(default_factory=dict)
    load: str = ""
    profile_top: str = ""
    warmup: bool = False


class ClaimWatch:
    """Times the first allocation of each claim in the namespace (a watch in a thread)."""

    def __init__(self, kube: KubeClient, rv: str) -> None:
        self.kube, self.rv = kube, rv
        self.allocated: dict[str, float] = {}  # pod name -> monotonic time its claim was allocated
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            query = [("watch", "true"), ("resourceVersion", self.rv), ("timeoutSeconds", "600")]
            resp = self.kube.api.send(
                ApiRequest("GET", f"{RESOURCE_API}/namespaces/{NS}/resourceclaims", query, timeout=(10, 620))
            )
            events = watch_events(resp)
            try:
                for event in events:
                    self._event(event, time.monotonic())
                    if self.stop.is_set():
                        return
            finally:
                events.close()

    def _event(self, ev: dict[str, Any], now: float) -> None:
        obj = ev.get("object") or {}
        self.rv = (obj.get("metadata") or {}).get("resourceVersion", self.rv)
        if ev.get("type") not in ("ADDED", "MODIFIED") or not (obj.get("status") or {}).get("allocation"):
            return
        owners = obj["metadata"].get("ownerReferences") or [{}]
        self.allocated.setdefault(owners[0].get("name", obj["metadata"]["name"]), now)


def _count(kube: KubeClient, path: str) -> int:
    page = kube.request("GET", path, query={"limit": 1})
    return len(page.get("items") or []) + int((page.get("metadata") or {}).get("remainingItemCount") or 0)


def run_round(
    kube: KubeClient,
    fleet: Fleet,
    tmpls: dict[tuple[str, str], dict[str, Any]],
    kind: str,
    variant: str,
    args: Any,
    port: int,
    profile_dir: Path | None,
) -> Round:
    names: list[tuple[str, str]] = []
    for n in fleet.nodes:
        for k in range(PODS_PER_NODE[kind]):
            names.append((f"{kind}-{n.name}-{k}", tmpls[(kind, n.shape)]["metadata"]["name"]))
    r = Round(len(fleet.nodes), kind, variant, len(names))
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(lambda p: kube.request("POST", f"/api/v1/namespaces/{NS}/pods", pod(*p)), names))
    claims_path = f"{RESOURCE_API}/namespaces/{NS}/resourceclaims"
    wait_for(lambda: _count(kube, claims_path) >= len(names), 300, 0.5, what="every pod's claim created")
    rv = kube.request("GET", claims_path, query={"limit": 1})["metadata"]["resourceVersion"]
    watch = ClaimWatch(kube, rv)
    before = scheduler_metrics(port)
    prof: dict[str, Any] = {}
    if profile_dir is not None:

        def grab() -> None:
            url = f"https://127.0.0.1:{port}/debug/pprof/profile?seconds={args.profile}"
            path = profile_dir / f"sched-{r.nodes}-{kind}-{variant}.pprof"
            path.write_bytes(_get(url, timeout=args.profile + 60))
            prof["path"] = path

        prof_thread = threading.Thread(target=grab, daemon=True)
        prof_thread.start()
    released: dict[str, float] = {}
    patch = [{"op": "remove", "path": "/spec/schedulingGates"}]

    def release(name: str) -> None:
        released[name] = time.monotonic()
        kube.request("PATCH", f"/api/v1/namespaces/{NS}/pods/{name}", patch, content_type="application/json-patch+json")

    t0 = time.monotonic()
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(release, [p for p, _ in names]))
    r.release_ms = (time.monotonic() - t0) * 1e3
    last, last_n = time.monotonic(), 0
    while len(watch.allocated) < len(names):
        time.sleep(0.2)
        if len(watch.allocated) != last_n:
            last, last_n = time.monotonic(), len(watch.allocated)
        elif time.monotonic() - last > args.stall:
            break  # no allocation for a while: the rest do not fit (reported as allocated < pods)
    watch.stop.set()
    r.sched = metrics_delta(before, scheduler_metrics(port))
    r.allocated = len(watch.allocated)
    lat = [(watch.allocated[p] - released[p]) * 1e3 for p in watch.allocated if p in released]
    if watch.allocated:
        r.seconds = max(watch.allocated.values()) - t0
        r.rate = r.allocated / r.seconds
        r.p50_ms, r.p99_ms = median(lat), pct(lat, 99)
    r.load = " ".join(open("/proc/loadavg").read().split()[:3])
    if profile_dir is not None:
        prof_thread.join(args.profile + 90)
        if "path" in prof:
            r.profile_top = pprof_top(prof["path"])
    # Clean up: pods (no kubelet: removed at once), their claims; the scheduler frees the devices.
    kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods", query={"gracePeriodSeconds": 0}, timeout=300)
    kube.request("DELETE", claims_path, timeout=300)
    wait_for(lambda: _count(kube, f"/api/v1/namespaces/{NS}/pods") == 0, 300, 0.5, what="pods deleted")
    wait_for(lambda: _count(kube, claims_path) == 0, 300, 0.5, what="claims deleted")
    time.sleep(args.settle)
    return r


# -- slice sizes ---------------------------------------------------------------------------------


def slice_bytes(cp: ControlPlane, fleet: Fleet) -> dict[str, dict[str, float]]:
    """Per shape and fleet mean: this driver's slices of one node, stored JSON and protobuf bytes."""
    assert cp.creds is not None
    token = cp.creds.admin_token

    ctx = ssl.create_default_context(cafile=str(cp.creds.ca_crt))
    out: dict[str, dict[str, float]] = {}
    for shape in SHAPES:
        node = next(n for n in fleet.nodes if n.shape == shape).name
        sizes = {}
        for label, accept in (("json", "application/json"), ("protobuf", "application/vnd.kubernetes.protobuf")):
            q = urllib.parse.urlencode({"fieldSelector": f"spec.driver=dra.net,spec.nodeName={node}"})
            req = urllib.request.Request(
                f"{cp.server}{RESOURCE_API}/resourceslices?{q}",
                headers={"Authorization": f"Bearer {token}", "Accept": accept},
            )
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                body = resp.read()
            if label == "json":  # the objects alone, compact, without the list envelope
                items = json.loads(body)["items"]
                sizes["json"] = float(sum(len(json.dumps(i, separators=(",", ":"))) for i in items))
                sizes["devices"] = float(sum(len(i["spec"]["devices"]) for i in items))
            else:
                sizes["protobuf"] = float(len(body))
        out[shape] = sizes
    mix = {s: MIX.count(s) / len(MIX) for s in SHAPES}
    out["mean"] = {k: sum(out[s][k] * mix[s] for s in SHAPES) for k in ("json", "protobuf", "devices")}
    return out


# -- report -------------------------------------------------------------------------------------


def _ext_points(sched: dict[str, float], pods: int) -> str:
    """Scheduler time per pod by extension point (framework histogram sums, all statuses)."""
    per: dict[str, float] = {}
    for k, v in sched.items():
        if k.startswith("scheduler_framework_extension_point_duration_seconds_sum"):
            ep = k.split("extension_point=")[1].split(",")[0].rstrip("}")
            per[ep] = per.get(ep, 0.0) + v
    algo = sum(v for k, v in sched.items() if k.startswith("scheduler_scheduling_algorithm_duration_seconds_sum"))
    parts = [f"{ep} {v / pods * 1e3:.2f}" for ep, v in sorted(per.items(), key=lambda x: -x[1]) if v / pods > 5e-5]
    return f"algorithm {algo / pods * 1e3:.2f} ms/pod; " + ", ".join(parts)


def _plugins(sched: dict[str, float]) -> str:
    """The heaviest (plugin, extension point) pairs: sampled sums (the scheduler samples ~10 % of cycles)."""
    per: dict[str, float] = {}
    for k, v in sched.items():
        if k.startswith("scheduler_plugin_execution_duration_seconds_sum"):
            labels = dict(p.split("=", 1) for p in k[k.index("{") + 1 : -1].split(","))
            key = f"{labels.get('plugin')}/{labels.get('extension_point')}"
            per[key] = per.get(key, 0.0) + v
    total = sum(per.values()) or 1.0
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(per.items(), key=lambda x: -x[1])[:6])


def _attempts(sched: dict[str, float]) -> str:
    return ", ".join(
        f"{k.split('result=')[1].split(',')[0].rstrip('}')} {v:.0f}"
        for k, v in sorted(sched.items())
        if k.startswith("scheduler_schedule_attempts_total")
    )


def report(rounds: list[Round], sizes: dict[int, dict[str, dict[str, dict[str, float]]]]) -> str:
    lines = [
        "| nodes | claim | slices | pods | allocated | pods/s | p50 to allocation | p99 to allocation "
        "| release spread | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| {r.nodes} | {r.kind} | {r.variant} | {r.pods} | {r.allocated} | {r.rate:.1f} | {r.p50_ms / 1e3:.2f} s "
            f"| {r.p99_ms / 1e3:.2f} s | {r.release_ms / 1e3:.2f} s | {r.load} |"
        )
    lines += ["", "ABBA means (A = this driver's attributes, B = the Go driver's attribute set):", ""]
    lines += [
        "| nodes | claim | pods/s A | pods/s B | A/B | p50 A | p50 B | p99 A | p99 B "
        "| slice JSON bytes/node A | B | protobuf A | B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for nodes in sorted({r.nodes for r in rounds}):
        for kind in sorted({r.kind for r in rounds if r.nodes == nodes}):

            def mean(attr: str, variant: str, nodes: int = nodes, kind: str = kind) -> float:
                xs = [getattr(r, attr) for r in rounds if (r.nodes, r.kind, r.variant) == (nodes, kind, variant)]
                return sum(xs) / len(xs) if xs else float("nan")

            sz = sizes.get(nodes, {})
            a, b = sz.get("dranet", {}).get("mean", {}), sz.get("go", {}).get("mean", {})
            lines.append(
                f"| {nodes} | {kind} | {mean('rate', 'dranet'):.1f} | {mean('rate', 'go'):.1f} "
                f"| {mean('rate', 'dranet') / mean('rate', 'go'):.3f} "
                f"| {mean('p50_ms', 'dranet') / 1e3:.2f} s | {mean('p50_ms', 'go') / 1e3:.2f} s "
                f"| {mean('p99_ms', 'dranet') / 1e3:.2f} s | {mean('p99_ms', 'go') / 1e3:.2f} s "
                f"| {a.get('json', 0):.0f} | {b.get('json', 0):.0f} "
                f"| {a.get('protobuf', 0):.0f} | {b.get('protobuf', 0):.0f} |"
            )
    lines += ["", "Scheduler time per pod (its /metrics, first round of each kind and size):", ""]
    seen = set()
    for r in rounds:
        if (r.nodes, r.kind) in seen:
            continue
        seen.add((r.nodes, r.kind))
        lines.append(f"- {r.nodes} nodes, {r.kind}, {r.variant}: {_ext_points(r.sched, max(1, r.pods))}")
        lines.append(f"  plugins (share of sampled plugin time): {_plugins(r.sched)}")
        lines.append(f"  schedule attempts: {_attempts(r.sched)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="500,1000", help="cluster sizes, comma-separated, ascending (nodes are added)")
    ap.add_argument("--kinds", default="aligned,match")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per kind and size, ABBA (A = dranet, B = go)")
    ap.add_argument("--variants", default="dranet,go", help="one variant: no ABBA, every round with it")
    ap.add_argument("--workers", type=int, default=8, help="client threads creating and releasing pods")
    ap.add_argument("--stall", type=float, default=60.0, help="seconds without an allocation that end a round")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after cleanup before the next round")
    ap.add_argument(
        "--profile", type=int, default=0, help="seconds of Go CPU profile of kube-scheduler (warm-up round)"
    )
    ap.add_argument("--json", help="write the rounds and sizes here")
    args = ap.parse_args(argv)
    sizes_wanted = [int(x) for x in args.nodes.split(",")]
    kinds = args.kinds.split(",")
    variants = args.variants.split(",")
    assert all(v in VARIANTS for v in variants), f"--variants: one of {VARIANTS}"
    order = [variants[0] if (i % 4 in (0, 3) or len(variants) == 1) else variants[1] for i in range(args.rounds)]
    work = Path(tempfile.mkdtemp(prefix="dn-scale-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    opts = ControlPlaneOptions(
        scheduler_args=(
            f"--kube-api-qps={QPS}",
            f"--kube-api-burst={QPS}",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*",
        ),
        controller_manager_args=(f"--kube-api-qps={QPS}", f"--kube-api-burst={QPS}"),
    )
    rounds: list[Round] = []
    warmups: list[Round] = []
    sizes: dict[int, dict[str, dict[str, dict[str, float]]]] = {}
    try:
        with ControlPlane(ensure_control_plane(), opts) as cp:
            kube = cp.kube()
            port = _scheduler_port(cp)
            create_objects(kube, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
            create_objects(kube, seed_docs()[0])
            fleet = Fleet(kube, workers=args.workers)
            tmpls = templates(fleet)
            unique = {t["metadata"]["name"]: t for t in tmpls.values()}
            create_objects(kube, list(unique.values()), NS)
            for size in sizes_wanted:
                t = time.monotonic()
                fleet.grow(size)
                print(f"{size} nodes ready ({time.monotonic() - t:.1f} s)", flush=True)
                sizes[size] = {}
                for v in variants:
                    fleet.publish(v)
                    sizes[size][v] = slice_bytes(cp, fleet)
                for kind in kinds:
                    # A warm-up round first (not in the means): the first round of a kind pays for cold
                    # caches, and it carries the CPU profile so no measured round does.
                    for i, v in enumerate([order[0], *order]):
                        if fleet.variant != v:
                            writes = fleet.publish(v)
                            time.sleep(args.settle)  # the scheduler's informer takes the new slices
                            print(f"  published {v} ({writes} slice writes)", flush=True)
                        prof = work if args.profile and i == 0 else None
                        r = run_round(kube, fleet, tmpls, kind, v, args, port, prof)
                        r.warmup = i == 0
                        (warmups if r.warmup else rounds).append(r)
                        print(
                            f"  {size} nodes {kind} {v}{' (warm-up)' if r.warmup else ''}: "
                            f"{r.allocated}/{r.pods} pods, {r.rate:.1f} pods/s, "
                            f"p50 {r.p50_ms / 1e3:.2f} s, p99 {r.p99_ms / 1e3:.2f} s (load {r.load})",
                            flush=True,
                        )
                        if r.profile_top:
                            print(r.profile_top, flush=True)
                print(report([r for r in rounds if r.nodes == size], {size: sizes[size]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmachine: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs; started {started}")
    print(f"command: python -m bench.bench_cluster_scale {' '.join(argv)}")
    print(report(rounds, sizes))
    print("\nwarm-up rounds (not in the means; the CPU profile runs during them):")
    for r in warmups:
        print(f"  {r.nodes} nodes {r.kind} {r.variant}: {r.rate:.1f} pods/s, p50 {r.p50_ms / 1e3:.2f} s")
    print("\nslice bytes per node by shape (this driver's slices; dranet | go):")
    for size, by_v in sizes.items():
        for shape in [*SHAPES, "mean"]:
            a, b = by_v.get("dranet", {}).get(shape, {}), by_v.get("go", {}).get(shape, {})
            print(
                f"  {size} nodes {shape}: {a.get('devices', 0):.0f} devices, JSON {a.get('json', 0):.0f} | "
                f"{b.get('json', 0):.0f} B, protobuf {a.get('protobuf', 0):.0f} | {b.get('protobuf', 0):.0f} B"
            )
        break
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rounds": [asdict(r) for r in rounds + warmups], "sizes": sizes}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
