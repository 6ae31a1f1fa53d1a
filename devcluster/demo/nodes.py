"""``make demo``: the training example's experiment run to the end on a local cluster with two real nodes.

Uses a running ``python -m devcluster up`` cluster if there is one (and leaves it running),
else starts its own (``demo``) and removes it at the end, also on Ctrl-C. Then, as the example's
README tells an ML engineer:

1. ``kubectl apply -k examples/distributed_training`` (DeviceClass, the two templates, scripts);
2. ``kubectl apply -f mpi-job-4gpu-4nic-numa-aligned.yaml``, unchanged: both workers on two
   nodes with their 4 NICs (what one sees inside), the launcher, ``MFU_RESULT``, the bytes each
   rail carried; the MPIJob deleted and every NIC back on its node;
3. the same with ``mpi-job-4gpu-4nic-numa-unaligned.yaml``;
4. both ``MFU_RESULT`` lines side by side, with the time from ``kubectl apply`` to each.

What differs from the GPU cluster the manifests were written for is chosen outside them and
printed: the image (Debian's CPU PyTorch, tagged under the manifests' image name), and the
benchmark's CPU mode (gloo over the claim's NICs, fp32, a CPU-sized model), which it picks by
itself when no GPU is visible.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from devcluster.cluster import fabric, mpi_run, mpijobs
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.node_layout import NodeLayout
from devcluster.cluster.pods import Kubectl, format_view, pod_view
from devcluster.demo.allocation import EXAMPLE_DIR
from driver.kube.client import KubeClient

NAMESPACE = "demo"


def _nics_line(layout: NodeLayout) -> str:
    parts = []
    for node in layout.all_nodes:
        here = fabric.node_nics(node)
        cells = " ".join(n if n in here else f"({n})" for n in layout.nics)
        parts.append(f"{node.name}: {cells}")
    return "; ".join(parts) + "   ((ibN) = in a pod)"


def show_job(kube: KubeClient, kubectl: Kubectl, layout: NodeLayout, which: str) -> mpi_run.RunResult:
    """One MPIJob of the training example from apply to MFU_RESULT, then deleted; prints as it goes."""
    path = mpijobs.MPIJOB_FILES[which]
    print(f"\n$ kubectl apply -n {NAMESPACE} -f {path.relative_to(EXAMPLE_DIR.parent.parent)}", flush=True)

    def inside(res: mpi_run.RunResult) -> None:
        assert res.report is not None
        print(f"  both workers Ready {res.workers_ready_s:.1f}s after the apply")
        print("\n".join("  " + line for line in mpijobs.format_report(res.report)))
        worker = next(p for p in res.report.pods if p.role == "worker")
        print(f"  inside {worker.name} (on {worker.node}):")
        print("\n".join("  " + line for line in format_view(pod_view(kubectl, NAMESPACE, worker.name))))
        print(f"  NICs on the nodes now: {_nics_line(layout)}", flush=True)

    res = mpi_run.run(kube, kubectl, layout, NAMESPACE, which, on_workers_ready=inside)
    for note in res.notes:
        print(f"  {note}")
    print(f"  launcher: {res.rdma_check or 'RDMA check: not reported'}")
    print(f"  launcher: gloo over {res.gloo_interfaces or '?'}; job {res.outcome} {res.ended_s:.1f}s after the apply")
    print(f"  {res.mfu_line or 'no MFU_RESULT (see the launcher log below)'}")
    if not res.mfu_line:
        print("\n".join("    " + line for line in res.launcher_log.splitlines()[-30:]))
    print("  bytes each NIC moved on its rail during the job (sent + received):")
    print("\n".join(mpi_run.format_rails(layout, res)))
    seconds = mpijobs.delete_job(kube, NAMESPACE, res.job)
    print(f"  MPIJob deleted: pods and claims gone in {seconds:.1f}s; NICs: {_nics_line(layout)}", flush=True)
    return res


def run(progress: cluster.Progress = cluster._say) -> int:
    """The demo; returns an exit code."""
    t0 = time.monotonic()
    dev = NodeLayout()
    own = cluster.running(dev) is None
    layout = NodeLayout(name="demo", cluster_cidr="10.87.0.0/20") if own else dev
    print(
        f"1/4 the cluster: control plane, {layout.nodes} real nodes (kubelet, containerd, runc, CNI each, in their "
        "own namespaces), cluster DNS, the GPU driver double, dranet installed with its Helm chart, the MPI "
        "Operator" + ("" if own else " (reusing the running one)"),
        flush=True,
    )
    try:
        st = cluster.up(layout, progress)
        kube = KubeClient.from_kubeconfig(st.kubeconfig)
        kubectl = Kubectl(Path(st.kubectl), Path(st.kubeconfig))
        print(f"    ready in {time.monotonic() - t0:.0f}s (Kubernetes {st.k8s_version}); KUBECONFIG={st.kubeconfig}")
        for node in layout.all_nodes:
            rails = ", ".join(f"{nic} {node.rail_address(r)}" for r, nic in enumerate(layout.nics))
            print(f"    {node.name}: node IP {node.ip}, pods {node.pod_subnet}; NICs (one rail each): {rails}")
        print(
            f"    image {', '.join(mpijobs.seed_images())} = Debian's CPU PyTorch + Open MPI + sshd, built here "
            "(the manifests are unchanged); no GPU here: the benchmark picks its CPU mode itself",
            flush=True,
        )
        print(f"\n2/4 $ kubectl create namespace {NAMESPACE}")
        print(f"    $ kubectl apply -n {NAMESPACE} -k examples/distributed_training")
        kubectl.run("create", "namespace", NAMESPACE)
        print(
            "\n".join(
                "    " + line for line in kubectl.run("apply", "-n", NAMESPACE, "-k", str(EXAMPLE_DIR)).splitlines()
            )
        )
        print("\n3/4 the seed's MPIJobs, one after the other (both want GPUs 0-3 on each node)", flush=True)
        results = [show_job(kube, kubectl, layout, which) for which in ("aligned", "unaligned")]
        print("\n4/4 side by side", flush=True)
        for res in results:
            first = f"{res.first_rank_s:.1f}s" if res.first_rank_s is not None else "-"
            mfu_at = f"{res.mfu_s:.1f}s" if res.mfu_s is not None else "-"
            ready = f"{res.workers_ready_s:.1f}s"
            print(f"  {res.which:<9} apply -> workers Ready {ready}, first rank {first}, MFU_RESULT {mfu_at}")
            print(f"  {res.which:<9} {res.mfu_line}")
            busy = "; ".join(f"{layout.node(i).name}: {','.join(n)}" for i, n in res.busy_nics().items())
            print(f"  {res.which:<9} NICs that carried the traffic: {busy or 'none'}")
        print(
            "  (8 CPU ranks on this machine's cores over veths: the two step times differ by load, not by NUMA;\n"
            "   on 2 x ND96isr H100 v5 the aligned job was ~9% faster per step, see examples/distributed_training)"
        )
        print(f"  every NIC home: {_nics_line(layout)}")
        print(f"\ndone in {time.monotonic() - t0:.0f}s", flush=True)
        return 0 if all(r.outcome == "Succeeded" and r.mfu_line for r in results) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if own:
            print("removing the demo cluster", flush=True)
            cluster.down(layout, progress=lambda _m: None)
        else:
            try:
                mpijobs.delete_namespace(KubeClient.from_kubeconfig(str(layout.kubeconfig)), NAMESPACE)
            except Exception:  # noqa: BLE001 - best effort on a cluster we do not own
                pass
