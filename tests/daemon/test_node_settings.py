"""The node's own settings (its ``dra.net/sharing-pools`` annotation) take effect when set: the daemon
watches its Node and the next lease comes from the new range, without a restart.

The daemon is built as ``dranet run`` builds it and its node watch runs against a scripted API
server (a transport answering the Node's GET, its WATCH as a stream of JSON lines and event POSTs):
what is asserted is what the watch asked for (field selector, resourceVersion), what the NRI hooks
lease from afterwards, and the events an admin sees on the Node.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.checkpoint.state import IN_POD, MovedDevice, PodNetState
from driver.checkpoint.store import CheckpointStore
from driver.config import LEASE_OUTSIDE_POOL_EVENT, NODE_SETTING_REFUSED_EVENT, SHARING_POOLS_ANNOTATION, DriverConfig
from driver.daemon.lifecycle import Daemon
from driver.kube.client import KubeClient
from driver.kube.errors import Forbidden
from driver.kube.transport import ApiRequest
from driver.netlink.sub_interfaces import LEASE, RECORD
from driver.nri.address_pool import PoolError, in_use, lease
from driver.nri.handover import HandoverHooks
from driver.nri.hooks import NRIHooks

NODE = "gpu-node-7"


class Answer:
    """A plain answer (``data``), as urllib3 gives it."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class Watch:
    """One WATCH stream: the lines the test sends, until it ends it or the client shuts it down."""

    def __init__(self, request: ApiRequest) -> None:
        self.query = dict(request.query)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.shut = threading.Event()
        self.released = threading.Event()

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        self.lines.put(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def end(self) -> None:
        self.lines.put(None)

    def stream(self, amt: int, decode_content: bool = True) -> Iterator[bytes]:
        del amt, decode_content
        while True:
            try:
                line = self.lines.get(timeout=0.02)
            except queue.Empty:
                if self.shut.is_set():
                    raise ConnectionResetError("the client shut the watch down") from None
                continue
            if line is None:
                return
            yield line[:7]  # a line may arrive in pieces
            yield line[7:]

    def shutdown(self) -> None:
        self.shut.set()

    def release_conn(self) -> None:
        self.released.set()


class NodeApi:
    """The Node ``NODE`` (GET), its watches (each one a :class:`Watch`) and the events POSTed."""

    def __init__(self, annotations: dict[str, str] | None = None) -> None:
        self.version = 100
        self.annotations = dict(annotations or {})
        self.gets = 0
        self.watches: queue.Queue[Watch] = queue.Queue()
        self.refuse_watches = 0  # the next this many watches answer 403
        self.events: list[dict[str, Any]] = []

    def node(self) -> dict[str, Any]:
        """The Node as the API server has it now."""
        meta = {"name": NODE, "uid": "uid-node", "resourceVersion": str(self.version), "annotations": self.annotations}
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta}

    def change(self, pools: str | None = None, **other: str) -> dict[str, Any]:
        """The Node after a change: its pools annotation set to ``pools`` (None: removed), or only
        ``other`` annotations; a new resourceVersion either way."""
        self.version += 1
        self.annotations = {k.replace("_", "."): v for k, v in other.items()}
        if pools is not None:
            self.annotations[SHARING_POOLS_ANNOTATION] = pools
        return self.node()

    def send(self, request: ApiRequest) -> Any:
        if request.method == "GET" and request.path == f"/api/v1/nodes/{NODE}":
            self.gets += 1
            return Answer(self.node())
        if request.method == "GET" and request.path == "/api/v1/nodes" and ("watch", "true") in request.query:
            if self.refuse_watches:
                self.refuse_watches -= 1
                raise Forbidden(403, "Forbidden", 'nodes is forbidden: cannot watch resource "nodes"')
            watch = Watch(request)
            self.watches.put(watch)
            return watch
        if request.method == "POST" and request.path == "/api/v1/namespaces/default/events":
            self.events.append(request.body)
            return Answer(request.body)
        raise AssertionError(f"unexpected request {request.method} {request.path}")

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events]


async def _until(pred: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _next_watch(api: NodeApi, timeout: float = 5.0) -> Watch:
    return await asyncio.to_thread(api.watches.get, True, timeout)


def _daemon(tmp_path: Path, api: NodeApi, flag_pools: str = "", sriov_vfs: str = "") -> Daemon:
    config = DriverConfig(
        node_name=NODE,
        kubelet_root=str(tmp_path / "kubelet"),
        state_dir=str(tmp_path / "claims"),
        runtime_dir=str(tmp_path / "run"),
        cdi_dir=str(tmp_path / "cdi"),
        legacy_state_dir="",
        sysfs_root=str(tmp_path / "sys"),
        bind_address="127.0.0.1:0",
        sharing_pools=flag_pools,
        sriov_vfs=sriov_vfs,
    )
    daemon = Daemon(config, KubeClient(api), CheckpointStore(config.state_dir, config.runtime_dir))
    # The NRI hooks as _run_nri builds them (only their address pools matter here).
    hooks = NRIHooks(daemon.store, host_netns="/proc/self/ns/net", pools=daemon.sharing_pools, probe_wait=0)
    daemon.hooks = HandoverHooks(hooks, daemon.lease, config.runtime_dir)
    return daemon


def _next_lease(daemon: Daemon, nic: str = "ib0") -> str:
    """The address the NRI hooks would lease now to a share of ``nic`` with no address of its own."""
    assert daemon.hooks is not None
    return lease(nic, [], daemon.store.read(lambda s: in_use(s, {})), daemon.hooks.hooks.pools)


async def _watching(daemon: Daemon) -> asyncio.Task[None]:
    await daemon._node_pools()  # what run() does before anything starts
    return asyncio.create_task(daemon._watch_node())  # the background task _start_background spawns


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_annotation_set_on_a_running_node_is_the_pool_of_the_next_lease(tmp_path: Path) -> None:
    api = NodeApi()
    daemon = _daemon(tmp_path, api)
    task = await _watching(daemon)
    try:
        with pytest.raises(PoolError, match="no address pool for ib0 on this node"):
            _next_lease(daemon)
        watch = await _next_watch(api)
        # The one Node, from the resourceVersion the start read: no event between the two is missed.
        assert watch.query["fieldSelector"] == f"metadata.name={NODE}"
        assert watch.query["resourceVersion"] == "100" and watch.query["allowWatchBookmarks"] == "true"
        watch.send("MODIFIED", api.change("ib0=10.77.5.64/26"))
        await _until(lambda: "ib0" in daemon.hooks.hooks.pools, "the new pools in the hooks")  # type: ignore[union-attr]
        assert _next_lease(daemon) == "10.77.5.65/26"
        assert daemon.sharing_pools == daemon.hooks.hooks.pools  # type: ignore[union-attr]
        assert api.gets == 1 and api.events == []  # the watch carried it: no GET, nothing to warn about
    finally:
        await _stop(task)


async def test_the_annotation_goes_over_the_flag_per_nic_and_its_removal_gives_the_flag_back(tmp_path: Path) -> None:
    api = NodeApi({SHARING_POOLS_ANNOTATION: "ib0=10.77.5.64/26"})
    daemon = _daemon(tmp_path, api, flag_pools="ib0=10.0.0.0/24,ib1=10.1.0.0/24")
    task = await _watching(daemon)
    try:
        assert _next_lease(daemon) == "10.77.5.65/26" and _next_lease(daemon, "ib1") == "10.1.0.1/24"
        watch = await _next_watch(api)
        watch.send("MODIFIED", api.change(None, example_com="x"))  # the annotation is gone
        await _until(lambda: str(daemon.sharing_pools["ib0"]) == "10.0.0.0/24", "the flag's pool of ib0 back")
        assert _next_lease(daemon) == "10.0.0.1/24"
    finally:
        await _stop(task)


async def test_a_bad_annotation_is_an_event_on_the_node_naming_it_and_the_pools_in_effect_stay(
    tmp_path: Path,
) -> None:
    api = NodeApi({SHARING_POOLS_ANNOTATION: "ib0=10.77.5.64/26"})
    daemon = _daemon(tmp_path, api)
    task = await _watching(daemon)
    try:
        watch = await _next_watch(api)
        watch.send("MODIFIED", api.change("ib0=10.77.5.65/26"))
        await _until(lambda: api.events, "an event on the Node")
        (event,) = api.events
        assert event["reason"] == NODE_SETTING_REFUSED_EVENT and event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == NODE
        message = event["message"]
        assert f"node annotation {SHARING_POOLS_ANNOTATION}: ib0: 10.77.5.65/26 has host bits set" in message
        assert "ignored, the address pools in effect stay (ib0=10.77.5.64/26)" in message
        assert _next_lease(daemon) == "10.77.5.65/26"  # a typo never takes the range away
        # The Node changes otherwise (a label, its status): the same bad text is not reported again.
        watch.send("MODIFIED", api.change("ib0=10.77.5.65/26", example_com="a label"))
        watch.send("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": "200"}})
        await _until(lambda: daemon.node_seen.resource_version == "200", "the bookmark")
        assert len(api.events) == 1
        # Fixed: in effect for the next lease.
        watch.send("MODIFIED", api.change("ib0=10.88.0.0/29"))
        await _until(lambda: _next_lease(daemon) == "10.88.0.1/29", "the fixed pool")
    finally:
        await _stop(task)


async def test_a_range_moved_under_running_shares_is_reported_and_their_addresses_kept(tmp_path: Path) -> None:
    api = NodeApi({SHARING_POOLS_ANNOTATION: "ib0=10.77.5.0/30"})
    daemon = _daemon(tmp_path, api)
    record = {"kind": "macvlan", "parent": "ib0", "parentIndex": 7, LEASE: "10.77.5.1/30"}
    moved = MovedDevice(device="shared", host_ifname="ib0", pod_ifname="net1", step=IN_POD, records={RECORD: record})
    pod = PodNetState(pod_uid="uid-a", namespace="team", name="trainer-0", devices=[moved])
    daemon.store.update(lambda s: s.pods.__setitem__("uid-a", pod))
    task = await _watching(daemon)
    try:
        assert api.events == []  # inside the pool: nothing to say
        watch = await _next_watch(api)
        watch.send("MODIFIED", api.change("ib0=10.77.6.0/30"))
        await _until(lambda: api.events, "an event on the Node")
        (event,) = api.events
        assert event["reason"] == LEASE_OUTSIDE_POOL_EVENT
        assert "10.77.5.1/30 of pod team/trainer-0 (a share of ib0)" in event["message"]
        assert "keep them until their pods end" in event["message"]
        assert _next_lease(daemon) == "10.77.6.1/30"
        # Back to a range holding it: the running share's address is never handed out meanwhile.
        watch.send("MODIFIED", api.change("ib0=10.77.5.0/30"))
        await _until(lambda: str(daemon.sharing_pools["ib0"]) == "10.77.5.0/30", "the first range again")
        assert _next_lease(daemon) == "10.77.5.2/30"
        assert daemon.store.read(lambda s: s.pods["uid-a"].devices[0].records[RECORD][LEASE]) == "10.77.5.1/30"
    finally:
        await _stop(task)


async def test_an_ended_watch_resumes_where_it_was_and_an_expired_one_reads_the_node_again(tmp_path: Path) -> None:
    api = NodeApi()
    daemon = _daemon(tmp_path, api)
    task = await _watching(daemon)
    try:
        first = await _next_watch(api)
        first.send("MODIFIED", api.change("ib0=10.77.5.64/26"))
        first.end()  # the server's timeoutSeconds
        second = await _next_watch(api)
        assert second.query["resourceVersion"] == "101" and api.gets == 1
        assert first.released.is_set()
        # Changed while no watch could tell (compaction): 410 Gone, then a GET starts over.
        api.change("ib0=10.99.0.0/29")
        second.send("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
        second.end()
        third = await _next_watch(api)
        assert api.gets == 2 and third.query["resourceVersion"] == "102"
        assert _next_lease(daemon) == "10.99.0.1/29"
    finally:
        await _stop(task)


async def test_a_refused_watch_is_retried_and_reads_the_node_each_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api = NodeApi()
    api.refuse_watches = 2
    daemon = _daemon(tmp_path, api)
    task = await _watching(daemon)
    try:
        api.change("ib0=10.77.5.64/26")
        # 1 s, then 2 s later: each attempt reads the Node first, so the setting is in.
        await _until(lambda: "ib0" in daemon.sharing_pools, "the pools from a GET", timeout=6)
        await _next_watch(api, timeout=6)
        assert _next_lease(daemon) == "10.77.5.65/26"
        warnings = [r for r in caplog.records if r.getMessage().startswith("cannot watch this node")]
        assert len([r for r in warnings if r.levelname == "WARNING"]) == 1, "said once, not at every retry"
    finally:
        await _stop(task)


async def test_stopping_ends_a_watch_that_is_waiting_for_an_event(tmp_path: Path) -> None:
    """The daemon's stop cancels the watch: its reading thread returns at once, so the process's exit
    does not wait for the watch's timeout (asyncio.run waits for every worker thread)."""
    api = NodeApi()
    daemon = _daemon(tmp_path, api)
    task = await _watching(daemon)
    watch = await _next_watch(api)
    await asyncio.sleep(0.1)  # the reading thread is blocked in the stream
    await _stop(task)
    assert watch.shut.is_set()
    await asyncio.to_thread(watch.released.wait, 2.0)
    assert watch.released.is_set(), "the reading thread ended and gave the connection back"
