"""Pod start and stop through the whole node daemon, side by side with the bare kernel work.

``python -m bench.bench_hooks [--cycles 100] [--storm-cycles 100] [--idle 30]`` (root; ``make
bench-hooks``). One run starts a real control plane, ``dranet run`` as its own process on the
host's ``/sys`` with everything a node runs (NRI plugin, kubelet plugin with a connected health
stream, /metrics and /healthz, the link watch, the publisher, the claim status writer), and the
containerd/nri runtime adaptation (the Go harness, ``harness/nri_harness``) on a private socket.

Measured, interleaved ABBA (A = the driver, B = the floor) on twin sets of 4 veth NICs:

- **RunPodSandbox**: the NRI call as the runtime times it (Go side) for a pod whose claim holds 4
  NICs, each moved into the pod netns, renamed, MTU set, an address and a route added.
  Floor: the same kernel work done bare on the 4 twin NICs, in the fewest round trips: one
  pipelined batch of 4 RTM_NEWLINKs (move + rename + MTU each) from the host, then one pipelined
  batch of address, link-up and route requests in the pod netns; sockets opened beforehand.
- **StopPodSandbox**: the NRI call; the 4 NICs come back under their names with their MTU, host
  address and route. Floor: one pipelined batch of 4 RTM_NEWLINKs (move back + rename + MTU)
  from the pod netns, then one pipelined batch of address, link-up and route on the host.
- Both again while a link-flap storm (``bench/link_storm.py``, own process) flips 50 other
  published interfaces at 100 changes/s; afterwards the published ResourceSlices must equal a
  fresh full scan.
- **NodePrepareResources** for one claim (4 NICs with a config) against the local API server,
  floor: a bare GET of the same claim; and 100 claims prepared concurrently.
- Idle RSS and CPU of the daemon.
- The raw floor's kernel work again through pyroute2 (``bench.floors``: its message classes
  in one batch, and its asyncio API), in the same cycles on the same twin NICs: what the library
  would cost the pod path, beside the driver's own raw rtnetlink.

The driver's CPU seconds per pod cycle come from ``/proc/<pid>/stat`` (all threads) around each
cycle. The twin NICs are in ``--exclude-interfaces``, so the daemon neither publishes nor works on
them. Everything created is removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import health_watch
from bench.api_objects import bound_pod, nic_claim, published_devices, published_ifnames
from bench.floors import FLOORS, HOST_MTU, POD_MTU, Floor, Nic, Pyroute2Floor, open_cost_ms
from bench.stats import Row, abba, median, pct, process_cpu_seconds, rss_mb, table
from devcluster.builders.binaries import ensure_control_plane
from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import seed_docs
from driver.inventory.device_filter import DeviceFilter
from driver.inventory.discovery import Scanner
from driver.netlink.rtnl import Route
from harness.bounds import at_the_bounds
from harness.driver_process import DriverProcess
from harness.kubelet_client import KubeletClient
from harness.netns import NetnsFactory
from harness.nri import Harness, harness_binary, link_facts, pod_json

STORM_LINKS = 50
GOALS = {  # overhead over the floor (the fastest kernel sequence raced in the same run), ms
    "run": (1.0, 5.0),
    "stop": (1.0, 5.0),
    "run_storm": (None, 15.0),
    "stop_storm": (None, 15.0),
}
PREPARE_GOAL_MS = 4.8
"""NodePrepareResources median goal for one claim of 4 NICs with a config: the Go driver's, measured
on this project's VM (one GET and one bbolt commit)."""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _nic_set(factory: NetnsFactory, peer_ns: str, names: list[str], net: int, ipv6: bool = False) -> list[Nic]:
    """Veths (peers in ``peer_ns``) configured like a host NIC: up, an address, a route (IPv6 ones
    in ``fd<net>::/16``, the address added as detected, as a host's has been for long)."""
    out = []
    for i, name in enumerate(names):
        factory.veth(name, f"p{name[1:]}", peer_netns=peer_ns)
        _ip("-n", peer_ns, "link", "set", f"p{name[1:]}", "up")
        if ipv6:
            host_cidr = f"fd{net:02x}:0:0:{i}::1/64"
            host_route = Route(
                dst=f"fd{net + 1:02x}:0:{i * 16:x}::/60", gateway=f"fd{net:02x}:0:0:{i}::fe", family=socket.AF_INET6
            )
        else:
            host_cidr = f"10.{net}.{i}.1/24"
            host_route = Route(dst=f"10.{net + 1}.{i * 16}.0/20", gateway=f"10.{net}.{i}.254")
        _ip("link", "set", name, "mtu", str(HOST_MTU), "up")
        _ip("addr", "add", host_cidr, "dev", name, *(["nodad"] if ipv6 else []))
        _ip("route", "add", host_route.dst or "", "via", host_route.gateway or "", "dev", name)
        index = json.loads(subprocess.run(["ip", "-j", "link", "show", name], capture_output=True, text=True).stdout)[
            0
        ]["ifindex"]
        out.append(
            Nic(
                name,
                index,
                host_cidr,
                host_route,
                f"net{i + 1}",
                f"192.168.{i}.2/24",
                Route(dst=f"172.{16 + i}.0.0/16", gateway=f"192.168.{i}.1"),
            )
        )
    return out


OPAQUE_LIMIT = 10240
"""resource.k8s.io: bytes of one opaque config's parameters (OpaqueParametersMaxLength)."""
NRI_BUDGET_MS = 2000.0
"""containerd's default NRI plugin request timeout: a RunPodSandbox hook must answer within it."""


def heavy_params(nic: Nic, i: int, args: argparse.Namespace) -> dict[str, Any]:
    """The heaviest NetworkConfig for NIC ``i``: up to ``args.heavy_routes`` routes (half in a table
    of its own; as many as fit the API's limit), ``args.heavy_rules`` rules, ``args.heavy_neighbors``
    permanent neighbors, two addresses, the three sysctls and two ethtool features."""
    routes: list[dict[str, Any]] = [{"destination": nic.pod_route.dst, "gateway": nic.pod_route.gateway}]
    for k in range(args.heavy_routes - 1):
        route = {"destination": f"10.{100 + i}.{k // 16}.{(k % 16) * 16}/28", "gateway": f"192.168.{i}.1"}
        if k % 2:
            route["table"] = 100 + i
        routes.append(route)
    rules = [
        {"priority": 1000 + 100 * i + k, "source": f"192.168.{i}.{16 + k}/32", "table": 100 + i}
        for k in range(args.heavy_rules)
    ]
    neighbors = [
        {"destination": f"192.168.{i}.{128 + k}", "hardwareAddr": f"02:00:00:{i:02x}:{k:02x}:01"}
        for k in range(args.heavy_neighbors)
    ]
    params = {
        "interface": {
            "name": nic.pod_name,
            "mtu": POD_MTU,
            "addresses": [nic.pod_cidr, f"fd00:{i + 1}::2/64"],
            "forwarding": True,
            "arpIgnore": 1,
            "arpAnnounce": 2,
        },
        "routes": routes,
        "rules": rules,
        "neighbors": neighbors,
        "ethtool": {"features": {"tcp-segmentation-offload": False, "generic-receive-offload": True}},
    }
    # The API admits at most OPAQUE_LIMIT bytes of parameters per config: the heaviest config is
    # the one that fills it (routes dropped from the end until it fits).
    while len(json.dumps(params)) > OPAQUE_LIMIT:  # as our client sends it (default separators)
        routes.pop()
    return params


def mirrored(n: int, kinds: list[str]) -> list[str]:
    """``n`` cycles of every kind in mirrored blocks (A F1 F2 F2 F1 A ...): drift hits all alike."""
    out: list[str] = []
    for b in range(n):
        out += kinds if b % 2 == 0 else kinds[::-1]
    return out


@dataclass
class Results:
    """Samples of one scenario (ms) and the driver's CPU per cycle (s)."""

    run: list[float] = field(default_factory=list)
    stop: list[float] = field(default_factory=list)
    floor_run: list[float] = field(default_factory=list)
    floor_stop: list[float] = field(default_factory=list)
    floor_run_moves: list[float] = field(default_factory=list)  # the moves alone, of floor_run
    floors: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # candidate -> run/stop samples
    floor_choice: dict[str, str] = field(default_factory=dict)  # "run"/"stop" -> the fastest candidate
    lib_run: dict[str, list[float]] = field(default_factory=dict)  # the floor through pyroute2, by way
    lib_stop: dict[str, list[float]] = field(default_factory=dict)
    cpu_a: list[float] = field(default_factory=list)
    cpu_b: list[float] = field(default_factory=list)
    rescans: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # the daemon's counters during the cycles
    storm: dict[str, Any] = field(default_factory=dict)


class Bench:
    """Everything one run needs; :meth:`close` removes it all."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tok = secrets.token_hex(2)
        self.node = f"bench-hooks-{self.tok}"
        self.factory = NetnsFactory()
        self.cp: ControlPlane | None = None
        self.harness: Harness | None = None
        self.driver: DriverProcess | None = None
        self.floor: Floor | None = None
        self.lib_floors: dict[str, Pyroute2Floor] = {}
        self.storm_proc: subprocess.Popen[str] | None = None
        self.workdir = Path(tempfile.mkdtemp(prefix="dn-bh-", dir="/tmp"))
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="dn-bh-run-", dir="/dev/shm"))  # tmpfs, like /run
        self.health_proc: subprocess.Popen[str] | None = None
        self.empty_prepare: list[float] = []
        self.claims: dict[str, tuple[str, str, str]] = {}
        self.heavy_routes = 0
        self.conc_links: list[str] = []

    # -- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        p = f"db{self.tok}"
        net = random.randrange(100, 240, 2)
        peer_ns = self.factory.netns()
        self.hook_nics = _nic_set(self.factory, peer_ns, [f"{p}h{i}" for i in range(4)], net)
        self.floor_nics = _nic_set(self.factory, peer_ns, [f"{p}f{i}" for i in range(4)], net + 2)
        self.storm_links = [f"{p}s{i:02d}" for i in range(STORM_LINKS)]
        for name in self.storm_links:
            self.factory.veth(name, f"p{name[1:]}", peer_netns=peer_ns)
            # Peer up too: each flip then changes the published operstate (up/down), so the storm
            # also makes the daemon write slices (a down peer leaves it "down" either way).
            _ip("-n", peer_ns, "link", "set", f"p{name[1:]}", "up")
            _ip("link", "set", name, "up")
        # One NIC per claim of the concurrent prepare arm: a NIC is prepared for one claim at a time.
        self.conc_links = [f"{p}c{i:03d}" for i in range(self.args.concurrent)]
        for name in self.conc_links:
            self.factory.veth(name, f"p{name[1:]}", peer_netns=peer_ns)
        self.pod_ns = self.factory.netns()
        self.floor_ns = self.factory.netns()
        self.prefix = p
        ifname = 'device.attributes["dra.net"].ifName'
        self.filter = f'has({ifname}) && {ifname}.startsWith("{p}")'

        self.cp = ControlPlane(ensure_control_plane()).start()
        self.kube = self.cp.kube()
        self.cp.create_node(self.node)
        create_objects(self.kube, seed_docs()[0])
        self.harness = Harness.start(harness_binary())
        assert self.cp.kubeconfig is not None
        self.driver = DriverProcess(
            self.cp.kubeconfig,
            self.node,
            Path("/sys"),
            self.workdir / "drv",
            # Claims and pod state on tmpfs, as on a node (/run/dranet, /run/dranet/claims).
            extra_args=[
                "--filter",
                self.filter,
                "--runtime-dir",
                str(self.runtime_dir),
                "--state-dir",
                str(self.runtime_dir / "claims"),
            ],
            nri_socket=self.harness.socket,
            exclude_interfaces=",".join(["eth0"] + [n.ifname for n in self.floor_nics]),
            log_level=self.args.driver_log_level,
        ).start(timeout=60)
        res = self.harness.cmd("wait-sync", count=1, timeout=30)
        assert res["ok"], f"{res}\n{self.driver.log_tail()}"
        self.health_proc = health_watch.start(self.driver.registration_socket, self.driver.dra_socket)
        want = {n.ifname for n in self.hook_nics} | set(self.storm_links) | set(self.conc_links)
        wait_for(lambda: self.published_ifnames() == want, 60, what="slices with the benchmark's NICs")
        self.floor = Floor(self.floor_nics, f"/run/netns/{self.floor_ns}")
        if self.args.pyroute2_floor:
            for way, api in (("messages", False), ("api", True)):
                self.lib_floors[way] = Pyroute2Floor(self.floor_nics, f"/run/netns/{self.floor_ns}", api=api)
        self.pod = self.make_pod_claim()

    def published_ifnames(self) -> set[str]:
        return published_ifnames(self.kube, self.node)

    def published_devices(self) -> list[dict[str, Any]]:
        return published_devices(self.kube, self.node)

    def _claim(
        self,
        name: str,
        ifnames: list[str],
        pod: tuple[str, str] | None,
        heavy: bool = False,
        params: list[dict[str, Any]] | None = None,
    ) -> tuple[str, str, str]:
        """A claim allocated to ``ifnames`` (one request each, with a full NetworkConfig; ``heavy``:
        the heaviest config, :func:`heavy_params`; ``params``: each NIC's config as given)."""
        configs = []
        for i, _ in enumerate(ifnames):
            nic = self.hook_nics[i]
            configs.append(
                params[i]
                if params is not None
                else heavy_params(nic, i, self.args)
                if heavy
                else {
                    "interface": {"name": nic.pod_name, "mtu": POD_MTU, "addresses": [nic.pod_cidr]},
                    "routes": [{"destination": nic.pod_route.dst, "gateway": nic.pod_route.gateway}],
                }
            )
        return nic_claim(self.kube, name, self.node, ifnames, configs, pod)

    def _pod(self, name: str, claims: list[str]) -> str:
        """A real Pod object bound to the node (so its claims' reservations stay); its UID."""
        return bound_pod(self.kube, self.node, name, claims)

    def _prepared(self, claims: list[tuple[str, str, str]]) -> None:
        resp = asyncio.run(self._kubelet(lambda k: k.prepare(claims)))
        for claim in claims:
            assert resp.claims[claim[2]].error == "", resp.claims[claim[2]].error
            self.claims[claim[1]] = claim

    def make_pod_claim(self, name: str = "hooks", heavy: bool = False) -> dict[str, Any]:
        """The pod and its prepared claim of the 4 NICs."""
        uid = self._pod(name, [name])
        self._prepared([self._claim(name, [n.ifname for n in self.hook_nics], (name, uid), heavy)])
        return pod_json(uid, f"/run/netns/{self.pod_ns}", name=name)

    def make_bounds_pod(self, name: str = "hooks-bounds") -> dict[str, Any]:
        """A pod with two claims of two NICs each, every claim at the API's bounds
        (:func:`harness.bounds.at_the_bounds`: 400 netlink requests to configure the pod)."""
        params = at_the_bounds()
        halves = [f"{name}-a", f"{name}-b"]
        uid = self._pod(name, halves)
        nics = [n.ifname for n in self.hook_nics]
        self._prepared(
            [
                self._claim(halves[0], nics[:2], (name, uid), params=params[:2]),
                self._claim(halves[1], nics[2:], (name, uid), params=params[2:]),
            ]
        )
        return pod_json(uid, f"/run/netns/{self.pod_ns}", name=name)

    async def _kubelet(self, fn: Any) -> Any:
        assert self.driver is not None
        async with KubeletClient(self.driver.registration_socket, self.driver.dra_socket, timeout=30) as k:
            return await fn(k)

    # -- the pod cycles ----------------------------------------------------------------------
    def _nri(self, op: str) -> float:
        assert self.harness is not None
        res = self.harness.cmd(op, pod=self.pod)
        assert res["ok"], f"{op}: {res}\n{self.driver.log_tail() if self.driver else ''}"
        return float(res["seconds"]) * 1e3

    def cycles(self, n: int, out: Results) -> None:
        """``n`` pod cycles of the driver and of each floor candidate, interleaved; the floor columns
        get the fastest candidate (by median), run and stop separately."""
        assert self.driver is not None and self.driver.popen is not None and self.floor is not None
        pid, gap = self.driver.popen.pid, self.args.gap
        scans0, metrics0 = self.scan_count(), self.metrics()
        floors = {f: {"run": [], "stop": [], "moves": []} for f in self.args.floors}
        kinds = ["A", *self.args.floors]
        warm = len(kinds)  # one warm-up block, not recorded
        for i, kind in enumerate(mirrored(1, kinds) + mirrored(n, kinds)):
            cpu0 = process_cpu_seconds(pid)
            if kind == "A":
                run = self._nri("run")
                time.sleep(gap)
                stop = self._nri("stop")
            else:
                run = self.floor.run(kind)
                moves = self.floor.moves_ms
                time.sleep(gap)
                stop = self.floor.stop(kind)
                self.floor.check()
            time.sleep(gap)
            cpu = process_cpu_seconds(pid) - cpu0
            if kind == "batched":
                # The same kernel work through pyroute2, next to the raw floor (outside its CPU window).
                for way, lib in self.lib_floors.items():
                    out.lib_run.setdefault(way, []).append(lib.run())
                    time.sleep(gap)
                    out.lib_stop.setdefault(way, []).append(lib.stop())
                    self.floor.check()
                    time.sleep(gap)
                    if i < warm:
                        del out.lib_run[way][-1], out.lib_stop[way][-1]
            if i < warm:
                continue
            if kind == "A":
                out.run.append(run)
                out.stop.append(stop)
                out.cpu_a.append(cpu)
            else:
                floors[kind]["run"].append(run)
                floors[kind]["stop"].append(stop)
                floors[kind]["moves"].append(moves)
                out.cpu_b.append(cpu)
        out.floors = floors
        for op in ("run", "stop"):
            out.floor_choice[op] = min(floors, key=lambda f, op=op: median(floors[f][op]))
        out.floor_run = floors[out.floor_choice["run"]]["run"]
        out.floor_run_moves = floors[out.floor_choice["run"]]["moves"]
        out.floor_stop = floors[out.floor_choice["stop"]]["stop"]
        out.rescans = self.scan_count() - scans0
        metrics1 = self.metrics()
        out.counters = {
            k.removeprefix("dranet_driver_"): v - metrics0.get(k, 0.0)
            for k, v in metrics1.items()
            if k.startswith(("dranet_driver_link_events", "dranet_driver_inventory")) and v != metrics0.get(k, 0.0)
        }

    def metrics(self) -> dict[str, float]:
        """The daemon's counters (``/metrics``), by sample name with labels."""
        assert self.driver is not None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.driver.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(dranet_[a-z_]+_total(?:\{[^}]*\})?) (\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def scan_count(self) -> int:
        """Full scans the daemon did so far (its /metrics, or its log on older builds)."""
        assert self.driver is not None
        m = self.metrics()
        key = 'dranet_driver_inventory_updates_total{kind="full_scan"}'
        if key in m:
            return int(m[key])
        return self.driver.log().count("scan done")

    def check_nics_home(self) -> None:
        """Every NIC is back on the host with its address and route (nothing lost)."""
        for n in self.hook_nics + self.floor_nics:
            facts = link_facts(n.ifname)
            assert facts is not None, f"{n.ifname} missing"
            assert facts["addresses"] == [n.host_cidr], (n.ifname, facts)
            assert facts["mtu"] == HOST_MTU and facts["up"], (n.ifname, facts)
            assert any(r[0] == n.host_route.dst for r in facts["routes"]), (n.ifname, facts)

    def noop_round_trips(self, count: int) -> list[float]:
        """RunPodSandbox of a pod without claims: the NRI protocol's cost in the daemon, ms each."""
        assert self.harness is not None
        pod = pod_json(f"noop-{self.tok}", f"/run/netns/{self.pod_ns}", name="noop")
        res = self.harness.cmd("noop", pod=pod, count=count + 20)
        assert res["ok"], res
        return [s * 1e3 for s in res["seconds"][20:]]

    # -- storm -------------------------------------------------------------------------------
    def start_storm(self) -> None:
        self.storm_proc = subprocess.Popen(
            [sys.executable, "-m", "bench.link_storm", "--rate", str(self.args.storm_rate), *self.storm_links],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.storm_proc.stdout is not None
        assert json.loads(self.storm_proc.stdout.readline()).get("ready")

    def stop_storm(self) -> dict[str, Any]:
        assert self.storm_proc is not None and self.storm_proc.stdout is not None
        self.storm_proc.terminate()
        out = json.loads(self.storm_proc.stdout.readline())
        self.storm_proc.wait(10)
        self.storm_proc = None
        return out

    def slices_match_scan(self, timeout: float = 30.0) -> tuple[bool, str]:
        """After the storm: the published devices equal a fresh full scan (same filter), for our NICs."""
        scanner = Scanner("/sys", exclude_interfaces=["eth0"] + [n.ifname for n in self.floor_nics])
        flt = DeviceFilter(self.filter)

        def ours(devs: list[dict[str, Any]]) -> dict[str, Any]:
            return {d["name"]: d.get("attributes") for d in devs if d["name"].startswith(self.prefix)}

        deadline = time.monotonic() + timeout
        diff = ""
        while time.monotonic() < deadline:
            want = ours([d.to_api() for d in flt.apply(scanner.scan())])
            got = ours(self.published_devices())
            if want == got:
                return True, ""
            diff = f"{len(set(want) ^ set(got))} names differ, " + ", ".join(
                sorted(n for n in want if n in got and want[n] != got[n])[:5]
            )
            time.sleep(0.5)
        return False, diff

    # -- prepare -----------------------------------------------------------------------------
    def prepare_bench(self, n: int, concurrent: int) -> tuple[Row, float, list[float]]:
        """One claim prepared + unprepared n times (ABBA with a bare GET of it), then ``concurrent`` at once."""
        names = self.storm_links[:4]
        one = self._claim(f"prep-{self.tok}", names, None)
        many = [self._claim(f"conc-{self.tok}-{i}", [self.conc_links[i]], None) for i in range(concurrent)]
        getter = self.cp.kube() if self.cp else self.kube

        async def go(k: KubeletClient) -> tuple[list[float], list[float], float, list[float]]:
            path, floor = [], []
            for kind in ["A", "B"] * 2 + abba(2 * n):
                if kind == "A":
                    t0 = time.perf_counter()
                    r = await k.prepare([one])
                    path.append((time.perf_counter() - t0) * 1e3)
                    assert r.claims[one[2]].error == "", r.claims[one[2]].error
                    await asyncio.sleep(self.args.gap)
                    await k.unprepare([one])  # its status write (clearing our entries) follows: let it
                else:
                    t0 = time.perf_counter()
                    await asyncio.to_thread(getter.read_namespaced_resource_claim, "default", one[1])
                    floor.append((time.perf_counter() - t0) * 1e3)
                    await asyncio.sleep(self.args.gap)
                await asyncio.sleep(self.args.gap)

            async def timed(c: tuple[str, str, str]) -> float:
                t0 = time.perf_counter()
                r = await k.prepare([c])
                assert r.claims[c[2]].error == "", r.claims[c[2]].error
                return (time.perf_counter() - t0) * 1e3

            empty = []
            for _ in range(n):
                t0 = time.perf_counter()
                await k.prepare([])
                empty.append((time.perf_counter() - t0) * 1e3)
            self.empty_prepare = empty
            t0 = time.perf_counter()
            each = await asyncio.gather(*(timed(c) for c in many))
            wall = (time.perf_counter() - t0) * 1e3
            await k.unprepare(many)
            return path[2:], floor[2:], wall, list(each)

        path, floor, wall, each = asyncio.run(self._kubelet(go))
        row = Row("NodePrepareResources, 1 claim (4 NICs)", path, floor, goal_path_median=PREPARE_GOAL_MS)
        return row, wall, each

    # -- idle --------------------------------------------------------------------------------
    def idle(self, seconds: float) -> tuple[float, float, int]:
        """RSS (MB) at the end, CPU seconds used, full scans during ``seconds`` of nothing changing."""
        assert self.driver is not None and self.driver.popen is not None
        pid = self.driver.popen.pid
        time.sleep(3.0)  # let the last cycle's background work finish
        scans0, cpu0 = self.scan_count(), process_cpu_seconds(pid)
        time.sleep(seconds)
        return rss_mb(pid), process_cpu_seconds(pid) - cpu0, self.scan_count() - scans0

    # -- the heaviest config ------------------------------------------------------------------
    def _release_quiet_claim(self) -> None:
        """Unprepare the quiet pod's claim (its NICs are exclusive), once."""
        if "hooks" in self.claims:
            asyncio.run(self._kubelet(lambda k: k.unprepare([self.claims.pop("hooks")])))
        self.pod = {}  # nothing left to stop at close

    def _cycles(self, pod: dict[str, Any], n: int) -> tuple[list[float], list[float], str]:
        """``n`` run/stop cycles of ``pod`` after 2 of warm-up: run and stop times (ms), or the error."""
        assert self.harness is not None
        run: list[float] = []
        stop: list[float] = []
        for i in range(n + 2):
            r = self.harness.cmd("run", pod=pod)
            time.sleep(self.args.gap)
            t = self.harness.cmd("stop", pod=pod)
            time.sleep(self.args.gap)
            if not r["ok"] or not t["ok"]:
                return run, stop, str(r.get("error") or t.get("error"))[:300]
            if i >= 2:
                run.append(float(r["seconds"]) * 1e3)
                stop.append(float(t["seconds"]) * 1e3)
        return run, stop, ""

    def bounds(self, n: int) -> dict[str, Any]:
        """``n`` cycles of the pod whose two claims are at the API's bounds (:meth:`make_bounds_pod`)."""
        self._release_quiet_claim()
        pod = self.make_bounds_pod()
        run, stop, error = self._cycles(pod, n)
        both = [self.claims.pop(f"{pod['name']}-{half}") for half in "ab"]
        asyncio.run(self._kubelet(lambda k: k.unprepare(both)))
        return {"run": run, "stop": stop, "error": error}

    def heavy(self, n: int) -> list[dict[str, Any]]:
        """RunPodSandbox/StopPodSandbox of pods whose claim gives each of the 4 NICs the heaviest
        config (:func:`heavy_params`) scaled by each of ``--heavy-scales``; ``n`` cycles each (ms), or
        the error the hook answered. The quiet claim is unprepared first (the NICs are exclusive)."""
        self._release_quiet_claim()
        out = []
        full = self.args
        for scale in self.args.heavy_scales:
            self.args = argparse.Namespace(
                **{
                    **vars(full),
                    "heavy_routes": int(full.heavy_routes * scale),
                    "heavy_rules": int(full.heavy_rules * scale),
                    "heavy_neighbors": int(full.heavy_neighbors * scale),
                }
            )
            name = f"hooks-heavy-{int(scale * 100)}"
            params = heavy_params(self.hook_nics[0], 0, self.args)
            res: dict[str, Any] = {
                "routes": len(params["routes"]),
                "rules": len(params["rules"]),
                "neighbors": len(params["neighbors"]),
                "bytes": len(json.dumps(params)),
                "run": [],
                "stop": [],
                "error": "",
            }
            try:
                pod = self.make_pod_claim(name, heavy=True)
            except AssertionError as exc:  # refused at prepare: more than a pod's netlink batch takes
                res["error"] = f"refused at prepare: {str(exc)[:300]}"
                out.append(res)
                continue
            finally:
                self.args = full
            res["run"], res["stop"], res["error"] = self._cycles(pod, n)
            asyncio.run(self._kubelet(lambda k, c=self.claims[name]: k.unprepare([c])))
            out.append(res)
        return out

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        for proc in (self.storm_proc, self.health_proc):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
        try:
            if self.harness is not None and self.driver is not None and getattr(self, "pod", None):
                self.harness.cmd("stop", pod=self.pod)  # NICs home before the netns go
        except Exception:  # noqa: BLE001 - best effort; the netns removal frees virtual NICs anyway
            pass
        for lib in self.lib_floors.values():
            lib.close()
        if self.floor is not None:
            self.floor.close()
        if self.driver is not None:
            self.driver.stop()
            if self.args.keep_log:
                shutil.copy(self.driver.log_path, self.args.keep_log)
        if self.harness is not None:
            self.harness.close()
        if self.cp is not None:
            self.cp.stop()
        self.factory.cleanup()
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def _print_budget(what: str, cycles: dict[str, Any]) -> None:
    """One pod's run/stop times against the NRI budget, or the error that stopped its cycles."""
    if cycles["run"]:
        run, stop = cycles["run"], cycles["stop"]
        print(
            f"{what}, {len(run)} cycles: RunPodSandbox median {median(run):.1f} ms p99 {pct(run, 99):.1f} ms max"
            f" {max(run):.1f} ms ({pct(run, 99) / NRI_BUDGET_MS:.0%} of the {NRI_BUDGET_MS:.0f} ms NRI budget);"
            f" StopPodSandbox median {median(stop):.1f} ms p99 {pct(stop, 99):.1f} ms"
        )
    if cycles["error"]:
        print(f"{what}: FAILED after {len(cycles['run'])} cycles: {cycles['error']}")


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=100, help="pod cycles each for the driver and the floor")
    parser.add_argument("--storm-cycles", type=int, default=100)
    parser.add_argument("--storm-rate", type=float, default=100.0, help="link changes per second")
    parser.add_argument("--prepare", type=int, default=200, help="prepare samples each (driver, floor)")
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle measurement")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between pod operations")
    parser.add_argument("--noop", type=int, default=200, help="NRI round trips of a pod without claims")
    parser.add_argument("--floors", type=lambda v: v.split(","), default=list(FLOORS), help="floor candidates raced")
    parser.add_argument("--heavy", type=int, default=0, help="pod cycles with the heaviest config (after the rest)")
    parser.add_argument(
        "--bounds", type=int, default=0, help="pod cycles with two claims at the API's bounds (400 requests)"
    )
    parser.add_argument("--heavy-routes", type=int, default=300, help="routes per NIC of the heavy config")
    parser.add_argument("--heavy-rules", type=int, default=32)
    parser.add_argument("--heavy-neighbors", type=int, default=32)
    parser.add_argument(
        "--heavy-scales",
        type=lambda v: [float(x) for x in v.split(",")],
        # 0.13: 39 routes, 4 rules, 4 neighbors and 2 addresses per NIC, 4 x 50 = 200 netlink requests:
        # the most a pod's NICs may take (driver.api.v1alpha1.decode.MAX_POD_REQUESTS); larger ones are refused.
        default=[1.0, 0.5, 0.25, 0.13, 0.1],
        help="fractions of the heavy config's routes, rules and neighbors, one pod each",
    )
    parser.add_argument("--json", help="also write the raw samples here")
    parser.add_argument("--driver-log-level", default="info", help="the daemon's --log-level")
    parser.add_argument("--keep-log", help="copy the daemon's log here at the end")
    parser.add_argument(
        "--pyroute2-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the floor's kernel work through pyroute2 (its messages, its asyncio API)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)")
        return 1
    b = Bench(args)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    loads = [_load()]
    try:
        b.setup()
        noop = b.noop_round_trips(args.noop)
        quiet = Results()
        if args.cycles:
            b.cycles(args.cycles, quiet)
            loads.append(_load())
            b.check_nics_home()
        storm = Results()
        if args.storm_cycles:
            b.start_storm()
            try:
                b.cycles(args.storm_cycles, storm)
            finally:
                storm.storm = b.stop_storm()
            loads.append(_load())
            b.check_nics_home()
            ok, diff = b.slices_match_scan()
            storm.storm["slices_match_scan"] = ok
            storm.storm["diff"] = diff
        prep = b.prepare_bench(args.prepare, args.concurrent) if args.prepare else None
        loads.append(_load())
        rss, idle_cpu, idle_scans = b.idle(args.idle)
        loads.append(_load())
        heavy = b.heavy(args.heavy) if args.heavy else None
        loads.append(_load())
        at_bounds = b.bounds(args.bounds) if args.bounds else None
        loads.append(_load())
        opens = open_cost_ms(f"/run/netns/{b.floor_ns}", 200) if args.pyroute2_floor else None
    finally:
        b.close()

    def cpu(r: Results) -> float:
        # Means: /proc/<pid>/stat counts in 10 ms ticks, a per-cycle median would be 0 or 10 ms.
        return sum(r.cpu_a) / max(1, len(r.cpu_a)) - sum(r.cpu_b) / max(1, len(r.cpu_b))

    rows = []
    if quiet.run:
        rows += [
            Row("RunPodSandbox, 4 NICs", quiet.run, quiet.floor_run, cpu(quiet), *GOALS["run"]),
            Row("StopPodSandbox, 4 NICs", quiet.stop, quiet.floor_stop, None, *GOALS["stop"]),
        ]
    if storm.run:
        rows += [
            Row("RunPodSandbox, link storm", storm.run, storm.floor_run, cpu(storm), *GOALS["run_storm"]),
            Row("StopPodSandbox, link storm", storm.stop, storm.floor_stop, None, *GOALS["stop_storm"]),
        ]
    for label, r in (("", quiet), (", link storm", storm)):
        # Against the raw "batched" floor of the same cycles: the same requests, the same shape.
        raw = r.floors.get("batched", {"run": r.floor_run, "stop": r.floor_stop})
        for way in r.lib_run:
            rows += [
                Row(f"RunPodSandbox floor via pyroute2 {way}{label}", r.lib_run[way], raw["run"]),
                Row(f"StopPodSandbox floor via pyroute2 {way}{label}", r.lib_stop[way], raw["stop"]),
            ]
    if prep:
        rows.append(prep[0])
    print(f"\nmachine: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs; started {started}")
    print(f"command: python -m bench.bench_hooks {' '.join(argv)}")
    print(f"load average (1/5/15 min) at start and after each phase: {' | '.join(loads)}")
    print(table(rows))
    print(
        f"driver CPU per pod cycle (run + stop, incl. the background work they cause): "
        f"mean {sum(quiet.cpu_a) / max(1, len(quiet.cpu_a)):.4f} s (floor cycles, the driver idle: "
        f"{sum(quiet.cpu_b) / max(1, len(quiet.cpu_b)):.4f} s); the table shows the difference"
    )
    if noop:  # --noop 0 skips it
        print(
            f"NRI round trip, pod without claims (the protocol alone): median {median(noop):.2f} ms "
            f"p99 {pct(noop, 99):.2f} ms"
        )
    print(f"full rescans during the quiet cycles: {quiet.rescans}; during the storm cycles: {storm.rescans}")
    print(f"daemon counters during the quiet cycles: {quiet.counters}")
    print(f"daemon counters during the storm cycles: {storm.counters}")
    if storm.storm:
        print(f"storm: {storm.storm}")
    if prep:
        _row, wall, each = prep
        if each:  # --concurrent 0 skips the concurrent phase
            print(
                f"NodePrepareResources, {args.concurrent} claims concurrently: wall {wall:.1f} ms, "
                f"per call median {median(each):.2f} ms p99 {pct(each, 99):.2f} ms"
            )
        print(
            f"NodePrepareResources with no claims (the gRPC round trip alone): median "
            f"{median(b.empty_prepare):.2f} ms p99 {pct(b.empty_prepare, 99):.2f} ms"
        )
    if opens:
        print(
            f"a NETLINK_ROUTE socket opened in a pod netns (thread inside it) and closed: raw median "
            f"{median(opens[0]):.3f} ms p99 {pct(opens[0], 99):.3f} ms, pyroute2 IPRoute median "
            f"{median(opens[1]):.3f} ms p99 {pct(opens[1], 99):.3f} ms"
        )
    print(f"idle ({args.idle:.0f} s): RSS {rss:.1f} MB, CPU {idle_cpu:.3f} s, full rescans {idle_scans}")
    for label, res in (("quiet", quiet), ("storm", storm)):
        for f, samples in res.floors.items():
            print(
                f"floor candidate {f} ({label}): run median {median(samples['run']):.2f} "
                f"p99 {pct(samples['run'], 99):.2f} ms"
                f" (moves alone median {median(samples['moves']):.2f}), stop median {median(samples['stop']):.2f}"
                f" p99 {pct(samples['stop'], 99):.2f} ms"
            )
        if res.floor_choice:
            print(f"floor used ({label}): run {res.floor_choice['run']}, stop {res.floor_choice['stop']}")
    for h in heavy or []:
        what = (
            f"heavy config, 4 NICs x ({h['routes']} routes, {h['rules']} rules, {h['neighbors']} neighbors, "
            "2 addresses,"
            f" 3 sysctls, 2 ethtool features; {h['bytes']} B of parameters each)"
        )
        _print_budget(what, h)
    if at_bounds is not None:
        _print_budget("two claims at the API's bounds on 4 NICs (400 netlink requests)", at_bounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"quiet": quiet.__dict__, "storm": storm.__dict__}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
