"""The real control plane: starts, serves resource.k8s.io/v1, tears down without leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devcluster.binaries import K8S_VERSION, ControlPlaneBinaries
from devcluster.controlplane import ControlPlane, ControlPlaneError, ControlPlaneOptions
from driver.kube import KubeClient

pytestmark = [pytest.mark.cluster]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _procs_mentioning(text: str) -> list[int]:
    """PIDs whose command line mentions ``text`` (catches grandchildren, too)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def test_serves_resource_v1(kube: KubeClient):
    groups = kube.request("GET", "/apis/resource.k8s.io/v1")
    names = {r["name"] for r in groups["resources"]}
    assert {"resourceslices", "deviceclasses", "resourceclaims", "resourceclaimtemplates"} <= names
    assert kube.request("GET", "/version")["gitVersion"] == K8S_VERSION


def test_all_components_running(control_plane: ControlPlane):
    assert [p.name for p in control_plane.procs] == [
        "etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"]
    assert all(_alive(pid) for pid in control_plane.pids())
    assert control_plane.kubeconfig is not None and control_plane.kubeconfig.is_file()


def test_node_is_schedulable(control_plane: ControlPlane, cluster_node: str):
    node = control_plane.kube().get_node(cluster_node)
    assert node["status"]["allocatable"]["pods"] == "110"
    assert not node["spec"].get("taints"), "TaintNodesByCondition must be disabled"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == cluster_node


def test_stop_leaves_no_processes_or_files(control_plane_binaries: ControlPlaneBinaries, tmp_path: Path):
    cp = ControlPlane(control_plane_binaries, base_dir=str(tmp_path))
    cp.start()
    try:
        pids, workdir = cp.pids(), cp.dir
        assert workdir is not None and len(pids) == 4
        assert cp.kube().request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
    finally:
        cp.stop()
    assert not any(_alive(p) for p in pids)
    assert not workdir.exists()
    assert _procs_mentioning(str(workdir)) == []


def test_failed_start_cleans_up(control_plane_binaries: ControlPlaneBinaries, tmp_path: Path):
    cp = ControlPlane(control_plane_binaries, base_dir=str(tmp_path),
                      options=ControlPlaneOptions(feature_gates={"NoSuchFeatureGate": True}, start_timeout=30))
    with pytest.raises(ControlPlaneError, match="kube-apiserver"):
        cp.start()
    assert list(tmp_path.iterdir()) == []
    assert _procs_mentioning(str(tmp_path)) == []
