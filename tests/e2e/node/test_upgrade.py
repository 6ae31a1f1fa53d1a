"""``helm upgrade`` of the driver to a new image tag and back, while a pod holds 4 NICs and pods
start and stop in a loop: nothing is dropped, no DRA or NRI call fails.

The chart's rolling update surges (maxSurge 1, maxUnavailable 0): the new driver pod starts
beside the old one, registers with the kubelet under its own socket names and with containerd's
NRI as a standby, turns Ready (/readyz), then the old pod stops: its kubelet sockets go first,
then it hands the node lease (NIC moves, slices) to the new one. The second tag is the same
image under another name (as a registry would serve a re-tag); the downgrade goes back to the
first. Counted as failures: a loop pod not Ready in time or without its NIC, and every line of
the kubelet's log about a failed NodePrepareResources/NodeUnprepareResources, every error of
containerd's log about NRI, every FailedPrepareDynamicResources event, during the whole window.

Also: the pod state an older driver wrote (``pods.json`` versions 4 and 2, each NIC's host
addresses and routes in that version's fields) is read by the new instance of a rolling update,
which gives the NICs back exactly as they were; and a state file from a newer schema is refused with
a clear error by the running driver's own binary (never misread).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from devcluster.demo.allocation import ALIGNED
from driver.checkpoint.schema import _V4_RECORDS, COMPATIBLE_VERSION, RECORDS_VERSION, SCHEMA_VERSION
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    NUMA1_RDMA,
    create_template,
    delete_pod,
    dra_conditions,
    host_ip,
    nic_snapshot,
    nic_template,
    pod_claim,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS
NUMA0, NUMA1 = slice(0, 4), slice(4, 8)
LOOP_TEMPLATE = "one-numa1-nic"
LOOPERS = 2  # pods starting concurrently, one NIC each (NUMA 1; the holder has NUMA 0's four)
KUBELET_FAILURES = re.compile(
    r"Failed to prepare dynamic resources|unprepare dynamic resources|NodePrepareResources|NodeUnprepareResources"
)
CONTAINERD_NRI_ERRORS = re.compile(r"level=error.*(nri|NRI|plugin \"00-dra\.net\")")


@pytest.fixture
def ns(real_node: RealNode, seed_ns: str) -> str:
    """The training example's templates and one for the loop pods: one RDMA NIC on NUMA 1."""
    create_template(real_node, nic_template(seed_ns, LOOP_TEMPLATE, NUMA1_RDMA))
    return seed_ns


@dataclass
class Loop:
    """Pods started one after the other by each looper thread, and what went wrong."""

    started: int = 0
    ready: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _looper(node: RealNode, ns: str, k: int, loop: Loop) -> None:
    nics = set(node.layout.nics[NUMA1])
    i = 0
    while not loop.stop.is_set():
        name = f"loop{k}-{i}"
        i += 1
        t0 = time.monotonic()
        try:
            start_pod(node, ns, name, LOOP_TEMPLATE)
            with loop.lock:
                loop.started += 1
            wait_running(node, ns, name, timeout=120)
            inside = set(pod_view(node.kubectl, ns, name).interfaces) & nics
            if len(inside) != 1:
                raise AssertionError(f"pod {name} has NICs {sorted(inside)}, wanted one of {sorted(nics)}")
            with loop.lock:
                loop.ready += 1
                loop.seconds.append(time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
            with loop.lock:
                loop.failures.append(f"{name}: {exc}"[:600])
        finally:
            try:
                delete_pod(node, ns, name, timeout=120)
            except Exception as exc:  # noqa: BLE001
                with loop.lock:
                    loop.failures.append(f"{name} delete: {exc}"[:600])


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _log_since(path: Path, offset: int) -> list[str]:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def _driver_pods(node: RealNode) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = node.kube.request(
        "GET",
        f"/api/v1/namespaces/{cluster.NAMESPACE}/pods",
        query={"labelSelector": "app.kubernetes.io/component=driver"},
    )["items"]
    return items


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _roll(node: RealNode, image: str, label: str) -> dict[str, float]:
    """helm upgrade to ``image``; returns when the rollout is complete, with its timings."""
    old = {p["metadata"]["uid"] for p in _driver_pods(node)}
    t0 = time.monotonic()
    cluster.helm_upgrade(node.layout, image)
    times: dict[str, float] = {}

    def watch() -> bool:
        pods = _driver_pods(node)
        new = [p for p in pods if p["metadata"]["uid"] not in old]
        if new and "new pod created" not in times:
            times["new pod created"] = time.monotonic() - t0
        ready = [
            p
            for p in new
            if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
        ]
        if ready and "new pod Ready" not in times:
            times["new pod Ready"] = time.monotonic() - t0
        if new and not (old & {p["metadata"]["uid"] for p in pods}) and "old pod gone" not in times:
            times["old pod gone"] = time.monotonic() - t0
        return cluster.driver_rollout_done(node.kube, image)

    wait_for(watch, 240, 0.25, f"the driver rollout to {image} ({label})")
    times["rollout done"] = time.monotonic() - t0
    restarts = [cs["restartCount"] for p in _driver_pods(node) for cs in p["status"].get("containerStatuses") or []]
    assert restarts and not any(restarts), f"a new driver container restarted during the {label}: {restarts}"
    return {k: round(v, 1) for k, v in times.items()}


def _holder_intact(node: RealNode, ns: str, pod: str, nics: list[str], claim_uid: str) -> None:
    view = pod_view(node.kubectl, ns, pod)
    assert set(nics) <= set(view.interfaces), sorted(view.interfaces)
    assert not set(nics) & set(node.host_nics())
    assert claim_uid in node.checkpoint().get("claims", {}), "the claim is no longer prepared"
    claim = pod_claim(node, ns, pod)
    conds = dra_conditions(claim)
    assert conds and all(c["Ready"]["status"] == "True" for c in conds.values()), conds


def test_upgrade_and_downgrade_drop_nothing(real_node: RealNode, ns: str) -> None:
    node = real_node
    first = node.state.driver_image
    second = cluster.tag_image(node.layout, first, first + "-next")
    home = nic_snapshot(node)
    holder_nics = list(node.layout.nics[NUMA0])
    start_pod(node, ns, "holder", ALIGNED)
    wait_running(node, ns, "holder")
    claim_uid = pod_claim(node, ns, "holder")["metadata"]["uid"]
    _holder_intact(node, ns, "holder", holder_nics, claim_uid)

    logs = node.layout.logs
    # The pods of this test run on node 0: its kubelet's and containerd's logs.
    offsets = {n: _log_size(logs / f"n0-{n}.log") for n in ("kubelet", "containerd")}
    loop = Loop()
    threads = [threading.Thread(target=_looper, args=(node, ns, k, loop), daemon=True) for k in range(LOOPERS)]
    for t in threads:
        t.start()
    phases: dict[str, dict[str, float]] = {}
    started: dict[str, int] = {}  # loop pods created while the rollout ran
    try:
        wait_for(lambda: loop.ready >= LOOPERS, 120, 0.5, "the loop pods running before the upgrade")
        for phase, image in (("upgrade", second), ("downgrade", first)):
            before = loop.started
            phases[phase] = _roll(node, image, phase)
            started[phase] = loop.started - before
            _holder_intact(node, ns, "holder", holder_nics, claim_uid)
            after = loop.ready
            wait_for(lambda after=after: loop.ready >= after + LOOPERS, 120, 0.5, f"loop pods Ready after the {phase}")
    finally:
        loop.stop.set()
        for t in threads:
            t.join(timeout=300)

    kubelet = [ln for ln in _log_since(logs / "n0-kubelet.log", offsets["kubelet"]) if KUBELET_FAILURES.search(ln)]
    containerd = [
        ln for ln in _log_since(logs / "n0-containerd.log", offsets["containerd"]) if CONTAINERD_NRI_ERRORS.search(ln)
    ]
    dra_lines = [ln for ln in _log_since(logs / "n0-kubelet.log", offsets["kubelet"]) if "dra.net" in ln]
    nri_events, overlaps = _nri_connections(_log_since(logs / "n0-containerd.log", offsets["containerd"]))
    events = [
        f"{e['involvedObject']['name']}: {e.get('reason')}: {e.get('message')}"
        for e in node.kube.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        if e.get("type") == "Warning"
    ]
    failed = len(loop.failures) + len(kubelet) + len(containerd)
    print(
        f"\n[upgrade] {first} -> {second}: {phases['upgrade']}; back: {phases['downgrade']}"
        f"\n[upgrade] loop pods: {loop.started} started ({started['upgrade']} during the upgrade, "
        f"{started['downgrade']} during the downgrade), {loop.ready} Ready with their NIC, median start "
        f"{sorted(loop.seconds)[len(loop.seconds) // 2] if loop.seconds else 0:.1f}s"
        f"\n[upgrade] failed calls: {failed} (loop {len(loop.failures)}, kubelet prepare/unprepare {len(kubelet)}, "
        f"containerd NRI {len(containerd)}); warning events: {len(events)}; a new instance connected to "
        f"containerd's NRI while another one was: {overlaps} times ({', '.join(nri_events)})"
        f"\n[upgrade] what the kubelet logged about dra.net ({len(dra_lines)} lines):"
    )
    for ln in _summarize(dra_lines):
        print(f"    {ln}")
    assert not loop.failures, loop.failures
    assert not kubelet, kubelet[:10]
    assert not containerd, containerd[:10]
    assert not [e for e in events if "FailedPrepareDynamicResources" in e or "dra.net" in e], events
    assert min(started.values()) >= 1, f"pods must start while the driver is being replaced: {started}"
    assert overlaps >= 2, f"each new instance must connect to NRI while the old one still is: {nri_events}"
    delete_pod(node, ns, "holder")
    wait_nics_home(node, home)
    wait_for(lambda: not node.checkpoint().get("claims"), 30, 0.2, "every claim unprepared")


def _nri_connections(lines: list[str]) -> tuple[list[str], int]:
    """containerd's dra.net NRI plugin connections, in order, and how many new ones found another
    dra.net plugin connected (one is when the window opens).

    A plugin is connected from the runtime's "synchronizing plugin" line (registered and
    configured; the Synchronize the driver's readiness waits for is being sent) until its
    "connection ... closed" line. The "connected and synchronized" line comes only once the
    runtime has taken its plugin-list lock after the sync, which an event in flight to the other
    instance can delay past that one's close: it is reported, not counted."""
    events, connected, overlaps = [], 1, 0
    for ln in lines:
        stamp = re.search(r'time="[^"]*T([0-9:.]{8,12})', ln)
        at = f"@{stamp.group(1)}" if stamp else ""
        if "synchronizing plugin 00-dra.net" in ln:
            overlaps += connected >= 1
            connected += 1
            events.append(f"connect({connected}){at}")
        elif '\\"00-dra.net\\" connected and synchronized' in ln:
            events.append(f"synchronized{at}")
        elif "failed to synchronize plugin" in ln:
            events.append(f"sync failed{at}: {ln[-200:]}")
        elif 'connection to plugin \\"00-dra.net\\" closed' in ln:
            connected -= 1
            events.append(f"close({connected}){at}")
    return events, overlaps


def _summarize(lines: list[str]) -> list[str]:
    """The kubelet's dra.net lines, grouped by message (klog's text after the source location)."""
    counts: dict[str, int] = {}
    for ln in lines:
        msg = ln.split("] ", 1)[-1]
        msg = re.sub(r"dra(\.net)?-[0-9a-f-]{36}", "<instance>", msg)
        msg = re.sub(r'"[^"]*\.sock"', '"<socket>"', msg)[:220]
        counts[msg] = counts.get(msg, 0) + 1
    return [f"{n}x {m}" for m, n in counts.items()]


def test_a_newer_state_file_is_refused_by_the_running_driver(real_node: RealNode, ns: str) -> None:
    """The real checkpoint.json the driver wrote, as a newer schema would have it: `dranet run` of the
    running image refuses to start, naming the file and the versions, instead of misreading it."""
    node = real_node
    start_pod(node, ns, "writer", ALIGNED)
    wait_running(node, ns, "writer")
    # The claims file is written once the claims have been quiet for a second (before, only the journal).
    deadline = time.monotonic() + 30
    while "version" not in (data := node.checkpoint()) and time.monotonic() < deadline:
        time.sleep(0.2)
    # Version 2 while no claim uses a field of version 3 (driver/checkpoint/schema.py COMPATIBLE_VERSION).
    assert data["version"] in (COMPATIBLE_VERSION, SCHEMA_VERSION) and data["claims"]
    data["version"] = SCHEMA_VERSION + 1
    for claim in data["claims"].values():
        claim["devices"][0]["futureField"] = {"what": "a field this version does not know"}
    pod = node.driver_pod()["metadata"]["name"]
    # The file goes in as an argument, not on kubectl's stdin (which sometimes arrives empty), and
    # `timeout` bounds a driver that would start instead of refusing: the output is then asserted.
    script = (
        'exec 2>&1; mkdir -p /tmp/newer /tmp/newer-run /tmp/newer-kubelet && printf %s "$1" | base64 -d '
        "> /tmp/newer/checkpoint.json && timeout -s INT 20 dranet --log-format=text run --state-dir=/tmp/newer "
        "--runtime-dir=/tmp/newer-run --kubelet-root=/tmp/newer-kubelet --no-device-metadata --no-nri "
        "--bind-address=127.0.0.1:0; "
        "echo exit=$?"
    )
    encoded = base64.b64encode(json.dumps(data).encode()).decode()
    out = node.kubectl.run("exec", "-n", cluster.NAMESPACE, pod, "--", "sh", "-c", script, "sh", encoded)
    print(f"\n[downgrade] a newer state file, read by the running driver:\n    {out.strip()}")
    assert "exit=1" in out
    assert f"checkpoint schema version {SCHEMA_VERSION + 1} was written by a newer driver" in out
    assert "refusing to start" in out
    delete_pod(node, ns, "writer")


V2_DEVICE_FIELDS = frozenset(
    {
        "device", "host_ifname", "pod_ifname", "permanent_mac", "pci_address", "host_mtu", "host_mac",
        "host_addresses", "host_routes", "rdma_device", "pod_mac", "host_features", "host_private_flags", "step",
    }
)  # fmt: skip
"""What a version-2 driver recorded of a NIC in a pod."""


def _as_written_by(body: dict[str, Any], version: int) -> dict[str, Any]:
    """``pods.json`` as a driver of ``version`` (4 or 2) wrote it: each setting's record back in the
    fields of that version; version 2 has none of the later fields, nor the links the hooks created."""
    pods = {}
    for uid, pod in body["pods"].items():
        devices = []
        for device in pod["devices"]:
            records = device.get("records") or {}
            out = {k: v for k, v in device.items() if k != "records"}
            for name, (setting, key) in _V4_RECORDS.items():
                value = records.get(setting) if key is None else (records.get(setting) or {}).get(key)
                if value is not None:
                    out[name] = value
            devices.append({k: v for k, v in out.items() if version > 2 or k in V2_DEVICE_FIELDS})
        pods[uid] = {**{k: v for k, v in pod.items() if version > 2 or k != "created"}, "devices": devices}
    return {"version": version, "pods": pods}


def _plant(node: RealNode, version: int) -> None:
    """Rewrite the driver's ``pods.json`` as a driver of ``version`` would have written it, under the
    state files' lock (the running instance reloads it at its next read)."""
    path = node.spec(0).driver_runtime_dir / "pods.json"
    lock = os.open(node.spec(0).driver_claims_dir / "checkpoint.lock", os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = _as_written_by(json.loads(path.read_text()), version)
        tmp = path.with_name(f".pods.json.planted-{version}")
        tmp.write_text(json.dumps(old, sort_keys=True, separators=(",", ":")))
        os.replace(tmp, path)
    finally:
        os.close(lock)


@pytest.fixture
def addressed_nics(real_node: RealNode) -> Iterator[list[str]]:
    """NUMA 0's four NICs (the aligned template's), each with a host address and a route through it
    (removed again afterwards)."""
    nics = list(real_node.layout.nics[NUMA0])
    base = random.randint(100, 200)
    for i, nic in enumerate(nics):
        host_ip(real_node, "addr", "add", f"192.168.{base + i}.1/24", "dev", nic)
        host_ip(real_node, "route", "add", f"10.{base + i}.0.0/16", "via", f"192.168.{base + i}.254", "dev", nic)
    try:
        yield nics
    finally:
        for nic in nics:
            if nic in real_node.host_nics():
                host_ip(real_node, "addr", "flush", "dev", nic)  # its routes go with the address


def test_an_upgrade_reads_the_pod_state_older_drivers_wrote(
    real_node: RealNode, ns: str, addressed_nics: list[str]
) -> None:
    """A pod holds 4 NICs whose host addresses and routes the driver recorded. Its ``pods.json`` is
    rewritten as the previous drivers wrote it (version 4, then version 2: found by name and MAC),
    each followed by a rolling update: the new instance reads the old file (a file it could not
    read would stop it, a damaged one would be moved aside), and when the pod is deleted its NICs
    come home with every address and route, which only the migrated records hold."""
    node = real_node
    first = node.state.driver_image
    second = cluster.tag_image(node.layout, first, first + "-next")
    home = nic_snapshot(node)
    assert all(home[n]["addresses"] and home[n]["routes"] for n in addressed_nics), home
    start_pod(node, ns, "holder", ALIGNED)
    wait_running(node, ns, "holder")
    claim_uid = pod_claim(node, ns, "holder")["metadata"]["uid"]
    recorded = node.pod_states()
    assert recorded["version"] == RECORDS_VERSION
    (pod,) = recorded["pods"].values()
    assert all(d["records"]["addresses"]["routes"] for d in pod["devices"]), pod["devices"]
    for version, image in ((4, second), (2, first)):
        _plant(node, version)
        assert node.pod_states()["version"] == version
        print(
            f"\n[upgrade] over a version-{version} pods.json: {_roll(node, image, f'upgrade over version {version}')}"
        )
        _holder_intact(node, ns, "holder", addressed_nics, claim_uid)
        moved_aside = sorted(p.name for p in node.spec(0).driver_runtime_dir.glob("pods.json.corrupt-*"))
        assert not moved_aside, f"the version-{version} file was taken for a damaged one: {moved_aside}"
        (now,) = node.pod_states()["pods"].values()
        assert {d["device"] for d in now["devices"]} == {d["device"] for d in pod["devices"]}
    delete_pod(node, ns, "holder")
    wait_nics_home(node, home)
    assert not node.pod_states().get("pods")
