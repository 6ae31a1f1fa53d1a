"""The real control plane: starts, serves resource.k8s.io/v1, tears down without leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devcluster.builders.binaries import K8S_VERSION, ControlPlaneBinaries
from devcluster.cluster.controlplane import ControlPlane, ControlPlaneError, ControlPlaneOptions
from driver.kube.client import KubeClient

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
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
    ]
    assert all(_alive(pid) for pid in control_plane.pids())
    assert control_plane.kubeconfig is not None and control_plane.kubeconfig.is_file()


def test_node_is_schedulable(control_plane: ControlPlane, cluster_node: str):
    node = control_plane.kube().read_node(cluster_node)
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
    cp = ControlPlane(
        control_plane_binaries,
        base_dir=str(tmp_path),
        options=ControlPlaneOptions(feature_gates={"NoSuchFeatureGate": True}, start_timeout=30),
    )
    with pytest.raises(ControlPlaneError, match="kube-apiserver"):
        cp.start()
    assert list(tmp_path.iterdir()) == []
    assert _procs_mentioning(str(tmp_path)) == []


def test_build_go_tool_builds_once_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil
    import subprocess

    from devcluster.builders.binaries import GoBuild, build_go_tool

    if shutil.which("go") is None:
        pytest.skip("no Go toolchain")
    monkeypatch.setenv("DRANET_CACHE_DIR", str(tmp_path))
    main_go = 'package main\nimport "fmt"\nvar v = "dev"\nfunc main() { fmt.Println("hello", v) }\n'
    lines: list[str] = []
    bin_dir = build_go_tool(
        "hello",
        "v1",
        "module example.invalid/hello\n\ngo 1.24.0\n",
        [GoBuild(packages=(".",), output="hello", ldflags="-s -w -X main.v=v1")],
        expect=("hello",),
        progress=lines.append,
        extra_files={"main.go": main_go},
    )
    assert bin_dir == tmp_path / "hello" / "v1" / "bin"
    assert subprocess.run([str(bin_dir / "hello")], capture_output=True, text=True).stdout == "hello v1\n"
    assert any("built hello" in line for line in lines)
    lines.clear()
    again = build_go_tool(
        "hello", "v1", "unused", [GoBuild(packages=(".",), output="hello")], expect=("hello",), progress=lines.append
    )
    assert again == bin_dir and lines == []  # cached: no go invocation at all
    assert not (tmp_path / "hello" / "v1" / "bin.tmp").exists()


def test_existing_binaries_are_version_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from devcluster.builders.binaries import find_binary

    def fake(name: str, version_line: str) -> Path:
        p = tmp_path / name
        p.write_text(f"#!/bin/sh\necho '{version_line}'\n")
        p.chmod(0o755)
        return p

    monkeypatch.setenv("DRANET_K8S_BIN_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("DRANET_CACHE_DIR", str(tmp_path / "empty-cache"))
    ok = fake("kube-scheduler", "Kubernetes v1.34.3")
    fake("kube-apiserver", "Kubernetes v1.33.9")
    assert find_binary("kube-scheduler", "1.34") == ok
    assert find_binary("kube-apiserver", "1.34") is None
