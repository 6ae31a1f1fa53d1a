"""A running pod's device metadata file and CDI spec, deleted or damaged: its next container gets
them back as it read them, with the driver running and after a driver restart.

The whole daemon runs in-process (``Daemon.run``) on the host's ``/sys`` and netlink against the
stub API server; the kubelet is played over the real gRPC sockets, the container runtime by
containerd/nri's adaptation (the Go harness: RunPodSandbox, then CreateContainer for each
container start, a restarted container's too); a real veth NIC moves into a real pod namespace.
The runtime resolves CDI devices before any NRI hook, so a damaged CDI spec is left to the
driver's background check.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from collections.abc import Callable

import pytest

from driver.checkpoint.store import CheckpointStore
from driver.daemon.lifecycle import Daemon
from driver.inventory.names import netdev_device_name
from driver.kube.client import KubeClient
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.kubelet_client import KubeletClient
from harness.netns import NetnsFactory
from harness.nri import Harness, ip, link_facts, pod_json
from tests.support.daemon_config import node_config, work_dir
from tests.support.damage import DAMAGE, empty, half, zero

pytestmark = [pytest.mark.root, pytest.mark.slow]

POD_MTU = 1450  # the NIC's MTU once prepared: not the one the scan before published (1500)
KUBELET_BACKOFF = 10.0
"""Seconds the kubelet waits before it tries a container that failed to start again: a broken CDI
spec must be right by then."""


async def _until(pred: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_restarted_container_reads_its_files_as_before(
    nri_harness: Harness, netns_factory: NetnsFactory
) -> None:
    prefix = f"of{secrets.token_hex(3)}"
    peer_ns = netns_factory.netns()
    nic, peer = netns_factory.veth(f"{prefix}a", f"q{prefix[1:]}a", peer_netns=peer_ns)
    ip("-n", peer_ns, "link", "set", peer, "up")
    ip("link", "set", nic, "up")
    node, pod_uid, device = f"node-{prefix}", f"uid-{secrets.token_hex(4)}", netdev_device_name(nic)
    api = FakeAPIServer().start()
    api.add_claim(make_claim("ns", "c1", "uid-c1", [result(device, node, "a")], pods=[pod_uid]))
    work = work_dir("of")
    run_dir = work / "run"
    config = node_config(node, prefix, nri_harness.socket, api.write_kubeconfig(work / "kubeconfig"), work)
    meta = run_dir / "dranet/dra-device-metadata/ns_c1/a/metadata.json"
    spec = run_dir / "cdi/dra.net_metadata_uid-c1_a.json"
    pod = pod_json(pod_uid, "")

    async def start(syncs: int) -> tuple[Daemon, asyncio.Task[int]]:
        store = CheckpointStore(config.state_dir, config.runtime_dir)
        daemon = Daemon(config, KubeClient.from_kubeconfig(config.kubeconfig), store)
        task = asyncio.create_task(daemon.run())
        await _until(lambda: daemon.device_sync.scanned, "the first scan")
        assert (await asyncio.to_thread(nri_harness.cmd, "wait-sync", count=syncs, timeout=20))["ok"]
        return daemon, task

    async def stop(daemon: Daemon, task: asyncio.Task[int]) -> None:
        daemon.stopping.set()
        await asyncio.wait_for(task, 30)

    async def container_starts() -> None:
        assert (await asyncio.to_thread(nri_harness.cmd, "create", pod=pod))["ok"]

    try:
        daemon, task = await start(1)
        try:
            async with KubeletClient(config.registration_socket) as kubelet:
                await kubelet.register()
                assert (await kubelet.prepare([("ns", "c1", "uid-c1")])).claims["uid-c1"].error == ""
            ip("link", "set", nic, "mtu", str(POD_MTU))  # after the scan that published 1500
            pod_ns = netns_factory.netns()
            pod = pod_json(pod_uid, f"/run/netns/{pod_ns}")
            assert (await asyncio.to_thread(nri_harness.cmd, "run", pod=pod))["ok"]
            await container_starts()
            read, cdi = meta.read_bytes(), spec.read_bytes()
            doc = json.loads(read.splitlines()[0])
            [entry] = doc["requests"][0]["devices"]
            inside = link_facts(nic, netns=pod_ns)
            assert inside is not None and inside["mtu"] == POD_MTU
            assert doc["metadata"]["generation"] == 2
            assert entry["networkData"]["interfaceName"] == nic
            assert entry["networkData"]["hardwareAddress"] == inside["mac"]
            assert entry["attributes"]["dra.net/podMTU"] == {"int": POD_MTU}  # the pod's link, not the published

            # The driver running: each container start finds the file as it was read.
            for name, spoil in DAMAGE.items():
                spoil(meta)
                await container_starts()
                assert meta.read_bytes() == read, f"metadata file {name}: not written again as read"
            # The runtime reads the CDI spec before any hook: the background check mends it.
            half(spec)
            await _until(lambda: spec.read_bytes() == cdi, "the CDI spec written again", KUBELET_BACKOFF)
            await _until(
                lambda: any(e["reason"] == "DranetFilesMended" for _, e in api.posted_events), "the Node event", 10
            )
            metrics = daemon.metrics.render().decode()
            for kind, reason in [("metadata", "missing"), ("metadata", "truncated"), ("metadata", "unparsable")]:
                assert f'state_files_mended_total{{kind="{kind}",reason="{reason}"}}' in metrics, metrics[-2000:]
            assert 'state_files_mended_total{kind="cdi",reason="truncated"} 1.0' in metrics
        finally:
            await stop(daemon, task)

        # A driver restart: the pod's view comes back from its state, before the kubelet plugin serves.
        for name, spoil in DAMAGE.items():
            spoil(meta)
            zero(spec)
            daemon, task = await start(2 + list(DAMAGE).index(name))
            try:
                assert meta.read_bytes() == read, f"metadata file {name}: not restored as read"
                assert spec.read_bytes() == cdi
            finally:
                await stop(daemon, task)

        daemon, task = await start(2 + len(DAMAGE))
        try:
            empty(meta)
            await container_starts()
            assert meta.read_bytes() == read
            assert (await asyncio.to_thread(nri_harness.cmd, "stop", pod=pod))["ok"]
            async with KubeletClient(config.registration_socket) as kubelet:
                await kubelet.register()
                assert (await kubelet.unprepare([("ns", "c1", "uid-c1")])).claims["uid-c1"].error == ""
            # Removed after the answer, by the next check (every KEEP_FILES_INTERVAL).
            await _until(lambda: not meta.exists() and not spec.exists(), "the files removed", 10)
        finally:
            await stop(daemon, task)
    finally:
        api.stop()
        shutil.rmtree(work, ignore_errors=True)
