"""``python -m devcluster up`` / ``down``: a local Kubernetes with one REAL node.

``up`` starts, in this order, and leaves running (every process in its own session, so it
outlives the command):

1. the control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager with the
   controllers a DaemonSet, a Deployment and service accounts need), listening on the node IP;
2. the node: its 8 NICs (veths named like an ND H100 v5's, with the fixture sysfs tree for PCI,
   NUMA and RDMA), containerd 2.2 (NRI + CDI) with runc and the bridge CNI, the images imported,
   and the kubelet;
3. the GPU driver test double as a real kubelet plugin (`devcluster.gpu_plugin`);
4. the driver, installed WITH THE CHART (``helm install charts/dranet``) from the locally built
   image, with a dev-only values file (fixture sysfs mount, the node's paths).

It prints ``KUBECONFIG=<path>`` and ``KUBECTL=<path>``. A second ``up`` while one runs says so
and exits 0. ``down`` removes every process, mount, namespace, veth, cgroup and file the cluster
made, from the layout alone (`devcluster.node_host.sweep`), so it also works after a crashed
``up``. Every path and name derives from `NodeLayout`, so several clusters never collide.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster import helm as helm_mod
from devcluster import images, node_host, sysfs_fixture
from devcluster.binaries import ControlPlaneBinaries, ensure_control_plane
from devcluster.components import NodeBinaries, ensure_node_binaries
from devcluster.controlplane import ControlPlane, ControlPlaneOptions, free_port
from devcluster.driver_image import build_driver_image
from devcluster.node_config import write_node_configs
from devcluster.node_layout import NodeLayout
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "dranet"
RELEASE = "dranet"
DEV_INFINIBAND = Path("/dev/infiniband")
NAMESPACE = "kube-system"
NODE_LABEL = "dranet.dev/cluster"  # on the real node (kubelet --node-labels): <cluster name>
# What a DaemonSet, a Deployment, service-account tokens, webhook endpoints and DRA need.
CONTROLLERS = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "namespace-controller",
    # The MPI Operator's launcher is a batch/v1 Job.
    "job-controller",
    # Evicts pods whose claims hold a device with a NoExecute taint (DRADeviceTaints).
    "device-taint-eviction-controller",
)
FEATURE_GATES = {
    # Device taints in ResourceSlices (dra.net/unhealthy) and the scheduler honouring them.
    "DRADeviceTaints": True,
    # The kubelet's per-device health (DRAResourceHealth stream -> the pod's
    # status.containerStatuses[].allocatedResourcesStatus).
    "ResourceHealthStatus": True,
}
"""Alpha gates of Kubernetes 1.34 the node's tests need; on in every component (and the kubelet)."""
RUNTIME_CONFIG = {
    # With DRADeviceTaints the scheduler waits for its DeviceTaintRule informer (v1alpha3) to sync
    # before it schedules anything: the API must be served.
    "resource.k8s.io/v1alpha3": "true",
}
Progress = Callable[[str], None]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class ClusterState:
    """What ``up`` recorded (JSON in ``layout.state_file``), written as it goes."""

    name: str
    server: str = ""
    kubeconfig: str = ""
    kubectl: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    driver_image: str = ""
    metrics_port: int = 0
    kubelet_port: int = 0
    ready: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    # /dev/infiniband did not exist before `up` (the chart's DirectoryOrCreate makes it): `down`
    # removes it again when empty.
    created_dev_infiniband: bool = False
    # How each node daemon was started, so `restart` can start it again the same way.
    commands: dict[str, list[str]] = field(default_factory=dict)
    path_env: str = ""

    def save(self, layout: NodeLayout) -> None:
        layout.base.mkdir(parents=True, exist_ok=True)
        tmp = layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, layout.state_file)

    @classmethod
    def load(cls, layout: NodeLayout) -> ClusterState | None:
        try:
            return cls(**json.loads(layout.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists()


def running(layout: NodeLayout) -> ClusterState | None:
    """The state of a fully started, still running cluster of this layout, else None."""
    st = ClusterState.load(layout)
    if not st or not st.ready or not st.pids or not all(_pid_alive(p) for p in st.pids.values()):
        return None
    return st


@dataclass
class Binaries:
    """Everything `up` runs, found or built."""

    control_plane: ControlPlaneBinaries
    node: NodeBinaries
    helm: str
    pause: images.ImageArchive
    workload: images.ImageArchive
    driver: images.ImageArchive


def prepare(progress: Progress = _say) -> Binaries:
    """Build or reuse every binary and image (cached under ``~/.cache/dranet``)."""
    cp = ensure_control_plane(progress)
    node = ensure_node_binaries(progress)
    helm = helm_mod.ensure()
    return Binaries(cp, node, helm, images.pause_image(), images.workload_image(), build_driver_image(progress))


def _spawn(
    layout: NodeLayout, name: str, args: list[str], env: dict[str, str] | None = None, st: ClusterState | None = None
) -> int:
    """Start a detached daemon (own session, output to ``logs/<name>.log``); returns its pid.

    With ``st``, records the command (for `restart`) and the pid, and saves the state first.
    """
    if st is not None:
        st.commands[name] = list(args)
    layout.logs.mkdir(parents=True, exist_ok=True)
    with open(layout.logs / f"{name}.log", "ab") as out:
        p = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=REPO,
        )
    if st is not None:
        st.pids[name] = p.pid
        st.save(layout)
    return p.pid


def restart(layout: NodeLayout, name: str, timeout: float = 30.0) -> int:
    """Stop one node daemon (``kubelet``, ``containerd``, ``gpu-plugin``) with SIGTERM and start
    it again with the same command; returns the new pid. Pods keep running (shims stay)."""
    st = ClusterState.load(layout)
    if st is None or name not in st.commands:
        raise RuntimeError(f"cluster {layout.name!r}: no recorded command for {name!r}")
    node_host.kill_pids([st.pids[name]], grace=timeout)
    env = dict(os.environ, PATH=st.path_env or os.environ.get("PATH", ""))
    return _spawn(layout, name, st.commands[name], env, st)


def _log_tail(layout: NodeLayout, name: str, n: int = 25) -> str:
    try:
        return "\n".join((layout.logs / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _wait_pid(
    layout: NodeLayout, st: ClusterState, name: str, predicate: Callable[[], Any], timeout: float, what: str
) -> Any:
    """Wait for ``predicate``; fail early with the log tail if the process ``name`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(st.pids[name]):
            raise RuntimeError(f"{name} exited while waiting for {what}:\n{_log_tail(layout, name)}")
        try:
            v = predicate()
            if v:
                return v
        except (OSError, KubeError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}:\n{_log_tail(layout, name)}")


def build_fixture(layout: NodeLayout) -> Path:
    """The ND H100 v5 sysfs tree with the layout's NIC names (``ib0``.. or ``<prefix>0``..)."""
    topo = sysfs_fixture.load_topology(layout.topology)
    if layout.nic_prefix != "ib":
        for dev in topo.get("pci", []):
            for net in dev.get("net", []):
                if net["name"].startswith("ib"):
                    net["name"] = layout.nic_prefix + net["name"][2:]
    shutil.rmtree(layout.sysfs, ignore_errors=True)
    return sysfs_fixture.build(topo, layout.sysfs)


def dev_values(layout: NodeLayout, st: ClusterState, image_ref: str) -> dict[str, Any]:
    """The DEV-ONLY Helm values: this node's paths, the fixture sysfs, the apiserver address.

    Everything else (DaemonSet, security context, RBAC, node policy, DeviceClass, webhook) is
    the chart's default.
    """
    repo, _, tag = image_ref.rpartition(":")
    api_host, api_port = st.server.removeprefix("https://").rsplit(":", 1)
    api_env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": api_host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
    ]
    return {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "kubeletRootDir": str(layout.kubelet_root),
        "nri": {"enabled": True, "socket": str(layout.nri_socket)},
        "netnsDir": str(layout.netns_dir),
        "stateDir": str(layout.driver_state_dir),
        "runtimeDir": str(layout.driver_runtime_dir),
        "metricsPort": st.metrics_port,
        # The fixture's uplink (the host's own uplink is excluded as the default-route link).
        "excludeInterfaces": ["eth0"],
        # The fixture sysfs describes the machine (PCI, NUMA, RDMA); the veths named like its
        # NICs are what the driver moves.
        "extraArgs": [f"--sysfs-root={layout.sysfs}"],
        "extraVolumes": [{"name": "fixture-sysfs", "hostPath": {"path": str(layout.sysfs), "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "fixture-sysfs", "mountPath": str(layout.sysfs), "readOnly": True}],
        # No kube-proxy here: pods reach the apiserver at the node IP directly.
        "extraEnv": api_env,
        # Only the real node: tests add Node objects without a kubelet (a second MPI worker's
        # node), where a driver pod would wait forever.
        "nodeSelector": {NODE_LABEL: layout.name},
        "webhook": {"replicas": 1, "extraEnv": api_env, "nodeSelector": {NODE_LABEL: layout.name}},
    }


def _kubelet_ready(kube: KubeClient, node: str) -> bool:
    n = kube.read_node(node)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))


def _release_items(kube: KubeClient, path: str, selector: str = "") -> list[dict[str, Any]]:
    """The objects at ``path`` of the driver's Helm release (plus ``selector``)."""
    labels = ",".join(x for x in (f"app.kubernetes.io/instance={RELEASE}", selector) if x)
    items: list[dict[str, Any]] = kube.request("GET", path, query={"labelSelector": labels})["items"]
    return items


def _rollout_done(kube: KubeClient) -> bool:
    ds = kube.request("GET", f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{RELEASE}")
    s = ds.get("status", {})
    if not (s.get("desiredNumberScheduled", 0) >= 1 and s.get("numberReady", 0) == s["desiredNumberScheduled"]):
        return False
    deps = _release_items(kube, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")
    return all(d.get("status", {}).get("readyReplicas", 0) >= d["spec"].get("replicas", 1) for d in deps)


def _dra_slices(kube: KubeClient, node: str) -> bool:
    items = kube.request("GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={node}"})[
        "items"
    ]
    drivers = {s["spec"]["driver"] for s in items if s["spec"].get("devices")}
    return {"dra.net", "gpu.nvidia.com"} <= drivers


def up(layout: NodeLayout, progress: Progress = _say) -> ClusterState:
    """Start everything (see the module docstring); on failure remove what was started."""
    existing = running(layout)
    if existing:
        progress(f"cluster {layout.name!r} is already running ({layout.base}); `python -m devcluster down` stops it")
        return existing
    t0 = time.monotonic()
    bins = prepare(progress)
    t_prep = time.monotonic() - t0
    node_host.sweep(layout)  # leftovers of a crashed `up` of the same name
    st = ClusterState(name=layout.name, metrics_port=free_port())
    try:
        _up(layout, bins, st, progress)
    except BaseException:
        progress(
            f"up failed; logs in {layout.logs} are removed by the cleanup, copying them to "
            f"/tmp/dranet-{layout.name}-failed-logs"
        )
        shutil.rmtree(f"/tmp/dranet-{layout.name}-failed-logs", ignore_errors=True)
        if layout.logs.is_dir():
            shutil.copytree(layout.logs, f"/tmp/dranet-{layout.name}-failed-logs")
        down(layout, progress=lambda _m: None)
        raise
    st.timings = {"prepare_s": round(t_prep, 1), "start_s": round(time.monotonic() - t0 - t_prep, 1)}
    st.ready = True
    st.save(layout)
    return st


def _up(layout: NodeLayout, bins: Binaries, st: ClusterState, progress: Progress) -> None:
    node = layout.node_name
    layout.base.mkdir(parents=True, exist_ok=True)
    st.save(layout)
    node_host.share_base(layout)
    if node_host.make_shared(Path("/dev")):
        progress("[up] /dev made a shared mount (as on systemd hosts) for the chart's HostToContainer mount")
    st.created_dev_infiniband = not DEV_INFINIBAND.exists()
    st.save(layout)
    progress(
        f"[up] node {node}: fixture sysfs ({layout.topology}), NICs {', '.join(layout.nics)}, "
        f"CNI bridge {layout.cni_bridge} at {layout.node_ip}"
    )
    build_fixture(layout)
    node_host.create_nics(layout)
    node_host.create_bridge(layout)
    progress("[up] control plane")
    opts = ControlPlaneOptions(
        controllers=CONTROLLERS,
        feature_gates=dict(FEATURE_GATES),
        runtime_config=dict(RUNTIME_CONFIG),
        bind_address=layout.node_ip,
        detached=True,
        keep_dir=True,
        disable_admission_plugins=("TaintNodesByCondition",),
        # Webhook calls go to the endpoint (pod IP on the bridge): there is no service proxy.
        # The kubelet (logs, exec) by its InternalIP, the node IP: no name lookups.
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

    progress("[up] containerd (NRI, CDI, runc, bridge CNI) and images")
    node_host.create_cgroup_root(layout)
    st.kubelet_port = free_port()
    write_node_configs(
        layout, bins.node, kubelet_port=st.kubelet_port, healthz_port=free_port(), feature_gates=FEATURE_GATES
    )
    env = dict(os.environ, PATH=":".join([*bins.node.path_dirs, os.environ.get("PATH", "")]))
    st.path_env = env["PATH"]
    _spawn(layout, "containerd", [str(bins.node.containerd), "--config", str(layout.containerd_config)], env, st)
    _wait_pid(layout, st, "containerd", lambda: layout.containerd_socket.is_socket(), 60, "containerd's socket")
    address = str(layout.containerd_socket)
    for img in (bins.pause, bins.workload, bins.driver):
        images.import_image(bins.node.ctr, address, img)
    st.driver_image = bins.driver.ref

    progress("[up] kubelet")
    _spawn(
        layout,
        "kubelet",
        [
            str(bins.node.kubelet),
            f"--config={layout.kubelet_config}",
            f"--kubeconfig={layout.kubeconfig}",
            f"--hostname-override={node}",
            f"--node-ip={layout.node_ip}",
            f"--root-dir={layout.kubelet_root}",
            f"--node-labels={NODE_LABEL}={layout.name}",
            "--v=2",
        ],
        env,
        st,
    )
    _wait_pid(layout, st, "kubelet", lambda: _kubelet_ready(kube, node), 120, f"node {node} Ready")

    progress("[up] GPU driver test double (kubelet plugin gpu.nvidia.com)")
    _spawn(
        layout,
        "gpu-plugin",
        [
            sys.executable,
            "-m",
            "devcluster.gpu_plugin",
            "--kubeconfig",
            str(layout.kubeconfig),
            "--node-name",
            node,
            "--kubelet-root",
            str(layout.kubelet_root),
            "--cdi-dir",
            str(layout.cdi_dir),
        ],
        None,
        st,
    )

    progress(f"[up] helm install {RELEASE} charts/dranet (image {bins.driver.ref})")
    layout.values_file.write_text(yaml.safe_dump(dev_values(layout, st, bins.driver.ref), sort_keys=False))
    _wait_pid(
        layout,
        st,
        "kube-controller-manager",
        lambda: _sa_ready(kube, NAMESPACE),
        60,
        "the kube-system service accounts",
    )
    helm(layout, "install", helm_binary=bins.helm)
    _wait_pid(layout, st, "kubelet", lambda: _rollout_done(kube), 180, "the dranet DaemonSet and webhook to be ready")
    _wait_pid(
        layout, st, "gpu-plugin", lambda: _dra_slices(kube, node), 60, "dra.net and gpu.nvidia.com ResourceSlices"
    )


def tag_image(layout: NodeLayout, source: str, target: str) -> str:
    """A second name for an image in the node's containerd (``ctr images tag``), e.g. the driver
    image under a new tag for an upgrade test: the same image, as a registry would serve it."""
    ctr = ensure_node_binaries(lambda _m: None).ctr
    return images.tag_image(ctr, str(layout.containerd_socket), source, target)


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
        # The kubelet first, so it does not restart what we stop.
        first = [st.pids[k] for k in ("kubelet",) if k in st.pids]
    report = node_host.sweep(layout, first=first)
    if st and st.created_dev_infiniband:
        try:
            DEV_INFINIBAND.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            report.problems.append(f"{DEV_INFINIBAND} kept: {exc}")
    for p in report.problems:
        progress(f"[down] {p}")
    progress(f"[down] cluster {layout.name!r} removed" + (" (with problems above)" if report.problems else ""))
    return report


def healthz(url: str) -> bool:
    """True if ``url`` answers 200 (used for quick checks)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
