"""The kit drives a DRA driver that knows nothing of NICs: a toy of a few dozen lines, served over the
real unix sockets to a client that plays the kubelet, its devices published to the real apiserver
(tests/plugins/cluster.py)."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from driver.dra.dra_service import PREPARE, UNPREPARE
from driver.dra.helper import Helper
from driver.dra.protocol import ClaimRef, DeviceHealthState, PrepareResult, ResultDevice
from driver.dra.slices import MAX_DEVICES_PER_SLICE
from driver.kube.client import KubeClient
from harness.kubelet_client import KubeletClient, devices_of
from tests.dra.test_publisher_apiserver import eventually
from tests.plugins.cluster import list_slices

pytestmark = [pytest.mark.cluster]
DRIVER = "gadget.example.com"


# -- the toy driver: everything a DRA driver gives the kit ---------------------------------------


@dataclass(frozen=True)
class Gadget:
    name: str
    color: str = "red"

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name, "attributes": {f"{DRIVER}/color": {"string": self.color}}}


@dataclass
class ToyDriver:
    """Hands out gadget-0 to every claim not named ``bad-*``; a broken gadget is unhealthy."""

    pool: str
    gadgets: list[Gadget]
    prepared: dict[str, ClaimRef] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out = {}
        for c in claims:
            if c.name.startswith("bad-"):
                out[c.uid] = PrepareResult(error=f"{c.name}: no gadget for you")
                continue
            self.prepared[c.uid] = c
            cdi = [f"{DRIVER}/gadget={c.name}"]
            out[c.uid] = PrepareResult(devices=[ResultDevice(["gadget"], self.pool, "gadget-0", cdi)])
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        for c in claims:
            self.prepared.pop(c.uid, None)
        return {c.uid: "" for c in claims}

    def devices(self) -> list[Gadget]:
        return list(self.gadgets)

    def counter_sets(self, devices: Sequence[Any]) -> list[dict[str, Any]]:
        return []  # gadgets are whole devices

    def device_taints(self, devices: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
        return {}  # a gadget is tainted only for its health

    async def health(self) -> list[DeviceHealthState]:
        return [
            DeviceHealthState(self.pool, g.name, g.name not in self.broken, "broken" if g.name in self.broken else "")
            for g in self.gadgets
        ]


# -- the test ----------------------------------------------------------------------------------


@dataclass
class Calls:
    """Records what the kit reports of the kubelet's calls (its RequestMetrics)."""

    seen: list[tuple[str, bool, int]] = field(default_factory=list)

    def observe_request(self, method: str, ok: bool, seconds: float, claim_errors: int = 0) -> None:
        self.seen.append((method, ok, claim_errors))


@pytest.fixture
async def toy(kube: KubeClient, cluster_node: str) -> AsyncIterator[tuple[ToyDriver, Helper[Gadget], Calls]]:
    driver = ToyDriver(cluster_node, [Gadget(f"gadget-{i}") for i in range(MAX_DEVICES_PER_SLICE + 2)])
    calls = Calls()
    with tempfile.TemporaryDirectory(prefix="dranet-toy-") as d:  # AF_UNIX paths: 107 bytes
        helper = Helper(
            driver,
            kube,
            driver_name=DRIVER,
            node_name=cluster_node,
            dra_socket=str(Path(d) / "plugins" / DRIVER / "dra.sock"),
            registration_socket=str(Path(d) / "plugins_registry" / f"{DRIVER}-reg.sock"),
            taint_key=f"{DRIVER}/broken",
            publish_interval=0.2,
            health_interval=0.05,
            metrics=calls,
        )
        await helper.check_taints()
        await helper.start()
        tasks = [asyncio.create_task(helper.publish()), asyncio.create_task(helper.watch_health())]
        try:
            yield driver, helper, calls
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await helper.stop(grace=0.1, deregister_delay=0)


async def test_the_kubelet_calls_reach_the_toy_driver(toy: tuple[ToyDriver, Helper[Gadget], Calls]) -> None:
    driver, helper, calls = toy
    async with KubeletClient(helper.plugin.registration_socket) as kubelet:
        info = await kubelet.register()
        assert (info.name, info.endpoint) == (DRIVER, helper.plugin.dra_socket)
        assert helper.registered is True and helper.serving
        resp = await kubelet.prepare([("ns", "c1", "uid-1"), ("ns", "bad-1", "uid-2")], version="v1beta1")
        assert devices_of(resp, "uid-1") == [(("gadget",), driver.pool, "gadget-0")]
        assert list(resp.claims["uid-1"].devices[0].cdi_device_ids) == [f"{DRIVER}/gadget=c1"]
        assert resp.claims["uid-2"].error == "bad-1: no gadget for you"
        assert list(driver.prepared) == ["uid-1"]
        un = await kubelet.unprepare([("ns", "c1", "uid-1")])
        assert un.claims["uid-1"].error == "" and driver.prepared == {}
    assert calls.seen == [(PREPARE, False, 1), (UNPREPARE, True, 0)]


async def test_the_toy_drivers_devices_are_published_and_follow_its_changes(
    toy: tuple[ToyDriver, Helper[Gadget], Calls], kube: KubeClient, cluster_node: str
) -> None:
    driver, helper, _calls = toy

    def slices_of(count: int) -> list[dict[str, Any]] | None:
        """The pool's slices once it is complete with ``count`` of them: the newest generation, each
        saying the pool has that many (what the scheduler reads; leftovers of an older generation
        beside it are ignored by readers, and so here)."""
        found = list_slices(kube, cluster_node, DRIVER)
        newest = max((s["spec"]["pool"]["generation"] for s in found), default=0)
        pool = [s for s in found if s["spec"]["pool"]["generation"] == newest]
        complete = all(s["spec"]["pool"]["resourceSliceCount"] == len(pool) for s in pool)
        return pool if complete and len(pool) == count else None

    helper.devices_changed()
    # 130 devices: two slices of one pool (the apiserver refuses more than 128 in one).
    slices = await eventually(lambda: slices_of(2), what="two slices")
    assert sorted(len(s["spec"]["devices"]) for s in slices) == [2, MAX_DEVICES_PER_SLICE]
    assert {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices} == {(cluster_node, 2)}
    device = next(d for s in slices for d in s["spec"]["devices"] if d["name"] == "gadget-7")
    assert device["attributes"] == {f"{DRIVER}/color": {"string": "red"}}
    writes = helper.publisher.stats.writes
    helper.devices_changed()  # nothing changed: nothing written
    await asyncio.sleep(0.6)
    assert helper.publisher.stats.writes == writes
    driver.gadgets = [Gadget("gadget-0", "blue")]
    helper.devices_changed()
    [one] = await eventually(lambda: slices_of(1), what="the pool shrunk to one slice")
    assert one["spec"]["devices"] == [{"name": "gadget-0", "attributes": {f"{DRIVER}/color": {"string": "blue"}}}]
    assert one["spec"]["pool"]["generation"] == slices[0]["spec"]["pool"]["generation"] + 1


async def test_the_toy_drivers_health_reaches_the_kubelet(toy: tuple[ToyDriver, Helper[Gadget], Calls]) -> None:
    driver, helper, _calls = toy
    async with KubeletClient(helper.plugin.registration_socket) as kubelet:
        await kubelet.get_info()
        stream = kubelet.watch_health()
        first = await asyncio.wait_for(stream.__anext__(), 5)
        assert first.devices and all(d.health == 1 for d in first.devices)  # HEALTHY
        driver.broken = {"gadget-3"}
        helper.health.poke()
        for _ in range(20):
            message = await asyncio.wait_for(stream.__anext__(), 5)
            unhealthy = {d.device.device_name: d.message for d in message.devices if d.health == 2}
            if unhealthy:
                break
        assert unhealthy == {"gadget-3": "broken"}
        await stream.aclose()
    # The kit asked the apiserver: where device taints are a gate left off (1.34's session
    # apiserver) it taints nothing; where they are GA (1.37) an unhealthy device is tainted.
    from devcluster.builders.versions import selected

    assert helper.taints.effect == ("None" if "DRADeviceTaints" in selected().feature_gates else "NoSchedule")
