"""A node reboot: the driver's tmpfs state is gone, the kubelet's own checkpoint is kept, and every
pod restarts with its NICs, here without any NodePrepareResources (the kubelet 1.37 prepares again
after its own restart; the driver does not depend on it, see driver/checkpoint/location.py).

The whole daemon runs in-process (``Daemon.run``) on the host's ``/sys`` and netlink against the
stub API server; the kubelet is played over the real gRPC sockets, the container runtime by
containerd/nri's adaptation (the Go harness); real veth NICs move into real pod namespaces.

The reboot is played as the next boot would find the node: the driver stopped, the pod's
namespace gone and its NICs back in the host under their own names, down and without addresses;
``/run`` (the driver's claims, pod state and metadata files) and ``/var/run/cdi`` empty; the
kubelet plugin directory (disk) kept, with the driver's marker that it ran on this node.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from driver.checkpoint import location
from driver.checkpoint.store import CheckpointStore
from driver.daemon.lifecycle import Daemon
from driver.inventory.names import netdev_device_name
from driver.kube.client import KubeClient
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from harness.kubelet_client import KubeletClient
from harness.netns import NetnsFactory
from harness.nri import Harness, ip, link_facts, pod_json
from tests.support.daemon_config import node_config, work_dir

pytestmark = [pytest.mark.root, pytest.mark.slow]

ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


async def _until(pred, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _as_after_a_boot(pod_ns: str, pod_names: list[str], host_names: list[str]) -> None:
    """The NICs as a fresh boot shows them: in the host, own names, down, no addresses."""
    for pod_name, name in zip(pod_names, host_names, strict=True):
        ip("-n", pod_ns, "link", "set", pod_name, "down")
        ip("-n", pod_ns, "link", "set", pod_name, "name", name)
        ip("-n", pod_ns, "link", "set", name, "netns", "1")
        ip("addr", "flush", "dev", name)
        ip("link", "set", name, "mtu", "1500")


async def test_after_a_reboot_every_pod_restarts_with_its_nics(
    nri_harness: Harness, netns_factory: NetnsFactory
) -> None:
    prefix = f"rb{secrets.token_hex(3)}"
    peer_ns = netns_factory.netns()
    nics = []
    for suffix in "ab":
        name, peer = netns_factory.veth(f"{prefix}{suffix}", f"q{prefix[1:]}{suffix}", peer_netns=peer_ns)
        ip("-n", peer_ns, "link", "set", peer, "up")
        ip("link", "set", name, "up")
        nics.append(name)
    node = f"node-{prefix}"
    pod_uid = f"uid-{secrets.token_hex(4)}"
    devices = [netdev_device_name(n) for n in nics]
    config_of_nic0 = {
        "requests": ["a"],
        "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 1400, "addresses": ["192.168.79.2/24"]}}},
    }
    api = FakeAPIServer().start()
    api.add_claim(
        make_claim(
            "ns",
            "c1",
            "uid-c1",
            [result(d, node, r) for d, r in zip(devices, "ab", strict=True)],
            [config_of_nic0],
            pods=[pod_uid],
        )
    )
    work = work_dir("rb")
    run_dir = work / "run"
    config = node_config(node, prefix, nri_harness.socket, api.write_kubeconfig(work / "kubeconfig"), work)

    async def start() -> tuple[Daemon, asyncio.Task[int]]:
        store = CheckpointStore(config.state_dir, config.runtime_dir)
        daemon = Daemon(config, KubeClient.from_kubeconfig(config.kubeconfig), store)
        return daemon, asyncio.create_task(daemon.run())

    async def stop(daemon: Daemon, task: asyncio.Task[int]) -> None:
        daemon.stopping.set()
        await asyncio.wait_for(task, 30)

    def pod_side(pod_ns: str) -> list[dict | None]:  # type: ignore[type-arg]
        return [link_facts(n, netns=pod_ns) for n in nics]  # no name in the config: their own

    try:
        # Before the reboot: prepared by the kubelet, the pod started with its two NICs.
        daemon, task = await start()
        try:
            await _until(lambda: daemon.device_sync.scanned, "the first scan")
            assert (await asyncio.to_thread(nri_harness.cmd, "wait-sync", count=1, timeout=20))["ok"]
            async with KubeletClient(config.registration_socket) as kubelet:
                await kubelet.register()
                resp = await kubelet.prepare([("ns", "c1", "uid-c1")])
                assert resp.claims["uid-c1"].error == ""
            pod_ns = netns_factory.netns()
            assert (await asyncio.to_thread(nri_harness.cmd, "run", pod=pod_json(pod_uid, f"/run/netns/{pod_ns}")))[
                "ok"
            ]
            first = pod_side(pod_ns)
            assert all(first) and first[0]["mtu"] == 1400 and "192.168.79.2/24" in first[0]["addresses"]
            assert not daemon.claims_damage and len(api.requests) > 0
        finally:
            await stop(daemon, task)
        lists = api.count("GET", ALL_CLAIMS)
        assert lists == 0  # the node's first start: nothing to record

        # The reboot.
        pod_names = [f["ifname"] for f in first if f]
        _as_after_a_boot(pod_ns, pod_names, nics)
        shutil.rmtree(run_dir)
        assert Path(config.plugin_dir, location.RAN_MARKER).exists()  # on disk: kept

        # After it: no NodePrepareResources (the kubelet's checkpoint says prepared), a new sandbox.
        daemon, task = await start()
        try:
            await _until(lambda: daemon.device_sync.scanned, "the first scan after the reboot")
            assert (await asyncio.to_thread(nri_harness.cmd, "wait-sync", count=2, timeout=20))["ok"]
            stored = daemon.store.read(lambda s: {u: sorted(d.device for d in c.devices) for u, c in s.claims.items()})
            assert stored == {"uid-c1": sorted(devices)}, "the claim was not recorded from the API server"
            # Its device metadata and CDI spec are there again before any container is created.
            meta = run_dir / "dranet/dra-device-metadata/ns_c1/a/metadata.json"
            spec = run_dir / "cdi/dra.net_metadata_uid-c1_a.json"
            assert meta.is_file() and spec.is_file()
            doc = json.loads(meta.read_text().splitlines()[0])
            assert [d["name"] for d in doc["requests"][0]["devices"]] == devices[:1]
            assert (run_dir / "cdi/dra.net_metadata_uid-c1_b.json").is_file()

            new_ns = netns_factory.netns()
            assert (await asyncio.to_thread(nri_harness.cmd, "run", pod=pod_json(pod_uid, f"/run/netns/{new_ns}")))[
                "ok"
            ]
            again = pod_side(new_ns)
            assert all(again), "the restarted pod did not get its NICs"
            assert again[0]["mtu"] == 1400 and "192.168.79.2/24" in again[0]["addresses"]
            assert {f["mac"] for f in again if f} == {f["mac"] for f in first if f}  # the same NICs
            assert all(link_facts(n) is None for n in nics)  # not in the host any more

            assert (await asyncio.to_thread(nri_harness.cmd, "stop", pod=pod_json(pod_uid, f"/run/netns/{new_ns}")))[
                "ok"
            ]
            assert all(link_facts(n) is not None for n in nics), "a NIC did not come home"
            async with KubeletClient(config.registration_socket) as kubelet:
                await kubelet.register()
                un = await kubelet.unprepare([("ns", "c1", "uid-c1")])
                assert un.claims["uid-c1"].error == ""
            assert daemon.store.read(lambda s: list(s.claims)) == []
            await _until(lambda: not meta.exists() and not spec.exists(), "the files removed after the answer", 10)
        finally:
            await stop(daemon, task)
        assert api.count("GET", ALL_CLAIMS) == lists + 1  # recorded from one LIST
    finally:
        api.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
