"""Publishing benchmark against a real kube-apiserver.

Prints: cold build time of the binaries (from the build cache), warm start time of the control
plane, latency from a device change (``SlicePublisher.update``) to the updated slice visible
in the API (median, p99), and the number of API writes during a 10 s storm of 100 updates
per second (goal: at most one per interval).

With root, the same two numbers through the whole daemon: ``dranet run`` on the host's /sys
(filter: only a veth pair this benchmark creates, ``dnb0``/``dnb1``), a real link change
(``ip link set dnb0 mtu N`` via netlink) -> netlink event -> rescan -> slice visible.

``python -m bench.bench_publish [--samples N] [--interval S] [--no-link]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from devcluster.builders.binaries import ETCD_VERSION, K8S_VERSION, cache_root, ensure_control_plane
from devcluster.cluster.controlplane import ControlPlane
from driver.dra.publisher import SlicePublisher
from driver.kube.client import RESOURCE_API, KubeClient
from driver.model.device import Device

NODE, DRIVER = "bench-node", "dra.net"


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def devices(state: int) -> list[Device]:
    """8 RDMA NICs; ``state`` changes one attribute so every call is a real change."""
    return [
        Device(
            name=f"pci-0000-{i:02x}-00-0",
            attributes={
                "dra.net/rdma": True,
                "dra.net/numaNode": i // 4,
                "dra.net/mtu": 4000 + (state if i == 0 else 0),
            },
        )
        for i in range(8)
    ]


def slices(kube: KubeClient) -> list[dict]:
    return kube.request(
        "GET", f"{RESOURCE_API}/resourceslices", query={"fieldSelector": f"spec.driver={DRIVER},spec.nodeName={NODE}"}
    )["items"]


def mtu_of_first(kube: KubeClient) -> int | None:
    for s in slices(kube):
        for d in s["spec"].get("devices") or []:
            if d["name"] == "pci-0000-00-00-0":
                return d["attributes"]["dra.net/mtu"]["int"]
    return None


async def latency(kube: KubeClient, pub: SlicePublisher, samples: int, interval: float) -> list[float]:
    out = []
    for n in range(1, samples + 1):
        await asyncio.sleep(interval * 1.05)  # past the rate limit: measure the leading-edge write
        t0 = time.perf_counter()
        pub.update(devices(n))
        while await asyncio.to_thread(mtu_of_first, kube) != 4000 + n:
            await asyncio.sleep(0.002)
        out.append(time.perf_counter() - t0)
    return out


async def storm(kube: KubeClient, pub: SlicePublisher, seconds: float, rate: int) -> tuple[int, int, int]:
    gen0 = slices(kube)[0]["metadata"]["generation"]
    rounds0 = pub.stats.write_rounds
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < seconds:
        n += 1
        pub.update(devices(10_000 + n))
        await asyncio.sleep(max(0.0, t0 + n / rate - time.monotonic()))
    while await asyncio.to_thread(mtu_of_first, kube) != 4000 + 10_000 + n:
        await asyncio.sleep(0.01)
    api_writes = slices(kube)[0]["metadata"]["generation"] - gen0
    return n, pub.stats.write_rounds - rounds0, api_writes


async def run(cp: ControlPlane, samples: int, interval: float) -> None:
    kube = cp.kube()
    cp.create_node(NODE)
    pub = SlicePublisher(kube, DRIVER, NODE, interval=interval)
    task = asyncio.create_task(pub.run())
    try:
        pub.update(devices(0))
        while mtu_of_first(kube) != 4000:
            await asyncio.sleep(0.01)
        lat = await latency(kube, pub, samples, interval)
        print(
            f"publish latency (update -> visible in API), n={len(lat)}: "
            f"median {statistics.median(lat) * 1000:.1f} ms, p99 {p99(lat) * 1000:.1f} ms"
        )
        await asyncio.sleep(interval * 1.05)
        n, rounds, api_writes = await storm(kube, pub, 10.0, 100)
        limit = int(10.0 / interval) + 1
        print(
            f"storm: {n} updates in 10 s at interval {interval}s -> {rounds} write rounds, "
            f"{api_writes} slice spec writes seen by the apiserver (goal <= {limit}: "
            f"{'OK' if api_writes <= limit else 'OVER'})"
        )
    finally:
        pub.stop()
        await asyncio.wait_for(task, 10)


LINK_NODE = "bench-link-node"


def veth_mtu(kube: KubeClient) -> int | None:
    for s in kube.request(
        "GET",
        f"{RESOURCE_API}/resourceslices",
        query={"fieldSelector": f"spec.driver={DRIVER},spec.nodeName={LINK_NODE}"},
    )["items"]:
        for d in s["spec"].get("devices") or []:
            if d["attributes"].get("dra.net/ifName", {}).get("string") == "dnb0":
                return d["attributes"]["dra.net/mtu"]["int"]
    return None


def slice_generation(kube: KubeClient) -> int:
    return sum(
        s["metadata"]["generation"]
        for s in kube.request(
            "GET",
            f"{RESOURCE_API}/resourceslices",
            query={"fieldSelector": f"spec.driver={DRIVER},spec.nodeName={LINK_NODE}"},
        )["items"]
    )


def link_bench(cp: ControlPlane, samples: int, interval: float) -> None:
    """Real link changes through `dranet run` (host /sys, veth pair dnb0/dnb1 created here)."""
    from pyroute2 import IPRoute

    from harness.driver_process import DriverProcess

    kube = cp.kube()
    cp.create_node(LINK_NODE)
    work = Path(tempfile.mkdtemp(prefix="dn-bl-"))
    ipr = IPRoute()
    ipr.link("add", ifname="dnb0", kind="veth", peer="dnb1")
    drv = None
    try:
        idx = ipr.link_lookup(ifname="dnb0")[0]
        ipr.link("set", index=idx, mtu=1500)
        drv = DriverProcess(
            cp.kubeconfig,
            LINK_NODE,
            Path("/sys"),
            work / "drv",
            log_level="warning",
            extra_args=[
                "--filter",
                'device.attributes["dra.net"].ifName in ["dnb0", "dnb1"]',
                "--publish-interval",
                str(interval),
            ],
        )
        drv.start()
        deadline = time.monotonic() + 30
        while veth_mtu(kube) != 1500:
            if time.monotonic() > deadline:
                raise RuntimeError("veth never published:\n" + drv.log_tail())
            time.sleep(0.05)
        lat = []
        for n in range(1, samples + 1):
            time.sleep(interval * 1.05)
            mtu = 1500 + n
            t0 = time.perf_counter()
            ipr.link("set", index=idx, mtu=mtu)
            while veth_mtu(kube) != mtu:
                time.sleep(0.002)
            lat.append(time.perf_counter() - t0)
        print(
            f"link change (netlink MTU set -> dranet run rescan -> slice visible), n={len(lat)}: "
            f"median {statistics.median(lat) * 1000:.1f} ms, p99 {p99(lat) * 1000:.1f} ms"
        )
        time.sleep(interval * 1.05)
        gen0 = slice_generation(kube)
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 10.0:  # 100 link flaps per second
            n += 1
            ipr.link("set", index=idx, state="down" if n % 2 else "up")
            time.sleep(max(0.0, t0 + n / 100 - time.monotonic()))
        time.sleep(interval * 2)  # let the trailing write land
        writes = slice_generation(kube) - gen0
        limit = int(10.0 / interval) + 1
        print(
            f"link storm: {n} flaps in 10 s -> {writes} slice spec writes "
            f"(goal <= {limit} at interval {interval}s: {'OK' if writes <= limit else 'OVER'})"
        )
    finally:
        if drv is not None:
            drv.stop()
        try:
            ipr.link("del", ifname="dnb0")
        except Exception:  # noqa: BLE001 - already gone
            pass
        ipr.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--no-link", action="store_true", help="skip the real link-change part (needs root)")
    a = ap.parse_args()
    for name, ver in (("k8s", K8S_VERSION), ("etcd", ETCD_VERSION)):
        f = cache_root() / name / ver / "build-seconds"
        print(
            f"cold build {name} {ver}: "
            + (f"{float(f.read_text()):.0f} s" if f.exists() else "not built here (reused binaries)")
        )
    binaries = ensure_control_plane()
    starts = []
    for _ in range(2):  # the second start is warm (page cache, no build)
        with ControlPlane(binaries) as cp:
            starts.append(cp.start_seconds)
    print(
        f"control plane start (etcd+apiserver+scheduler+KCM healthy): first {starts[0]:.2f} s, warm {starts[1]:.2f} s"
    )
    with ControlPlane(binaries) as cp:
        asyncio.run(run(cp, a.samples, a.interval))
        if not a.no_link and os.geteuid() == 0:
            link_bench(cp, a.samples, a.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
