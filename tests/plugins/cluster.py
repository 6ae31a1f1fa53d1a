"""pytest fixtures for the real control plane (etcd, kube-apiserver, scheduler, controller-manager).

Binaries are found (DRANET_K8S_BIN_DIR, KUBEBUILDER_ASSETS, the ~/.cache/dranet build cache,
PATH) or built once from the Go module proxy *before* the first test runs (in
``pytest_collection_finish``), so a cold build is not cut short by the per-test timeout.
CI runs ``make binaries`` first. Tests skip with the reason only when the binaries are absent
and cannot be built (no Go toolchain, or the build failed).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster.builders.binaries import (
    ControlPlaneBinaries,
    ensure_control_plane,
    find_control_plane,
    go_available,
)
from devcluster.cluster.controlplane import ControlPlane
from driver.kube.client import RESOURCE_API, KubeClient
from driver.kube.errors import KubeError, NotFound

_BINARIES = pytest.StashKey["ControlPlaneBinaries | str"]()


def _uses_cluster(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return any(n in names for n in ("control_plane", "control_plane_binaries", "kube", "cluster_node"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Find or build the binaries once, before any test (and its timeout) starts."""
    if not any(_uses_cluster(i) for i in session.items):
        return
    found = find_control_plane()
    if found is None:
        if not go_available():
            session.config.stash[_BINARIES] = (
                "control plane binaries not found (DRANET_K8S_BIN_DIR, "
                "KUBEBUILDER_ASSETS, ~/.cache/dranet, PATH) and no Go "
                "toolchain to build them; run `make binaries`"
            )
            return
        # Show the build's progress lines (one every ~30 s) instead of capturing them.
        capman = session.config.pluginmanager.getplugin("capturemanager")
        try:
            if capman is not None:
                with capman.global_and_fixture_disabled():
                    found = ensure_control_plane()
            else:
                found = ensure_control_plane()
        except Exception as exc:  # noqa: BLE001 - reported as the skip reason
            session.config.stash[_BINARIES] = f"building the control plane binaries failed: {exc}"
            return
    session.config.stash[_BINARIES] = found


@pytest.fixture(scope="session")
def control_plane_binaries(pytestconfig: pytest.Config) -> ControlPlaneBinaries:
    """Paths of etcd and the three control plane binaries (skips if unavailable)."""
    found = pytestconfig.stash.get(_BINARIES, None)
    if found is None:
        found = find_control_plane() or "control plane binaries not found; run `make binaries`"
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def control_plane(control_plane_binaries: ControlPlaneBinaries) -> Iterator[ControlPlane]:
    """One running control plane for the whole session; always stopped and removed."""
    cp = ControlPlane(control_plane_binaries)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def kube(control_plane: ControlPlane) -> KubeClient:
    """An admin client for the session's control plane (``KubeClient.from_kubeconfig``)."""
    return control_plane.kube()


@pytest.fixture
def cluster_node(control_plane: ControlPlane, kube: KubeClient) -> Iterator[str]:
    """A fresh schedulable Node (unique name); it and every ResourceSlice on it are deleted after."""
    name = f"node-{secrets.token_hex(3)}"
    control_plane.create_node(name)
    try:
        yield name
    finally:
        delete_node_and_slices(kube, name)


def delete_node_and_slices(kube: KubeClient, name: str) -> None:
    """Remove a test node and all slices on it (any driver); ignores what is already gone."""
    try:
        kube.request("DELETE", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={name}"})
    except KubeError:
        pass
    try:
        kube.request("DELETE", f"/api/v1/nodes/{name}")
    except KubeError as exc:
        if not isinstance(exc, NotFound):
            raise


def list_slices(kube: KubeClient, node: str, driver: str = "dra.net") -> list[dict[str, Any]]:
    """The ResourceSlices of ``driver`` on ``node``."""
    return kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.driver={driver},spec.nodeName={node}"}
    )["items"]


@pytest.fixture(scope="session")
def helm() -> str:
    """helm v3 from PATH or the build cache (built from its Go module on first use); skips if impossible."""
    import subprocess

    from devcluster.builders import helm as helm_mod

    path = helm_mod.existing()
    if path:
        return path
    try:
        return helm_mod.build()
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no helm and could not build it: {exc}")


def delete_if_present(kube: KubeClient, path: str) -> None:
    """DELETE an API object; already gone is fine (test cleanup)."""
    try:
        kube.request("DELETE", path)
    except KubeError as exc:
        if not isinstance(exc, NotFound):
            raise
