"""``dranet_driver_claim_devices_allocated`` and ``..._ready`` (the Go driver's gauges), scraped from
/metrics while the state files go through prepare, attach, return and unprepare."""

from __future__ import annotations

from pathlib import Path

from driver.checkpoint.state import (
    DriverState,
    MovedDevice,
    PodNetState,
    PreparedClaim,
    PreparedDevice,
    claim_device_counts,
)
from driver.checkpoint.store import CheckpointStore
from driver.daemon.probe_server import ProbeServer
from driver.metrics import Metrics
from driver.model.device import Device, HostFacts
from tests.daemon.test_probe_server import get

ALLOCATED = "dranet_driver_claim_devices_allocated"
READY = "dranet_driver_claim_devices_ready"


def _device(name: str, ifname: str | None) -> PreparedDevice:
    return PreparedDevice("nic", "node", name, Device(name, {}, HostFacts(ifname=ifname)))


def _claim(uid: str, pods: list[str], *devices: PreparedDevice) -> PreparedClaim:
    return PreparedClaim(uid, "default", uid, pod_uids=pods, devices=list(devices))


def _pod(uid: str, **steps: str) -> PodNetState:
    return PodNetState(uid, devices=[MovedDevice(d, "eth", "net1", step=s) for d, s in steps.items()])


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_counts_follow_the_state() -> None:
    a, b, rdma_only = _device("a", "ib0"), _device("b", "ib1"), _device("c", None)
    state = DriverState(claims={"c1": _claim("c1", ["p1"], a, b, rdma_only)})
    # Prepared, not attached yet: the RDMA-only device has nothing to attach.
    assert claim_device_counts(state) == (3, 1)
    state.pods["p1"] = _pod("p1", a="in-pod", b="moving")  # mid-attachment: b is stuck
    assert claim_device_counts(state) == (3, 2)
    state.pods["p1"] = _pod("p1", a="in-pod", b="in-pod")
    assert claim_device_counts(state) == (3, 3)
    # A claim shared by two pods counts its devices per pod, as the Go driver's per-pod store does.
    state.claims["c2"] = _claim("c2", ["p2", "p3"], _device("d", "eth5"))
    state.pods["p2"] = _pod("p2", d="in-pod")
    assert claim_device_counts(state) == (5, 4)
    # Reserved for no pod (the kubelet prepares no such claim; nothing is stored by the Go driver).
    state.claims["c3"] = _claim("c3", [], _device("e", "eth6"))
    assert claim_device_counts(state) == (5, 4)


async def test_scraped_from_metrics_through_a_claims_life(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state", tmp_path / "run")
    metrics = Metrics()
    metrics.watch_claim_devices(lambda: store.read(claim_device_counts))
    server = ProbeServer("127.0.0.1:0", metrics, lambda: True)
    await server.start()

    async def scrape() -> tuple[float | None, float | None]:
        _, text, _ = await get(f"http://127.0.0.1:{server.port}/metrics")
        return _value(text, ALLOCATED), _value(text, READY)

    def put(fn: object) -> None:
        store.update(fn)  # type: ignore[arg-type]

    try:
        assert await scrape() == (0, 0)
        # NodePrepareResources stored the claim.
        put(lambda s: s.claims.__setitem__("c1", _claim("c1", ["p1"], _device("a", "ib0"), _device("b", "ib1"))))
        assert await scrape() == (2, 0)
        # RunPodSandbox: the write-ahead state, then the commit.
        put(lambda s: s.pods.__setitem__("p1", _pod("p1", a="moving", b="moving")))
        assert await scrape() == (2, 0)
        put(lambda s: s.pods.__setitem__("p1", _pod("p1", a="in-pod", b="in-pod")))
        assert await scrape() == (2, 2)
        # StopPodSandbox gave the NICs back (the pod's state is gone), then unprepare.
        put(lambda s: s.pods.pop("p1"))
        assert await scrape() == (2, 0)
        put(lambda s: s.claims.pop("c1"))
        assert await scrape() == (0, 0)
        # Another driver instance (rolling update) writes the same files: read at the scrape.
        other = CheckpointStore(tmp_path / "state", tmp_path / "run")
        other.update(lambda s: s.claims.__setitem__("c2", _claim("c2", ["p2"], _device("c", None))))
        assert await scrape() == (1, 1)
    finally:
        await server.stop()


def test_a_failing_read_leaves_the_gauges_out_not_the_scrape() -> None:
    metrics = Metrics()

    def broken() -> tuple[int, int]:
        raise OSError("state unreadable")

    metrics.watch_claim_devices(broken)
    text = metrics.render().decode()
    assert _value(text, ALLOCATED) is None and "dranet_driver_last_published_time_seconds" in text
