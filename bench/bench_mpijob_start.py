"""MPIJob start on two real nodes, with the NIC claims and without: what dranet adds to a job's start.

``python -m bench.bench_mpijob_start [--runs 10]`` (root; starts its own two-node cluster, or
uses a running ``python -m devcluster up``). Two arms, alternated run by run (ABBA) so load and
caches hit them alike:

* ``claims``: the training example's aligned MPIJob as it is (each worker's claim: 4 GPUs from the GPU double
  and 4 RDMA NICs from dra.net, moved into the pod by the driver);
* ``no-nic``: the same MPIJob whose workers claim only the same 4 GPUs (no dra.net device).

Per run, from the API create of the MPIJob (wall clock) to: both workers Ready (polled every
100 ms), and the launcher's first rank (the first rank's log line, by the container runtime's
timestamp). The launcher starts only when both workers are Ready (``WaitForWorkersReady``), then
mpirun, ssh and Python's ``import torch`` follow, so the second column carries the first's
difference plus noise. The job is deleted after its first rank (every NIC home) before the next.
Also prints the cold build time of every component (recorded by the build cache) and the warm
``devcluster up`` time.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.bench_pod_start import cold_setup_seconds
from bench.stats import abba, pct
from devcluster.cluster import fabric, mpi_run, mpijobs
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import load_yaml_docs
from devcluster.cluster.node_layout import NodeLayout
from devcluster.cluster.pods import Kubectl
from devcluster.demo.allocation import ALIGNED, EXAMPLE_DIR
from driver.kube.client import RESOURCE_API, KubeClient

NAMESPACE = "bench-mpi"
NO_NIC_TEMPLATE = "h100-4gpu-no-nic"


def no_nic_template() -> dict[str, Any]:
    """The training example's aligned template without its NIC request: the same 4 GPUs, nothing from dra.net."""
    tmpl = next(
        d for d in load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml") if d["metadata"]["name"] == ALIGNED
    )
    tmpl = copy.deepcopy(tmpl)
    tmpl["metadata"] = {"name": NO_NIC_TEMPLATE, "namespace": NAMESPACE}
    reqs = tmpl["spec"]["spec"]["devices"]["requests"]
    tmpl["spec"]["spec"]["devices"]["requests"] = [r for r in reqs if r["name"] != "nic"]
    return tmpl


def job_for(arm: str) -> dict[str, Any]:
    job = mpijobs.load_mpijob("aligned", NAMESPACE)
    if arm == "no-nic":
        spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        spec["resourceClaims"][0]["resourceClaimTemplateName"] = NO_NIC_TEMPLATE
    return job


def one_run(kube: KubeClient, kubectl: Kubectl, layout: NodeLayout, arm: str) -> mpi_run.RunResult:
    job = job_for(arm)
    before = fabric.rail_counters(layout)
    t0 = time.time()
    kube.request("POST", f"{mpijobs.MPIJOBS_API}/namespaces/{NAMESPACE}/mpijobs", job)
    res = mpi_run.follow(kube, kubectl, layout, NAMESPACE, job, t0, before, arm, timeout=600, until="first-rank")
    mpijobs.delete_job(kube, NAMESPACE, res.job)
    return res


def _row(name: str, values: list[float]) -> str:
    return (
        f"  {name:<24} median {statistics.median(values):6.2f} s   p99 {pct(values, 99):6.2f} s   "
        f"min {min(values):6.2f}   max {max(values):6.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per arm")
    a = ap.parse_args(argv)
    dev = NodeLayout()
    own = cluster.running(dev) is None
    layout = NodeLayout(name="benchmpi", cluster_cidr="10.85.0.0/20") if own else dev
    try:
        t0 = time.monotonic()
        st = cluster.up(layout, progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(
            f"devcluster up ({layout.nodes} nodes): {time.monotonic() - t0:.1f}s "
            f"({'started' if own else 'already running'}; {st.timings})"
        )
        for k, v in cold_setup_seconds().items():
            print(f"cold build recorded: {k:<34} {v:7.0f} s")
        kube = KubeClient.from_kubeconfig(st.kubeconfig)
        kubectl = Kubectl(Path(st.kubectl), Path(st.kubeconfig))
        with mpijobs.seed_namespace(kube, NAMESPACE):
            kube.request("POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaimtemplates", no_nic_template())
            for arm in ("claims", "no-nic"):  # warm-up: first pods of this image on each node
                one_run(kube, kubectl, layout, arm)
            results: dict[str, list[mpi_run.RunResult]] = {"claims": [], "no-nic": []}
            for label in abba(2 * a.runs):
                arm = "claims" if label == "A" else "no-nic"
                res = one_run(kube, kubectl, layout, arm)
                results[arm].append(res)
                print(
                    f"    {arm:<7} workers Ready {res.workers_ready_s:6.2f} s, first rank {res.first_rank_s:6.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
        print(f"\nMPIJob start on {layout.nodes} nodes, create -> milestone, {a.runs} runs per arm (ABBA):")
        for arm, runs in results.items():
            print(_row(f"{arm}: workers Ready", [r.workers_ready_s or 0.0 for r in runs]))
            print(_row(f"{arm}: first rank", [r.first_rank_s or 0.0 for r in runs]))
        for milestone in ("workers_ready_s", "first_rank_s"):
            c = [getattr(r, milestone) or 0.0 for r in results["claims"]]
            n = [getattr(r, milestone) or 0.0 for r in results["no-nic"]]
            print(
                f"  claims - no-nic, {milestone[:-2].replace('_', ' ')}: median "
                f"{statistics.median(c) - statistics.median(n):+.2f} s, p99 {pct(c, 99) - pct(n, 99):+.2f} s"
            )
        return 0
    finally:
        if own:
            cluster.down(layout, progress=lambda _m: None)


if __name__ == "__main__":
    raise SystemExit(main())
