"""SlicePublisher against a real kube-apiserver (tests/plugins/cluster.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from driver.config import UNHEALTHY_TAINT_KEY
from driver.dra.publisher import SlicePublisher
from driver.kube.client import RESOURCE_API, KubeClient
from driver.model.device import Device
from tests.plugins.cluster import delete_node_and_slices, list_slices

pytestmark = [pytest.mark.cluster]
DRIVER = "dra.net"


def nic(i: int, numa: int = 0) -> Device:
    return Device(
        name=f"pci-0000-{i // 256:02x}-{i % 256:02x}-0",
        attributes={
            "dra.net/rdma": True,
            "dra.net/numaNode": numa,
            "dra.net/ifName": f"ib{i}",
            "resource.kubernetes.io/pciBusID": f"0000:{i // 256:02x}:{i % 256:02x}.0",
        },
    )


async def eventually(fn: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await asyncio.to_thread(fn)
        if last:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last={last!r}")


@contextlib.asynccontextmanager
async def running(pub: SlicePublisher) -> AsyncIterator[SlicePublisher]:
    task = asyncio.create_task(pub.run())
    try:
        yield pub
    finally:
        pub.stop()
        await asyncio.wait_for(task, 10)


def device_names(slices: list[dict]) -> list[str]:
    return sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])


def pool_ok(slices: list[dict], count: int) -> bool:
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    return (
        len(slices) == count
        and len(gens) == 1
        and all(s["spec"]["pool"]["resourceSliceCount"] == count for s in slices)
    )


async def test_slices_accepted_with_owner_and_pool(kube: KubeClient, cluster_node: str):
    node_uid = kube.read_node(cluster_node)["metadata"]["uid"]
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([nic(i, numa=i // 4) for i in range(8)])
        slices = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
    [s] = slices
    assert s["metadata"]["name"].startswith(f"{cluster_node}-{DRIVER}-")
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": cluster_node, "uid": node_uid, "controller": True}
    ]
    assert s["spec"]["pool"] == {"name": cluster_node, "generation": 1, "resourceSliceCount": 1}
    assert device_names(slices) == sorted(nic(i).name for i in range(8))
    dev0 = next(d for d in s["spec"]["devices"] if d["name"] == nic(0).name)
    assert dev0["attributes"]["dra.net/rdma"] == {"bool": True}
    assert dev0["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:00:00.0"}


async def test_empty_device_set_publishes_one_empty_slice(kube: KubeClient, cluster_node: str):
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([])
        [s] = await eventually(lambda: list_slices(kube, cluster_node), what="empty slice")
    assert s["spec"].get("devices") in (None, []) and s["spec"]["pool"]["resourceSliceCount"] == 1


async def test_republished_after_slices_deleted(kube: KubeClient, cluster_node: str):
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([nic(1), nic(2)])
        [first] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        # What the kubelet does at its start: wipe every slice of the node.
        kube.request(
            "DELETE", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.nodeName={cluster_node}"}
        )
        t0 = time.monotonic()
        again = await eventually(
            lambda: [s for s in list_slices(kube, cluster_node) if s["metadata"]["uid"] != first["metadata"]["uid"]],
            what="re-published slice",
        )
        elapsed = time.monotonic() - t0
    assert device_names(again) == sorted([nic(1).name, nic(2).name])
    assert elapsed < 5, f"re-publish took {elapsed:.1f}s (watch should notice at once)"


async def test_updated_when_device_appears_and_vanishes(kube: KubeClient, cluster_node: str):
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([nic(1), nic(2)])
        [s1] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        pub.update([nic(1), nic(2), nic(3)])
        [s2] = await eventually(
            lambda: [s for s in list_slices(kube, cluster_node) if len(s["spec"]["devices"]) == 3], what="3 devices"
        )
        pub.update([nic(3)])
        [s3] = await eventually(
            lambda: [s for s in list_slices(kube, cluster_node) if len(s["spec"].get("devices") or []) == 1],
            what="1 device",
        )
    # Same object updated in place, generation bumped each time.
    assert s1["metadata"]["name"] == s2["metadata"]["name"] == s3["metadata"]["name"]
    assert [s["spec"]["pool"]["generation"] for s in (s1, s2, s3)] == [1, 2, 3]
    assert s3["spec"]["devices"][0]["name"] == nic(3).name


async def test_split_beyond_128_devices(kube: KubeClient, cluster_node: str):
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([nic(i, numa=i % 2) for i in range(300)])
        slices = await eventually(
            lambda: (lambda x: x if pool_ok(x, 3) else None)(list_slices(kube, cluster_node)), what="3 slices"
        )
        assert sorted(len(s["spec"]["devices"]) for s in slices) == [44, 128, 128]
        assert device_names(slices) == sorted(nic(i).name for i in range(300))
        gen = slices[0]["spec"]["pool"]["generation"]
        pub.update([nic(i) for i in range(10)])
        after = await eventually(
            lambda: (lambda x: x if pool_ok(x, 1) else None)(list_slices(kube, cluster_node)), what="1 slice"
        )
    assert after[0]["spec"]["pool"]["generation"] == gen + 1
    assert device_names(after) == sorted(nic(i).name for i in range(10))


async def test_restarted_publisher_reuses_existing_slices(kube: KubeClient, cluster_node: str):
    devices = [nic(i) for i in range(5)]
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update(devices)
        [before] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
    # A new process with the same devices: nothing to write.
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub2:
        pub2.update(devices)
        await eventually(lambda: pub2.stats.syncs >= 1, what="first sync")
        assert pub2.stats.writes == 0
        pub2.update(devices[:3])
        [after] = await eventually(
            lambda: [s for s in list_slices(kube, cluster_node) if len(s["spec"]["devices"]) == 3], what="update"
        )
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"] + 1


async def test_storm_of_updates_is_coalesced(kube: KubeClient, cluster_node: str):
    interval, duration = 0.5, 3.0
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=interval)) as pub:
        pub.update([nic(0)])
        [s0] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        rounds0 = pub.stats.write_rounds
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < duration:  # 100 "link flaps" per second
            i += 1
            pub.update([nic(0), nic(1)] if i % 2 else [nic(0)])
            await asyncio.sleep(0.01)
        final = [nic(0), nic(1)] if i % 2 else [nic(0)]
        [s1] = await eventually(
            lambda: [
                s
                for s in list_slices(kube, cluster_node)
                if len(s["spec"]["devices"]) == len(final)
                and s["metadata"]["generation"] > s0["metadata"]["generation"]
            ],
            what="final state",
        )
        await asyncio.sleep(interval * 2)  # a late extra write would show up now
        rounds = pub.stats.write_rounds - rounds0
        [s_end] = list_slices(kube, cluster_node)
    # metadata.generation is counted by the apiserver: an independent count of spec writes.
    api_writes = s_end["metadata"]["generation"] - s0["metadata"]["generation"]
    limit = int(duration / interval) + 2
    assert i > 200
    assert api_writes == rounds, (api_writes, rounds)
    assert 1 <= api_writes <= limit, f"{api_writes} writes for {i} updates in {duration}s (limit {limit})"
    assert device_names([s_end]) == sorted(d.name for d in final)


async def test_foreign_edit_is_reverted(kube: KubeClient, cluster_node: str):
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)) as pub:
        pub.update([nic(1)])
        [s] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        s["spec"]["devices"][0]["attributes"]["dra.net/numaNode"] = {"int": 7}
        edited = kube.request("PUT", f"{RESOURCE_API}/resourceslices/{s['metadata']['name']}", s)
        fixed = await eventually(
            lambda: [
                x
                for x in list_slices(kube, cluster_node)
                if x["metadata"]["resourceVersion"] != edited["metadata"]["resourceVersion"]
            ],
            what="slice restored",
        )
    assert fixed[0]["spec"]["devices"][0]["attributes"]["dra.net/numaNode"] == {"int": 0}


async def test_conflicting_write_is_retried_after_relisting(kube: KubeClient, cluster_node: str):
    pub = SlicePublisher(kube, DRIVER, cluster_node, interval=0.2)
    pub.node_uid = kube.read_node(cluster_node)["metadata"]["uid"]
    pub.update([nic(1)])
    await asyncio.to_thread(pub.sync)
    real_list = pub.list_slices
    raced = []

    def racing_list() -> list[dict]:
        items = real_list()
        if not raced:  # someone else writes between our list and our update: our PUT must get 409
            other = dict(items[0], metadata=dict(items[0]["metadata"], labels={"touched": "yes"}))
            raced.append(kube.request("PUT", f"{RESOURCE_API}/resourceslices/{items[0]['metadata']['name']}", other))
        return items

    pub.list_slices = racing_list  # type: ignore[method-assign]
    pub.update([nic(1), nic(2)])
    await asyncio.to_thread(pub.sync)
    assert pub.stats.conflicts == 1
    [s] = list_slices(kube, cluster_node)
    assert device_names([s]) == sorted([nic(1).name, nic(2).name])
    assert s["metadata"]["labels"] == {"touched": "yes"}  # the other writer's change survived


async def test_slices_garbage_collected_with_their_node(kube: KubeClient, control_plane):
    node = "gc-node-" + str(int(time.time() * 1000) % 100000)
    control_plane.create_node(node)
    try:
        async with running(SlicePublisher(kube, DRIVER, node, interval=0.2)) as pub:
            pub.update([nic(1)])
            await eventually(lambda: list_slices(kube, node), what="slice")
        kube.request("DELETE", f"/api/v1/nodes/{node}")
        # The owner reference (controller: true) lets the garbage collector remove them.
        await eventually(lambda: not list_slices(kube, node), timeout=30, what="slices garbage-collected")
    finally:
        delete_node_and_slices(kube, node)


def test_the_device_taints_probe_answers_what_the_apiserver_keeps(kube: KubeClient, cluster_node: str):
    """The dry-run probe says whether the session's apiserver keeps device taints: on 1.34 it runs
    without DRADeviceTaints (it would drop every taint and the publisher would rewrite the slice
    forever: detected, with the gate named); from 1.37 the field is GA and kept. Nothing is stored
    either way. (With the gate on, the real node's tests see the taints: tests/e2e/node/test_nic_health.py.)"""
    from devcluster.builders.versions import selected
    from driver.dra.taints import device_taints_accepted

    accepted, why = device_taints_accepted(kube, DRIVER, cluster_node, UNHEALTHY_TAINT_KEY)
    if "DRADeviceTaints" in selected().feature_gates:  # a gate to turn on: off in the session
        assert not accepted and "DRADeviceTaints" in why, why
    else:
        assert accepted, why
    assert not list_slices(kube, cluster_node)


async def test_flapping_link_taints_are_coalesced_with_slice_writes(kube: KubeClient, cluster_node: str):
    """A link flapping 100 times a second: its taint comes and goes with every health change, and
    the slice is written at most once per interval (taints share the devices' rate limit)."""
    from driver.dra.taints import UnhealthyTaints

    interval, duration = 0.5, 3.0
    taints = UnhealthyTaints("NoSchedule", UNHEALTHY_TAINT_KEY)
    async with running(SlicePublisher(kube, DRIVER, cluster_node, interval=interval)) as pub:
        pub.update([nic(0), nic(1)])
        [s0] = await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        rounds0 = pub.stats.write_rounds
        t0 = time.monotonic()
        flaps = 0
        while time.monotonic() - t0 < duration:
            flaps += 1
            pub.set_taints(taints.update({"pci-0000-00-01-0": "LinkDown"} if flaps % 2 else {}))
            await asyncio.sleep(0.01)
        pub.set_taints(taints.update({}))  # the link is back for good
        await asyncio.sleep(interval * 3)
        rounds = pub.stats.write_rounds - rounds0
        [s_end] = list_slices(kube, cluster_node)
    limit = int(duration / interval) + 2
    assert flaps > 200
    assert 1 <= rounds <= limit, f"{rounds} slice writes for {flaps} taint changes in {duration}s (limit {limit})"
    assert s_end["metadata"]["generation"] - s0["metadata"]["generation"] == rounds
    assert all("taints" not in d for d in s_end["spec"]["devices"])


class RequestLog(KubeClient):
    """The real client, logging every request the publisher makes: (method, path's last part, query)."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube.api)
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        self.calls.append((method, path.rsplit("/", 1)[-1], dict(kw.get("query") or {})))
        return super().request(method, path, body, **kw)

    def watch_resource_slice(self, field_selector: str, resource_version: str, timeout_seconds: int = 300) -> Any:
        self.calls.append(("WATCH", "resourceslices", {"resourceVersion": resource_version}))
        return super().watch_resource_slice(field_selector, resource_version, timeout_seconds)

    def lists(self) -> list[dict[str, Any]]:
        return [q for m, last, q in self.calls if m == "GET" and last == "resourceslices"]


async def test_own_writes_never_cost_a_relist_and_the_watch_starts_at_the_syncs_list(
    kube: KubeClient, cluster_node: str
):
    """Start: one LIST (the sync's; the watch starts at its resourceVersion), the node GET, the
    CREATE, the WATCH. Then every write's echo is recognised (no re-list), and a write round is its
    write alone: the slices the watch keeps are what it plans against."""
    api = RequestLog(kube)
    interval = 0.2
    async with running(SlicePublisher(api, DRIVER, cluster_node, interval=interval)) as pub:
        pub.update([nic(0)])
        await eventually(lambda: list_slices(kube, cluster_node), what="slice")
        await eventually(lambda: any(m == "WATCH" for m, _, _ in api.calls), what="watch")
        await asyncio.sleep(interval * 3)  # an echo taken for someone else's change would re-list now
        assert [m for m, _, _ in api.calls] == ["GET", "GET", "POST", "WATCH"], api.calls  # node, LIST, CREATE
        [listed] = api.lists()
        assert "limit" not in listed
        watch_rv = api.calls[-1][2]["resourceVersion"]
        assert watch_rv and watch_rv != "0"
        for i in range(1, 6):  # five write rounds, each after the rate limit's interval
            pub.update([nic(0), *(nic(j) for j in range(1, i + 1))])
            await eventually(lambda i=i: pub.stats.write_rounds == i + 1, what=f"write round {i + 1}")
            await asyncio.sleep(interval * 2)
        await asyncio.sleep(interval * 3)
        assert pub.stats.write_rounds == 6 and pub.stats.syncs == 6, pub.stats
        assert len(api.lists()) == 1  # no echo was taken for a foreign change, no round listed
        assert [m for m, _, _ in api.calls].count("WATCH") == 1
        assert [m for m, _, _ in api.calls].count("PUT") == 5
    [s] = list_slices(kube, cluster_node)
    assert device_names([s]) == sorted(nic(j).name for j in range(6))


class WriteOrder:
    """The API client, recording the slice writes it passes on, in order."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.kube, name)
        if name not in ("replace_resource_slice", "create_resource_slice", "delete_resource_slice"):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            self.calls.append((name.split("_")[0], (out or {}).get("metadata", {}).get("name", str(args[0]))))
            return out

        return recorded


async def test_a_shrinking_pool_is_complete_at_every_moment(kube: KubeClient, cluster_node: str):
    """From three slices to one: the new generation is written before any slice of the old one is
    deleted (Kubernetes' own slice controller's order), so a reader never finds the old generation
    with slices missing (the toy-driver test once did, between a delete and the update after it)."""
    api = WriteOrder(kube)
    async with running(SlicePublisher(api, DRIVER, cluster_node, interval=0.2)) as pub:  # type: ignore[arg-type]
        pub.update([nic(i) for i in range(300)])
        await eventually(lambda: pool_ok(list_slices(kube, cluster_node), 3), what="3 slices")
        api.calls.clear()
        pub.update([nic(i) for i in range(10)])
        await eventually(lambda: pool_ok(list_slices(kube, cluster_node), 1), what="1 slice")
    kinds = [kind for kind, _ in api.calls]
    assert kinds == ["replace", "delete", "delete"], api.calls
