"""``python -m devcluster up`` / ``down``: a local Kubernetes with N REAL nodes (default 2).

``up`` starts, in this order, and leaves running (every daemon in its own session, so it
outlives the command):

1. the fabric (`devcluster.cluster.fabric`): the cluster network every node and the host are on, and one
   rail per NIC index (ND H100 v5: 8 rails);
2. the control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager with the
   controllers a DaemonSet, a Deployment, a Job, EndpointSlices and DRA need), listening on
   the host's address on the cluster network; and the cluster DNS (`devcluster.cluster.coredns`);
3. every node (`devcluster.cluster.node_daemons`), in parallel: its network and mount namespaces, its
   NICs cabled to the rails, the fixture sysfs, containerd 2.x (NRI) with runc and the bridge
   CNI, the images, the kubelet, the GPU driver test double (`devcluster.doubles.gpu_plugin`);
4. the driver, installed WITH THE CHART (``helm install charts/dranet``) from the locally built
   image, with a dev-only values file (the fixture sysfs, the apiserver address): a DaemonSet pod
   on every node;
5. the MPI Operator (`devcluster.cluster.mpi_operator`), and the training example's image under the name
   its MPIJobs use, so ``kubectl apply -k examples/distributed_training`` and the MPIJob
   manifests work as the README says.

It prints ``KUBECONFIG=<path>`` and ``KUBECTL=<path>``. A second ``up`` while one runs says so
and exits 0. ``down`` removes every process, mount, namespace, link, cgroup and file the cluster
made, from the layout alone (`devcluster.cluster.node_host.sweep`), so it also works after a crashed
``up``. Every name and address derives from `NodeLayout`, so several clusters never collide.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devcluster.builders import helm as helm_mod
from devcluster.builders import images
from devcluster.builders.binaries import K8S_RELEASE, ControlPlaneBinaries, ensure_control_plane
from devcluster.builders.components import NodeBinaries, ensure_node_binaries
from devcluster.builders.driver_image import build_driver_image
from devcluster.cluster import coredns, fabric, mpi_operator, mpijobs, node_daemons, node_host
from devcluster.cluster.cluster_state import ClusterState, pid_alive, running, spawn, wait_pid
from devcluster.cluster.controlplane import ControlPlane, ControlPlaneOptions, free_port
from devcluster.cluster.node_daemons import NODE_LABEL, NodeImages
from devcluster.cluster.node_layout import DEFAULT_BASE, DEFAULT_CIDR, IN_NODE, LayoutError, NodeLayout
from driver.kube.client import RESOURCE_API, KubeClient

log = logging.getLogger(__name__)

__all__ = ["NODE_LABEL", "ClusterState", "running", "up", "down", "restart"]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dranet"
RELEASE = "dranet"
NAMESPACE = "kube-system"
# What a DaemonSet, a Deployment, a Job, service-account tokens, Service endpoints and DRA need.
CONTROLLERS = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "endpoints-controller",
    # The cluster DNS answers headless-Service names (the MPI hostfile) from EndpointSlices.
    "endpointslice-controller",
    "namespace-controller",
    # The MPI Operator's launcher is a batch/v1 Job.
    "job-controller",
    # Evicts pods whose claims hold a device with a NoExecute taint (DRADeviceTaints).
    "device-taint-eviction-controller",
)
Progress = Callable[[str], None]
restart = node_daemons.restart


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Binaries:
    """Everything `up` runs, found or built."""

    control_plane: ControlPlaneBinaries
    node: NodeBinaries
    helm: str
    coredns: Path
    pause: images.ImageArchive
    workload: images.ImageArchive
    driver: images.ImageArchive
    operator: images.ImageArchive
    worker: images.ImageArchive


def prepare(progress: Progress = _say) -> Binaries:
    """Build or reuse every binary and image (cached under ``~/.cache/dranet``)."""
    cp = ensure_control_plane(progress)
    node = ensure_node_binaries(progress)
    helm = helm_mod.ensure()
    dns = coredns.build(progress=progress)
    operator = mpi_operator.operator_image(mpi_operator.build(progress=progress))
    return Binaries(
        cp,
        node,
        helm,
        dns,
        images.pause_image(),
        images.workload_image(),
        build_driver_image(progress),
        operator,
        mpijobs.worker_image(progress),
    )


def api_env(server: str) -> list[dict[str, str]]:
    """The apiserver's address for pods (there is no Service VIP: no kube-proxy)."""
    host, port = server.removeprefix("https://").rsplit(":", 1)
    # The kubelet's own variable holds an IPv6 address bare; clients add the brackets.
    host = host.removeprefix("[").removesuffix("]")
    return [{"name": "KUBERNETES_SERVICE_HOST", "value": host}, {"name": "KUBERNETES_SERVICE_PORT", "value": port}]


def dev_values(layout: NodeLayout, st: ClusterState, image_ref: str) -> dict[str, Any]:
    """The DEV-ONLY Helm values: the fixture sysfs, the apiserver address, the cluster's nodes.

    Every node path is the chart's default (each node's mount namespace puts its own there);
    everything else (DaemonSet, security context, RBAC, node policy, DeviceClass, webhook) too.
    """
    repo, _, tag = image_ref.rpartition(":")
    env = api_env(st.server)
    fixture = IN_NODE.fixture_sysfs
    values: dict[str, Any] = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "nri": {"enabled": True},
        # The fixture's uplink.
        "excludeInterfaces": ["eth0"],
        # The fixture sysfs describes the machine (PCI, NUMA, RDMA); the veths named like its
        # NICs in the node's network namespace are what the driver moves.
        "extraArgs": [f"--sysfs-root={fixture}"],
        "extraVolumes": [{"name": "fixture-sysfs", "hostPath": {"path": fixture, "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "fixture-sysfs", "mountPath": fixture, "readOnly": True}],
        "extraEnv": env,
        "nodeSelector": {NODE_LABEL: layout.name},
        "webhook": {"replicas": 1, "extraEnv": env, "nodeSelector": {NODE_LABEL: layout.name}},
    }
    if layout.runtime == "crio":
        # The kubelet gives node-critical pods oom_score_adj -997; lowering it needs
        # CAP_SYS_RESOURCE, which this VM's root lacks, and CRI-O (unlike containerd's
        # restrict_oom_score_adj) has no clamp: the driver runs at the default priority here.
        values["priorityClassName"] = ""
    return values


def _kubelet_ready(kube: KubeClient, node: str) -> bool:
    n = kube.read_node(node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))


def _release_items(kube: KubeClient, path: str, selector: str = "") -> list[dict[str, Any]]:
    """The objects at ``path`` of the driver's Helm release (plus ``selector``)."""
    labels = ",".join(x for x in (f"app.kubernetes.io/instance={RELEASE}", selector) if x)
    items: list[dict[str, Any]] = kube.request("GET", path, query={"labelSelector": labels})["items"]
    return items


def _rollout_done(kube: KubeClient, nodes: int) -> bool:
    ds = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}")
    s = ds.get("status", {})
    if not (s.get("desiredNumberScheduled", 0) >= nodes and s.get("numberReady", 0) == s["desiredNumberScheduled"]):
        return False
    deps = _release_items(kube, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
    return all(d.get("status", {}).get("readyReplicas", 0) >= d["spec"].get("replicas", 1) for d in deps)


def dra_slices(kube: KubeClient, node: str) -> bool:
    """Both drivers (dra.net and the GPU double) publish devices on ``node``."""
    items = kube.request("GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node}"})[
        "items"
    ]
    drivers = {s["spec"]["driver"] for s in items if s["spec"].get("devices")}
    return {"dra.net", "gpu.nvidia.com"} <= drivers


def up(layout: NodeLayout, progress: Progress = _say, set_values: Sequence[str] = ()) -> ClusterState:
    """Start everything (see the module docstring); on failure remove what was started.
    ``set_values``: chart values (``KEY=VALUE``, helm's ``--set``) over the dev cluster's."""
    existing = running(layout)
    if existing:
        progress(f"cluster {layout.name!r} is already running ({layout.base}); `python -m devcluster down` stops it")
        return existing
    t0 = time.monotonic()
    bins = prepare(progress)
    t_prep = time.monotonic() - t0
    node_host.sweep(layout)  # leftovers of a crashed `up` of the same name
    st = ClusterState(
        name=layout.name,
        nodes=layout.nodes,
        cluster_cidr=layout.cluster_cidr,
        k8s_version=K8S_RELEASE.version,
        runtime=layout.runtime,
        ip_family=layout.ip_family,
    )
    try:
        _up(layout, bins, st, progress, set_values)
    except BaseException:
        failed_logs = Path(f"/tmp/dranet-{layout.name}-failed-logs")
        progress(f"up failed; copying the logs to {failed_logs} before the cleanup removes them")
        shutil.rmtree(failed_logs, ignore_errors=True)
        if layout.logs.is_dir():
            shutil.copytree(layout.logs, failed_logs)
        for node in layout.all_nodes:  # the pods' container logs
            if (node.log_dir / "pods").is_dir():
                shutil.copytree(node.log_dir / "pods", failed_logs / f"n{node.index}-pods", symlinks=True)
        try:
            down(layout, progress=lambda _m: None)
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # must not hide why `up` failed
            progress(f"up failed, and so did its cleanup: {type(e).__name__}: {e}")
        raise
    st.timings = {"prepare_s": round(t_prep, 1), "start_s": round(time.monotonic() - t0 - t_prep, 1)}
    st.ready = True
    st.save(layout)
    return st


def _up(layout: NodeLayout, bins: Binaries, st: ClusterState, progress: Progress, set_values: Sequence[str]) -> None:
    layout.base.mkdir(parents=True, exist_ok=True)
    st.save(layout)
    progress(
        f"[up] fabric: cluster network {', '.join(str(layout.node_network_of(v)) for v in layout.versions)} "
        f"(host {', '.join(layout.gateways)}), "
        f"{len(layout.nics)} rails; Kubernetes {K8S_RELEASE.version}, {layout.nodes} node(s) on {layout.runtime}"
    )
    fabric.create(layout)
    progress("[up] control plane")
    opts = ControlPlaneOptions(
        controllers=CONTROLLERS,
        feature_gates=dict(K8S_RELEASE.feature_gates),
        runtime_config=dict(K8S_RELEASE.runtime_config),
        bind_address=layout.gateway,
        service_ip_ranges=tuple(layout.service_ranges),
        detached=True,
        keep_dir=True,
        disable_admission_plugins=("TaintNodesByCondition",),
        # Webhook calls go to the endpoint (a pod IP): there is no service proxy.
        # The kubelets (logs, exec) by their InternalIP: no name lookups.
        apiserver_args=("--enable-aggregator-routing=true", "--kubelet-preferred-address-types=InternalIP"),
        start_timeout=120,
    )
    cp = ControlPlane(bins.control_plane, opts, base_dir=str(layout.base))
    cp.start()
    assert cp.kubeconfig is not None and cp.creds is not None
    for p in cp.procs:
        st.pids[p.name] = p.popen.pid
    shutil.copyfile(cp.kubeconfig, layout.kubeconfig)
    st.server, st.kubeconfig, st.kubectl = cp.server, str(layout.kubeconfig), str(bins.node.kubectl)
    st.save(layout)
    kube = KubeClient.from_kubeconfig(str(layout.kubeconfig))

    progress(f"[up] cluster DNS (CoreDNS {coredns.VERSION}) at {', '.join(layout.gateways)} port 53")
    st.dns_ready_port = free_port()
    layout.corefile.write_text(coredns.corefile(layout, st.dns_ready_port))
    spawn(layout, "coredns", [str(bins.coredns), "-conf", str(layout.corefile)], None, st)

    node_images = NodeImages(
        archives=(bins.pause, bins.workload, bins.driver, bins.worker, bins.operator),
        tags=tuple((bins.worker.ref, name) for name in mpijobs.seed_images()),
    )
    names = ", ".join(n.name for n in layout.all_nodes)
    progress(f"[up] nodes {names}: namespaces, NICs, {layout.runtime}, images, kubelet")
    with concurrent.futures.ThreadPoolExecutor(max_workers=layout.nodes) as pool:
        futures = [
            pool.submit(node_daemons.boot, node, st, bins.node, K8S_RELEASE, node_images, progress)
            for node in layout.all_nodes
        ]
        for f in futures:
            f.result()
    st.driver_image = bins.driver.ref
    st.save(layout)
    for node in layout.all_nodes:
        k = node_daemons.key(node, "kubelet")
        wait_pid(layout, st, k, functools.partial(_kubelet_ready, kube, node.name), 120, f"node {node.name} Ready")
    wait_pid(layout, st, "coredns", lambda: coredns.ready(st.dns_ready_port), 60, "the cluster DNS synced")

    progress(f"[up] helm install {RELEASE} charts/dranet (image {bins.driver.ref}) and the MPI Operator")
    layout.values_file.write_text(yaml.safe_dump(dev_values(layout, st, bins.driver.ref), sort_keys=False))
    wait_pid(
        layout,
        st,
        "kube-controller-manager",
        lambda: _sa_ready(kube, NAMESPACE),
        60,
        "the kube-system service accounts",
    )
    helm(layout, "install", *[a for v in set_values for a in ("--set", v)], helm_binary=bins.helm)
    mpi_operator.install(kube, api_env(st.server), {NODE_LABEL: layout.name}, min(2, layout.nodes))
    wait_pid(
        layout,
        st,
        "n0/kubelet",
        lambda: _rollout_done(kube, layout.nodes),
        180,
        f"the dranet DaemonSet on {layout.nodes} node(s) and the webhook Ready",
    )
    for node in layout.all_nodes:
        k = node_daemons.key(node, "gpu-plugin")
        slices = functools.partial(dra_slices, kube, node.name)
        wait_pid(layout, st, k, slices, 60, f"{node.name}: both drivers' slices")
    wait_pid(layout, st, "n0/kubelet", lambda: mpi_operator.available(kube), 180, "the MPI Operator available")


def tag_image(layout: NodeLayout, source: str, target: str) -> str:
    """A second name for an image in every node's containerd (``ctr images tag``), e.g. the
    driver image under a new tag for an upgrade test: the same image, as a registry would serve it."""
    ctr = ensure_node_binaries(lambda _m: None).ctr
    for node in layout.all_nodes:
        images.tag_image(ctr, str(node.containerd_socket), source, target)
    return target


def helm(layout: NodeLayout, verb: str, *args: str, helm_binary: str | None = None, timeout: float = 300) -> str:
    """``helm <verb> dranet charts/dranet`` on this cluster with its dev values (+ ``args``)."""
    cmd = [helm_binary or helm_mod.ensure(), verb, RELEASE, str(CHART), "-n", NAMESPACE]
    cmd += ["--kubeconfig", str(layout.kubeconfig), "-f", str(layout.values_file), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"helm {verb} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def helm_upgrade(layout: NodeLayout, image_ref: str, *set_values: str) -> str:
    """``helm upgrade`` the driver release to ``image_ref`` (same dev values, plus ``set_values``);
    returns helm's output. Does not wait: see `driver_rollout_done`."""
    repo, _, tag = image_ref.rpartition(":")
    sets = [f"image.repository={repo}", f"image.tag={tag}", *set_values]
    return helm(layout, "upgrade", *[a for v in sets for a in ("--set", v)])


def driver_rollout_done(kube: KubeClient, image_ref: str) -> bool:
    """The DaemonSet runs ``image_ref`` on every node, every pod Ready, no old pod left."""
    ds = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}")
    s = ds.get("status", {})
    want = s.get("desiredNumberScheduled", 0)
    if not (
        want >= 1
        and s.get("observedGeneration") == ds["metadata"]["generation"]
        and s.get("updatedNumberScheduled") == want
        and s.get("numberAvailable") == want
    ):
        return False
    pods = _release_items(kube, f"/api/v1/namespaces/{NAMESPACE}/pods", "app.kubernetes.io/component=driver")
    return len(pods) == want and all(p["spec"]["containers"][0]["image"] == image_ref for p in pods)


def _sa_ready(kube: KubeClient, namespace: str) -> bool:
    kube.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
    kube.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/kube-root-ca.crt")
    return True


def down(layout: NodeLayout, progress: Progress = _say) -> node_host.SweepReport:
    """Remove everything of this cluster (works from the layout alone, also after a crash)."""
    st = ClusterState.load(layout)
    first = []
    if st:
        # The kubelets first, so they do not restart what we stop.
        first = [p for k, p in st.pids.items() if k.endswith("/kubelet")]
    report = node_host.sweep(layout, first=first)
    for p in report.problems:
        progress(f"[down] {p}")
    progress(f"[down] cluster {layout.name!r} removed" + (" (with problems above)" if report.problems else ""))
    return report


ABANDONED_AFTER_S = 900.0
"""How long a cluster's state must have stood still, every recorded process gone, before another
run takes it for abandoned: a cluster coming up saves its state at each step and records each
daemon as it starts it, so one still coming up is never that quiet."""


def sweep_abandoned(
    root: Path = DEFAULT_BASE, quiet_s: float = ABANDONED_AFTER_S, progress: Progress = _say
) -> list[str]:
    """`down` of every cluster under ``root`` that a run killed before its own cleanup left behind
    (its namespaces, links, mounts, cgroups and files): none of the processes its state records is
    alive and the state has not changed for ``quiet_s``. A running cluster, or one coming up, is
    left alone. The names of the clusters removed."""
    swept = []
    for state in sorted(root.glob("*/cluster.json")):
        try:
            raw = json.loads(state.read_text())
            quiet = time.time() - state.stat().st_mtime
            pids = [int(p) for p in (raw.get("pids") or {}).values()]
            layout = NodeLayout(
                name=state.parent.name,
                root=root,
                nodes=int(raw.get("nodes") or 1),
                cluster_cidr=raw.get("cluster_cidr") or DEFAULT_CIDR,
                runtime=raw.get("runtime") or "containerd",
                ip_family=raw.get("ip_family") or "ipv4",
            )
        except (OSError, ValueError, TypeError, AttributeError, LayoutError):
            continue  # not a state this code wrote: not ours to remove
        if quiet < quiet_s or any(pid_alive(p) for p in pids):
            continue
        report = down(layout, progress=lambda _m: None)
        problems = f" ({'; '.join(report.problems)})" if report.problems else ""
        progress(f"[sweep] cluster {layout.name!r}, left by a run that ended before its cleanup: removed{problems}")
        swept.append(layout.name)
    return swept


def healthz(url: str) -> bool:
    """True if ``url`` answers 200 (used for quick checks)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
