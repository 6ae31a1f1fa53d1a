"""``make demo``: the seed's pods started for real on a local cluster with one real node.

Uses a running ``python -m devcluster up`` cluster if there is one (and leaves it running),
else starts its own (``demo``) and removes it at the end, also on Ctrl-C. For each of the
seed's two ResourceClaimTemplates (applied unchanged) it starts a pod and prints: which NICs
and GPUs the scheduler allocated (with NUMA nodes), what the container sees (interfaces in
its network namespace with MTU and addresses, RDMA device nodes, ``NCCL_IB_HCA``, the GPU
double's ``NVIDIA_VISIBLE_DEVICES``), the claim's conditions; then deletes the pod and shows
the NICs back on the host. Then the seed's two MPIJobs, unchanged, under the real MPI Operator
(`devcluster.mpijobs`): the pods and claims the operator's jobs get, the worker on the real node
with its NICs, the worker on the Node without a kubelet that never starts (so no launcher), and
every claim and NIC released when the MPIJob is deleted. ``make demo-fast``
(``--allocation-only``) skips the real node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from devcluster import cluster, mpijobs
from devcluster.components import ensure_node_binaries
from devcluster.controlplane import create_objects, load_yaml_docs, wait_for
from devcluster.demo import ALIGNED, EXAMPLE_DIR, UNALIGNED, allocation_rows, print_table, summary
from devcluster.node_layout import NodeLayout
from devcluster.pods import Kubectl, format_view, pod_view, workload_pod
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import Conflict, KubeError, NotFound

NAMESPACE = "demo"
MPI_NAMESPACE = "demo-mpi"


def _host_nics(layout: NodeLayout) -> str:
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout)
    here = {link["ifname"]: link for link in links if link["ifname"] in layout.nics}
    return "  ".join(f"{n}({here[n]['mtu']})" if n in here else f"{n}(in a pod)" for n in layout.nics)


def _pod_ready(kube: KubeClient, name: str) -> bool:
    pod = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def _gone(kube: KubeClient, name: str) -> bool:
    try:
        kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    except KubeError as exc:
        return isinstance(exc, NotFound)
    return False


def show_pod(kube: KubeClient, kubectl: Kubectl, layout: NodeLayout, template: str) -> None:
    """Start one pod from ``template``, print everything about it, delete it, show the NICs."""
    pod = template.replace("h100-4gpu-4nic-", "trainer-")
    t0 = time.monotonic()
    kube.request(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        workload_pod(pod, layout.node_name, template, namespace=NAMESPACE),
    )
    wait_for(lambda: _pod_ready(kube, pod), 120, 0.2, f"pod {pod} Ready")
    started = time.monotonic() - t0
    p = kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    claim = kube.read_namespaced_resource_claim(NAMESPACE, p["status"]["resourceClaimStatuses"][0]["resourceClaimName"])
    rows = allocation_rows(kube, claim, layout.node_name)
    print_table(
        f"pod {pod} (Running in {started:.1f}s) -> claim {claim['metadata']['name']} (template {template})", rows
    )
    print(summary(rows))
    print("\n".join(format_view(pod_view(kubectl, NAMESPACE, pod))))
    print("  claim status (written by the dra.net driver):")
    for d in claim.get("status", {}).get("devices") or []:
        conds = ", ".join(f"{c['type']}={c['status']}" for c in d.get("conditions") or [])
        print(f"    {d['device']:<18} {d.get('networkData', {}).get('interfaceName', ''):<6} {conds}")
    numa = next(
        (
            c
            for d in claim["status"].get("devices") or []
            for c in d.get("conditions") or []
            if c["type"] == "NUMAAligned"
        ),
        None,
    )
    if numa:
        print(f"    NUMAAligned: {numa['message']}")
    print(f"  host NICs while it runs: {_host_nics(layout)}")
    kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
    wait_for(lambda: _gone(kube, pod), 120, 0.2, f"pod {pod} deleted")
    # Its generated claim goes with it; the next template wants the same 4 GPUs.
    wait_for(
        lambda: not kube.request("GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")["items"],
        60,
        0.2,
        "claim released",
    )
    print(f"  pod deleted; host NICs now:  {_host_nics(layout)}")


def show_mpijobs(kube: KubeClient, kubectl: Kubectl, layout: NodeLayout, st: cluster.ClusterState) -> None:
    """The seed's MPIJobs, one after the other (both want GPUs 0-3 and the same job name)."""
    host, port = st.server.removeprefix("https://").rsplit(":", 1)
    env = [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]
    ctr = ensure_node_binaries(lambda _m: None).ctr
    with mpijobs.mpi_setup(kube, layout, ctr, env, MPI_NAMESPACE, progress=lambda m: print(f"    {m}")) as mpi:
        print(
            f"    MPI Operator {mpijobs.mpi_operator.VERSION} running (Deployment mpi-operator/mpi-operator); "
            f"image {', '.join(mpi.seed_images)} = the stand-in tagged in containerd (manifests unchanged); "
            f"second node {mpi.second_node.name}: a Node object without a kubelet",
            flush=True,
        )
        for which in ("aligned", "unaligned"):
            job = mpijobs.load_mpijob(which, MPI_NAMESPACE)
            name = job["metadata"]["name"]
            t0 = time.monotonic()
            mpijobs.apply(kube, job)
            mpijobs.wait_scheduled(kube, MPI_NAMESPACE, name, workers=2)

            def real_ready(job: dict[str, Any] = job) -> bool:
                r = mpijobs.report(kube, MPI_NAMESPACE, job)
                return any(p.node == layout.node_name and p.ready for p in r.pods)

            wait_for(real_ready, 180, 0.5, "the worker on the real node Ready")
            time.sleep(3)
            r = mpijobs.report(kube, MPI_NAMESPACE, job)
            for p in r.pods:
                if p.node == mpi.second_node.name:
                    p.why_not_running = (
                        f"cannot run: {mpi.second_node.name} has no kubelet, so the pod stays Pending and the "
                        "launcher (launcherCreationPolicy: WaitForWorkersReady) is never created"
                    )
            print(
                f"\n{mpijobs.MPIJOB_FILES[which].name} (worker on the real node Ready in {time.monotonic() - t0:.1f}s)"
            )
            print("\n".join(mpijobs.format_report(r)))
            real = next(p for p in r.pods if p.node == layout.node_name)
            view = pod_view(kubectl, MPI_NAMESPACE, real.name)
            print(f"  inside {real.name} (running the seed's worker.sh: sshd for mpirun):")
            print("\n".join(format_view(view)))
            print(f"  host NICs while it runs: {_host_nics(layout)}")
            seconds = mpijobs.delete_job(kube, MPI_NAMESPACE, name, mpi.second_node)
            print(f"  MPIJob deleted: pods and claims gone in {seconds:.1f}s; host NICs now: {_host_nics(layout)}")


def run(progress: cluster.Progress = cluster._say) -> int:
    """The demo; returns an exit code."""
    t0 = time.monotonic()
    dev = NodeLayout()
    own = cluster.running(dev) is None
    layout = NodeLayout(name="demo", pod_subnet="10.87.0.0/24") if own else dev
    print(
        "1/5 the cluster: control plane, one real node (kubelet, containerd, runc, CNI), the GPU "
        "driver double, dranet installed with its Helm chart" + ("" if own else " (reusing the running one)"),
        flush=True,
    )
    try:
        st = cluster.up(layout, progress)
        kube = KubeClient.from_kubeconfig(st.kubeconfig)
        kubectl = Kubectl(Path(st.kubectl), Path(st.kubeconfig))
        print(f"    ready in {time.monotonic() - t0:.0f}s; KUBECONFIG={st.kubeconfig}", flush=True)
        print("2/5 the seed's ResourceClaimTemplates (examples/distributed_training), unchanged", flush=True)
        try:
            kube.request(
                "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            )
        except KubeError as exc:
            if not isinstance(exc, Conflict):
                raise
        wait_for(
            lambda: kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
            30,
            0.1,
            "the demo namespace's service account",
        )
        docs = load_yaml_docs(EXAMPLE_DIR / "resource-claim-template.yaml")
        for d in docs:
            d["metadata"]["namespace"] = NAMESPACE
            try:
                create_objects(kube, [d], NAMESPACE)
            except KubeError as exc:
                if not isinstance(exc, Conflict):
                    raise
        print(f"    host NICs: {_host_nics(layout)}")
        print("3/5 one pod per template, started by the kubelet (one after the other: both want GPUs 0-3)", flush=True)
        for template in (ALIGNED, UNALIGNED):
            show_pod(kube, kubectl, layout, template)
        print("\n4/5 the seed's MPIJobs (unchanged) under the real MPI Operator, one after the other", flush=True)
        show_mpijobs(kube, kubectl, layout, st)
        print(f"\n5/5 done in {time.monotonic() - t0:.0f}s", flush=True)
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if own:
            print("removing the demo cluster", flush=True)
            cluster.down(layout, progress=lambda _m: None)
        else:
            try:
                kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
            except Exception:  # noqa: BLE001 - best effort on a cluster we do not own
                pass
