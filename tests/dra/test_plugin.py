"""The kit's kubelet plugin over real unix sockets, serving the network driver's Preparer, driven by a
client that plays the kubelet."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.config import DriverConfig
from driver.dra.health import DeviceHealthFeed
from driver.dra.plugin import KubeletPlugin
from driver.dra.protocol import DeviceHealthState
from driver.kube.client import KubeClient
from driver.metrics import Metrics
from driver.model.device import Device, HostFacts
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.kubelet_client import KubeletClient, devices_of

NODE = "node-a"


def inventory() -> dict[str, Device]:
    return {f"dev-{i}": Device(name=f"dev-{i}", host=HostFacts(ifname=f"eth{i}")) for i in range(4)}


def plugin_of(config: DriverConfig, preparer: Preparer) -> KubeletPlugin:
    """The plugin on the sockets ``config`` names, without health stream or metrics."""
    return KubeletPlugin(preparer, config.driver_name, config.dra_socket, config.registration_socket)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be too long.
    with tempfile.TemporaryDirectory(prefix="dranet-kp-") as d:
        yield Path(d)


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


@pytest.fixture
async def plugin(api: FakeAPIServer, short_tmp: Path) -> AsyncIterator[KubeletPlugin]:
    config = DriverConfig(node_name=NODE, kubelet_root=str(short_tmp / "kubelet"), state_dir=str(short_tmp / "state"))
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(short_tmp / "kubeconfig")))
    preparer = Preparer(kube, CheckpointStore(config.state_dir), ClaimBuilder(inventory, "dra.net", NODE))
    p = KubeletPlugin(
        preparer,
        config.driver_name,
        config.dra_socket,
        config.registration_socket,
        health=DeviceHealthFeed(),
        metrics=Metrics(),
        health_resend=0.5,
    )
    await p.start()
    try:
        yield p
    finally:
        await p.stop(grace=0.1, deregister_delay=0)


async def test_registration(plugin: KubeletPlugin, short_tmp: Path) -> None:
    reg = str(short_tmp / "kubelet/plugins_registry/dra.net-reg.sock")
    dra = str(short_tmp / "kubelet/plugins/dra.net/dra.sock")
    assert stat.S_ISSOCK(os.stat(reg).st_mode) and stat.S_ISSOCK(os.stat(dra).st_mode)
    async with KubeletClient(reg) as kubelet:
        info = await kubelet.get_info()
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "dra.net", dra)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
        await kubelet.notify(True)
        assert plugin.registered is True
        await kubelet.notify(False, "version mismatch")
        assert plugin.registered is False


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_unprepare_over_socket(plugin: KubeletPlugin, api: FakeAPIServer, version: str) -> None:
    api.add_claim(
        make_claim(
            "ns",
            "c1",
            "uid-1",
            [
                result("dev-0", NODE, "nic/a"),
                result("dev-1", NODE, "nic/a"),
                result("gpu0", NODE, "gpu", driver="gpu.example.com"),
            ],
        )
    )
    async with KubeletClient(plugin.registration_socket) as kubelet:
        await kubelet.register()
        resp = await kubelet.prepare([("ns", "c1", "uid-1"), ("ns", "gone", "uid-gone")], version=version)
        assert set(resp.claims) == {"uid-1", "uid-gone"}
        assert resp.claims["uid-1"].error == ""
        assert devices_of(resp, "uid-1") == [(("nic",), NODE, "dev-0"), (("nic",), NODE, "dev-1")]
        assert "not found" in resp.claims["uid-gone"].error
        retry = await kubelet.prepare([("ns", "c1", "uid-1")], version=version)
        assert devices_of(retry, "uid-1") == devices_of(resp, "uid-1")
        un = await kubelet.unprepare([("ns", "c1", "uid-1"), ("ns", "x", "uid-x")], version=version)
        assert {k: v.error for k, v in un.claims.items()} == {"uid-1": "", "uid-x": ""}
    assert isinstance(plugin.driver, Preparer) and isinstance(plugin.metrics, Metrics)
    assert plugin.driver.store.read(lambda s: list(s.claims)) == []
    text = plugin.metrics.render().decode()
    assert 'dranet_driver_dra_plugin_requests_total{method="PrepareResourceClaims",status="failed"} 1.0' in text
    assert 'dranet_driver_dra_plugin_requests_total{method="UnprepareResourceClaims",status="success"} 1.0' in text


async def test_health_stream_sends_complete_list_and_changes(plugin: KubeletPlugin) -> None:
    feed = plugin.health
    assert feed is not None
    await feed.set(
        [DeviceHealthState(NODE, "dev-0", True, ""), DeviceHealthState(NODE, "dev-1", False, "netdev eth1 is missing")]
    )
    async with KubeletClient(plugin.registration_socket) as kubelet:
        await kubelet.get_info()
        stream = kubelet.watch_health()
        first = await asyncio.wait_for(stream.__anext__(), 5)
        got = {(d.device.device_name, d.health, d.message) for d in first.devices}
        assert got == {("dev-0", 1, ""), ("dev-1", 2, "netdev eth1 is missing")}
        await feed.set([DeviceHealthState(NODE, "dev-0", True, ""), DeviceHealthState(NODE, "dev-1", True, "")])
        second = await asyncio.wait_for(stream.__anext__(), 5)
        assert {d.device.device_name: d.health for d in second.devices} == {"dev-0": 1, "dev-1": 1}
        assert all(d.health_check_timeout_seconds == 60 and d.last_updated_time > 0 for d in second.devices)
        # No change: the full list is re-sent anyway so the kubelet never times devices out.
        third = await asyncio.wait_for(stream.__anext__(), 5)
        assert len(third.devices) == 2
        await stream.aclose()


async def test_stop_removes_sockets_and_stale_socket_is_replaced(api: FakeAPIServer, short_tmp: Path) -> None:
    config = DriverConfig(node_name=NODE, kubelet_root=str(short_tmp / "k2"), state_dir=str(short_tmp / "s2"))
    Path(config.registration_socket).parent.mkdir(parents=True)
    Path(config.registration_socket).write_text("stale")  # left by a killed driver
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(short_tmp / "kc2")))
    p = plugin_of(config, Preparer(kube, CheckpointStore(config.state_dir), ClaimBuilder(inventory, "dra.net", NODE)))
    await p.start()
    try:
        async with KubeletClient(p.registration_socket) as kubelet:
            assert "v1alpha1.DRAResourceHealth" not in (await kubelet.get_info()).supported_versions
    finally:
        await p.stop(grace=0.1, deregister_delay=0)
    assert not os.path.exists(config.registration_socket) and not os.path.exists(config.dra_socket)
    async with KubeletClient(config.registration_socket) as kubelet:
        with pytest.raises(grpc.aio.AioRpcError):
            kubelet.timeout = 1
            await kubelet.get_info()


async def test_two_instances_register_side_by_side_and_a_dead_ones_sockets_go(
    api: FakeAPIServer, short_tmp: Path
) -> None:
    """Rolling update: per-instance socket names; an instance that died (kill -9) left sockets
    nobody listens on, which the next instance removes; a live instance's are left alone."""
    kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(short_tmp / "kubeconfig")))

    def plugin(instance: str) -> KubeletPlugin:
        config = DriverConfig(
            node_name=NODE,
            kubelet_root=str(short_tmp / "kubelet"),
            state_dir=str(short_tmp / "state"),
            instance_id=instance,
        )
        return plugin_of(
            config, Preparer(kube, CheckpointStore(config.state_dir), ClaimBuilder(inventory, "dra.net", NODE))
        )

    old, new = plugin("0ld0ld00-aaaa"), plugin("0new0new-bbbb")
    registry, plugins = short_tmp / "kubelet/plugins_registry", short_tmp / "kubelet/plugins/dra.net"
    # What a kill -9'd instance leaves: socket files with no listener.
    for path in (registry / "dra.net-deadbeef-reg.sock", plugins / "dra-deadbeef.sock"):
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(path))
        s.close()
    await old.start()
    await new.start()
    try:
        assert sorted(p.name for p in registry.iterdir()) == ["dra.net-0ld0ld00-reg.sock", "dra.net-0new0new-reg.sock"]
        assert sorted(p.name for p in plugins.iterdir()) == ["dra-0ld0ld00.sock", "dra-0new0new.sock"]
        for p in (old, new):
            async with KubeletClient(p.registration_socket) as client:
                info = await client.get_info()
            assert info.name == "dra.net" and info.endpoint == p.dra_socket
        await old.stop(grace=0.1, deregister_delay=0)
        assert sorted(p.name for p in registry.iterdir()) == ["dra.net-0new0new-reg.sock"]
    finally:
        await old.stop(grace=0.1, deregister_delay=0)
        await new.stop(grace=0.1, deregister_delay=0)
