"""This driver side by side with the Go driver (kubernetes-sigs/dranet), both real daemons, one run.

``DRANET_GO_SOURCE=/path/to/dranet python -m bench.bench_vs_go [--cycles 60] [--prepare 100]`` (root).
The Go driver is built from the source that variable names (a checkout, or a git directory such as
a fetched snapshot; see ``bench/go_driver.py``), cached outside the work tree by commit.

One real control plane; two nodes in it, one per driver, so each publishes its own pool. Each
driver runs as it does on a node: this one is ``dranet run`` on the host's ``/sys`` (NRI plugin,
kubelet plugin with a connected health stream, /metrics, link watch, publisher, status writer;
claims and pod state on tmpfs, as ``/run/dranet``, and its CDI specs, as ``/var/run/cdi``), the Go one is its
``dranet`` binary (its bbolt database on tmpfs, as ``/var/run/dranet`` is on a node). Each has its
own containerd/nri runtime harness (``harness/nri_harness``) on a private socket, its own kubelet
root with the registration and DRA sockets (registered like the kubelet's plugin watcher does),
and its own 4 veth NICs that the other does not publish (``--exclude-interfaces``/``--filter``).
A third set of 4 veths is the floor's.

Every NIC starts like a host NIC: MTU 1500, up, an address and a route. Each driver's pod has a
claim of its 4 NICs with a config: renamed to ``netN``, MTU 1400, and the NIC's address and route
(the NIC keeps its network in the pod; the Go driver's RunPodSandbox fails on a host NIC whose
connected route names an address the pod does not get, since it copies the NIC's host routes).

Measured, in mirrored blocks (A = this driver, B = the Go driver, C.. = the floor candidates:
A B C.. ..C B A ...):

- **RunPodSandbox / StopPodSandbox**: the NRI calls as the runtime times them (Go side). Floor: the
  raced kernel floor of ``bench_hooks`` (``bench/floors.py``) on its twin NICs; the fastest
  candidate by median, per row.
- **Driver CPU per Run+Stop cycle**: utime+stime of the daemon (``/proc/<pid>/stat``, all threads)
  over its own cycles, minus the same daemon's over the floor cycles (its background and its
  reactions to NICs not its own), mean per cycle.
- **Host NICs intact after stop**: cycles after which all 4 NICs were back with name, MTU,
  addresses and routes identical to before (``ip -j``, outside the timed and CPU windows). A NIC
  that is not is put back (MTU, address, route) before the next cycle, so every cycle of both
  drivers starts from the same host state.
- **NodePrepareResources** (one claim of 4 NICs with the same config, reserved for a real Pod:
  the Go driver does nothing for a claim without one) and **NodeUnprepareResources** through each
  driver's kubelet socket, blocks A B C C B A with C = a bare GET of the claim (prepare's floor).
- **RSS** of each daemon at the end (after ``--settle`` seconds).

Both daemons see every link of the host and react to the other arms' NIC moves too (the Go driver
rescans on any link event, this one drops events of NICs not its own); that is in every slot
alike, and the CPU row subtracts it (the floor cycles' share).

Everything created (veths, namespaces, processes, temp dirs) is removed at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import health_watch
from bench.api_objects import bound_pod, nic_claim, published_ifnames
from bench.bench_hooks import _nic_set, mirrored
from bench.floors import FLOORS, HOST_MTU, POD_MTU, Floor, Nic
from bench.go_driver import SOURCE_ENV, GoDriver, GoSource, SourceError, build, go_filter, go_version, locate
from bench.stats import median, pct, process_cpu_seconds, rss_mb
from devcluster.builders.binaries import ensure_control_plane
from devcluster.cluster.controlplane import ControlPlane, create_objects, wait_for
from devcluster.demo.allocation import seed_docs
from harness.driver_process import DriverProcess
from harness.kubelet_client import ClaimTuple, KubeletClient
from harness.netns import NetnsFactory
from harness.nri import Harness, harness_binary, link_facts, pod_json

ARMS = ("py", "go")
ARM_NAMES = {"py": "this driver", "go": "Go driver"}
HOME_KEYS = ("ifname", "mtu", "addresses", "routes")
"""What "intact" compares: a NIC back under its name with its MTU, addresses and routes."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_vs_go", description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=60, help="pod cycles of each driver and each floor candidate")
    parser.add_argument("--prepare", type=int, default=100, help="prepare+unprepare calls of each driver (and GETs)")
    parser.add_argument(
        "--go-source",
        default=os.environ.get(SOURCE_ENV) or None,
        help=f"the Go driver's source: a checkout or a git directory (default: ${SOURCE_ENV})",
    )
    parser.add_argument("--go-v", type=int, default=0, help="the Go driver's klog --v (its install.yaml: 4)")
    parser.add_argument("--driver-log-level", default="info", help="this driver's --log-level")
    parser.add_argument(
        "--driver-args",
        type=shlex.split,
        default=[],
        help="more flags for this driver's `dranet run`, one string: --driver-args='--no-device-metadata'",
    )
    parser.add_argument(
        "--together", type=int, default=10, help="cycles of the pods started and stopped together (0: none)"
    )
    parser.add_argument("--together-pods", type=int, default=8, help="pods of one NIC each in those cycles")
    parser.add_argument("--ipv6", action="store_true", help="the NICs' host addresses and routes IPv6 (default IPv4)")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between operations")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before the prepares and RSS")
    parser.add_argument("--floors", type=lambda v: v.split(","), default=list(FLOORS), help="floor candidates raced")
    parser.add_argument("--json", help="also write the raw samples here")
    parser.add_argument("--keep-logs", help="copy both daemons' and both harnesses' logs into this directory")
    args = parser.parse_args(list(argv))
    if args.cycles < 1 or args.prepare < 0:
        parser.error("--cycles must be at least 1 and --prepare at least 0")
    unknown = set(args.floors) - set(FLOORS)
    if unknown or not args.floors:
        parser.error(f"--floors: choose among {','.join(FLOORS)}")
    return args


def cycle_order(blocks: int, kinds: Sequence[str]) -> list[str]:
    """``blocks`` blocks of ``kinds``, every other one reversed: A B C C B A A B C ...(ABCCBA)."""
    return mirrored(blocks, list(kinds))


# -- host NICs -------------------------------------------------------------------------------------


def home_facts(facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of :func:`harness.nri.link_facts` that "intact" compares."""
    return None if facts is None else {k: facts.get(k) for k in HOME_KEYS}


def home_diff(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """Empty when the NIC is back as it was; else what differs (``mtu 1500 -> 1400; ...``)."""
    if after is None:
        return "missing"
    if before is None:
        return "not there before"
    return "; ".join(f"{k} {before.get(k)} -> {after.get(k)}" for k in HOME_KEYS if before.get(k) != after.get(k))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def put_back(nic: Nic) -> None:
    """The host config of ``nic`` again (MTU, up, address, route), untimed, idempotent."""
    _ip("link", "set", "dev", nic.ifname, "mtu", str(HOST_MTU), "up")
    _ip("addr", "replace", nic.host_cidr, "dev", nic.ifname, *(["nodad"] if ":" in nic.host_cidr else []))
    _ip("route", "replace", nic.host_route.dst or "", "via", nic.host_route.gateway or "", "dev", nic.ifname)


def keeps_its_network(nics: list[Nic]) -> list[Nic]:
    """The NICs with the pod side given the host's address and route (the claim's config below)."""
    return [dataclasses.replace(n, pod_cidr=n.host_cidr, pod_route=n.host_route) for n in nics]


def nic_params(nic: Nic) -> dict[str, Any]:
    """The claim's config for one NIC: the pod name, the pod MTU, its address and route."""
    return {
        "interface": {"name": nic.pod_name, "mtu": POD_MTU, "addresses": [nic.pod_cidr]},
        "routes": [{"destination": nic.pod_route.dst, "gateway": nic.pod_route.gateway}],
    }


# -- the table -------------------------------------------------------------------------------------


def p99(values: list[float]) -> float:
    return pct(values, 99) if values else 0.0


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


@dataclass
class Compared:
    """One row measured as samples (ms): this driver, the Go driver, and the floor where there is one."""

    name: str
    ours: list[float]
    go: list[float]
    floor: list[float] = field(default_factory=list)

    def verdict(self) -> str:
        """ahead (lower median, p99 not higher), behind (both higher), level (both equal), else mixed."""
        dm = median(self.ours) - median(self.go)
        dp = p99(self.ours) - p99(self.go)
        if dm == 0 and dp == 0:
            return "level"
        if dm < 0 and dp <= 0:
            return "ahead"
        if dm > 0 and dp > 0:
            return "behind"
        return "mixed"

    def cells(self) -> list[str]:
        def mp(v: list[float]) -> str:
            return f"{median(v):.2f} / {p99(v):.2f} ms" if v else "–"

        def over(v: list[float]) -> str:
            if not (v and self.floor):
                return "–"
            return f"{ratio(median(v), median(self.floor))} ({median(v) - median(self.floor):+.2f} ms)"

        n = f"{len(self.ours)} / {len(self.go)}" if len(self.ours) != len(self.go) else str(len(self.ours))
        return [
            self.name,
            n,
            mp(self.ours),
            mp(self.go),
            mp(self.floor),
            f"{ratio(median(self.ours), median(self.go))} / {ratio(p99(self.ours), p99(self.go))}",
            over(self.ours),
            over(self.go),
            self.verdict(),
        ]


@dataclass
class Scalar:
    """One row that is a single figure per driver (CPU, RSS, a count)."""

    name: str
    ours: float
    go: float
    unit: str = ""
    digits: int = 1
    higher_is_better: bool = False
    n: str = ""
    out_of: int | None = None  # a count "k/out_of" (NICs intact)

    def verdict(self) -> str:
        if self.ours == self.go:
            return "level"
        better = self.ours > self.go if self.higher_is_better else self.ours < self.go
        return "ahead" if better else "behind"

    def _value(self, v: float) -> str:
        if self.out_of is not None:
            return f"{int(v)}/{self.out_of}"
        return f"{v:.{self.digits}f} {self.unit}".rstrip()

    def cells(self) -> list[str]:
        r = "–" if self.out_of is not None else ratio(self.ours, self.go)
        return [self.name, self.n, self._value(self.ours), self._value(self.go), "–", r, "–", "–", self.verdict()]


HEADER = [
    "figure",
    "n",
    "this driver median / p99",
    "Go driver median / p99",
    "floor median / p99",
    "this ÷ Go (median / p99)",
    "this ÷ floor (median, over)",
    "Go ÷ floor (median, over)",
    "this driver vs Go",
]


def render(rows: Sequence[Compared | Scalar]) -> str:
    """A Markdown table of the rows."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Cycles:
    """Pod cycles: run/stop ms by arm (``py``, ``go``, each floor candidate), CPU seconds by driver."""

    run: dict[str, list[float]] = field(default_factory=dict)
    stop: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})  # own cycles
    idle_cpu: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})  # floor cycles
    intact: dict[str, int] = field(default_factory=lambda: {a: 0 for a in ARMS})
    first_diff: dict[str, str] = field(default_factory=dict)

    def floor_of(self, op: str, floors: Sequence[str]) -> tuple[str, list[float]]:
        """The fastest floor candidate (by median) for ``op`` and its samples."""
        samples = self.run if op == "run" else self.stop
        best = min(floors, key=lambda f: median(samples.get(f, [])) or float("inf"))
        return best, samples.get(best, [])

    def cpu_ms(self, arm: str) -> float:
        """Mean CPU ms per own cycle minus the mean over the floor cycles."""
        own, idle = self.cpu[arm], self.idle_cpu[arm]
        return _mean_ms(own) - _mean_ms(idle)


@dataclass
class Prepares:
    """NodePrepareResources / NodeUnprepareResources ms by driver, the bare GET, CPU per call pair."""

    prepare: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    unprepare: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    get: list[float] = field(default_factory=list)
    empty: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    empty_after_gap: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    idle_cpu: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})


@dataclass
class Together:
    """Pods of one NIC each started together (their prepares at once, then their RunPodSandbox at
    once) and stopped together (StopPodSandbox at once, then the unprepares), ms by driver: each
    cycle's total and each pod's own time."""

    start: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    start_pod: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    stop: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    stop_pod: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in ARMS})
    pods: int = 0


def rows_of(
    cycles: Cycles,
    prep: Prepares | None,
    memory: dict[str, float],
    floors: Sequence[str],
    together: Together | None = None,
) -> list[Any]:
    """The table of issue 37: prepare, unprepare, Run, Stop, CPU, RSS, NICs intact."""
    rows: list[Any] = []
    if prep is not None and prep.prepare["py"]:
        rows.append(
            Compared("NodePrepareResources, 1 claim of 4 NICs", prep.prepare["py"], prep.prepare["go"], prep.get)
        )
        rows.append(Compared("NodeUnprepareResources, same claim", prep.unprepare["py"], prep.unprepare["go"]))
    n = str(len(cycles.run.get("py", [])))
    rows.append(
        Compared("RunPodSandbox, 4 NICs", cycles.run["py"], cycles.run["go"], cycles.floor_of("run", floors)[1])
    )
    rows.append(
        Compared("StopPodSandbox, 4 NICs", cycles.stop["py"], cycles.stop["go"], cycles.floor_of("stop", floors)[1])
    )
    if together is not None and together.start["py"]:
        k = together.pods
        rows.append(
            Compared(f"{k} pods of 1 NIC started together: all started", together.start["py"], together.start["go"])
        )
        rows.append(
            Compared("... each pod (prepare + RunPodSandbox)", together.start_pod["py"], together.start_pod["go"])
        )
        rows.append(Compared(f"{k} pods stopped together: all done", together.stop["py"], together.stop["go"]))
        rows.append(
            Compared("... each pod (StopPodSandbox + unprepare)", together.stop_pod["py"], together.stop_pod["go"])
        )
    rows.append(Scalar("driver CPU per Run+Stop cycle (mean)", cycles.cpu_ms("py"), cycles.cpu_ms("go"), "ms", n=n))
    rows.append(Scalar("RSS at the end", memory.get("py", 0.0), memory.get("go", 0.0), "MB"))
    rows.append(
        Scalar(
            "host NICs intact after stop (all 4: name, MTU, addresses, routes)",
            cycles.intact["py"],
            cycles.intact["go"],
            higher_is_better=True,
            n=n,
            out_of=len(cycles.run.get("py", [])),
        )
    )
    return rows


class VsGo:
    """Everything one run needs; :meth:`close` removes it all."""

    def __init__(self, args: argparse.Namespace, go_binary: Path, harness_bin: Path) -> None:
        self.args = args
        self.go_binary = go_binary
        self.harness_bin = harness_bin
        self.tok = secrets.token_hex(2)
        self.prefix = f"dv{self.tok}"
        self.nodes = {arm: f"vs-go-{self.tok}-{arm}" for arm in ARMS}
        self.factory = NetnsFactory()
        self.workdir = Path(tempfile.mkdtemp(prefix="dn-vg-", dir="/tmp"))
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="dn-vg-run-", dir="/dev/shm"))  # tmpfs, like /run
        self.cp: ControlPlane | None = None
        self.harness: dict[str, Harness] = {}
        self.py: DriverProcess | None = None
        self.go: GoDriver | None = None
        self.health_proc: subprocess.Popen[str] | None = None
        self.floor: Floor | None = None
        self.nics: dict[str, list[Nic]] = {}
        self.prep_nics: dict[str, list[Nic]] = {}
        self.many_nics: dict[str, list[Nic]] = {}  # one per pod of the pods started together
        self.many: dict[str, list[tuple[ClaimTuple, dict[str, Any]]]] = {arm: [] for arm in ARMS}
        self.pods: dict[str, dict[str, Any]] = {}
        self.running: set[str] = set()  # arms whose pod holds its NICs
        self.prepared: dict[str, list[ClaimTuple]] = {arm: [] for arm in ARMS}
        self.prep_claim: dict[str, ClaimTuple] = {}
        self.home: dict[str, dict[str, Any] | None] = {}

    # -- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        p = self.prefix
        net = 100 + 20 * random.randrange(0, 7)  # 10.<net..net+13>.x.x: seven NIC sets, a route each
        peer_ns = self.factory.netns()
        for k, (key, letter) in enumerate((("py", "a"), ("go", "g"), ("floor", "f"))):
            names = [f"{p}{letter}{i}" for i in range(4)]
            self.nics[key] = keeps_its_network(_nic_set(self.factory, peer_ns, names, net + 2 * k, self.args.ipv6))
        for k, (arm, letter) in enumerate((("py", "a"), ("go", "g"))):
            names = [f"{p}{letter}{i}" for i in range(4, 8)]
            self.prep_nics[arm] = keeps_its_network(
                _nic_set(self.factory, peer_ns, names, net + 6 + 2 * k, self.args.ipv6)
            )
        for k, (arm, letter) in enumerate((("py", "a"), ("go", "g"))):
            names = [f"{p}{letter}t{i}" for i in range(self.args.together_pods if self.args.together else 0)]
            self.many_nics[arm] = keeps_its_network(
                _nic_set(self.factory, peer_ns, names, net + 10 + 2 * k, self.args.ipv6)
            )
        for nic in self.nics["py"] + self.nics["go"] + self.many_nics["py"] + self.many_nics["go"]:
            self.home[nic.ifname] = home_facts(link_facts(nic.ifname))
        pod_ns = {arm: self.factory.netns() for arm in ARMS}
        floor_ns = self.factory.netns()

        self.cp = ControlPlane(ensure_control_plane()).start()
        assert self.cp.kubeconfig is not None
        self.kube = self.cp.kube()
        for node in self.nodes.values():
            self.cp.create_node(node)
        create_objects(self.kube, seed_docs()[0])
        for arm in ARMS:
            self.harness[arm] = Harness.start(self.harness_bin)

        ifname = 'device.attributes["dra.net"].ifName'
        others = [n.ifname for n in self.nics["go"] + self.nics["floor"] + self.prep_nics["go"] + self.many_nics["go"]]
        self.py = DriverProcess(
            self.cp.kubeconfig,
            self.nodes["py"],
            Path("/sys"),
            self.workdir / "py",
            extra_args=[
                "--filter",
                f'has({ifname}) && {ifname}.startsWith("{p}a")',
                "--runtime-dir",
                str(self.runtime_dir / "py"),
                "--state-dir",
                str(self.runtime_dir / "py" / "claims"),
                # CDI specs on tmpfs too, as /var/run/cdi on a node (the chart's deviceMetadata.cdiDir)
                "--cdi-dir",
                str(self.runtime_dir / "py" / "cdi"),
                *self.args.driver_args,
            ],
            nri_socket=self.harness["py"].socket,
            exclude_interfaces=",".join(["eth0", *others]),
            log_level=self.args.driver_log_level,
        ).start(timeout=60)
        self._synced("py")
        # The kubelet's side: registration and the health stream this driver offers (the Go one has none).
        self.health_proc = health_watch.start(self.py.registration_socket, self.py.dra_socket)

        self.go = GoDriver(
            self.go_binary,
            self.cp.kubeconfig,
            self.nodes["go"],
            self.workdir / "go",
            self.runtime_dir / "go",
            self.harness["go"].socket,
            go_filter(f"{p}g"),
            verbosity=self.args.go_v,
        ).start(timeout=90)
        self._synced("go")

        for arm in ARMS:
            want = {n.ifname for n in self.nics[arm] + self.prep_nics[arm] + self.many_nics[arm]}
            wait_for(lambda arm=arm, want=want: self.published(arm) == want, 60, what=f"{arm}'s slices")
        self.floor = Floor(self.nics["floor"], f"/run/netns/{floor_ns}")

        for arm in ARMS:
            uid = self._pod(arm, f"{arm}-pod")
            claim = self._claim(arm, f"{arm}-pod", self.nics[arm], (f"{arm}-pod", uid))
            resp = self._kubelet(arm, lambda k, c=claim: k.prepare([c]))
            assert resp.claims[claim[2]].error == "", f"{arm}: {resp.claims[claim[2]].error}\n{self.log_tail(arm)}"
            self.prepared[arm].append(claim)
            self.pods[arm] = pod_json(uid, f"/run/netns/{pod_ns[arm]}", name=f"{arm}-pod")
            prep_uid = self._pod(arm, f"{arm}-prep")
            self.prep_claim[arm] = self._claim(arm, f"{arm}-prep", self.prep_nics[arm], (f"{arm}-prep", prep_uid))
            for i, nic in enumerate(self.many_nics[arm]):
                name = f"{arm}-t{i}"
                uid = self._pod(arm, name)
                claim = self._claim(arm, name, [nic], (name, uid))
                self.many[arm].append((claim, pod_json(uid, f"/run/netns/{self.factory.netns()}", name=name)))

    def _synced(self, arm: str) -> None:
        res = self.harness[arm].cmd("wait-sync", count=1, timeout=30)
        assert res["ok"], f"{arm}: no NRI Synchronize: {res}\n{self.log_tail(arm)}"

    def log_tail(self, arm: str) -> str:
        proc = self.py if arm == "py" else self.go
        return proc.log_tail() if proc is not None else ""

    def pid(self, arm: str) -> int:
        proc = self.py if arm == "py" else self.go
        assert proc is not None and proc.popen is not None
        return proc.popen.pid

    def published(self, arm: str) -> set[str]:
        return published_ifnames(self.kube, self.nodes[arm])

    def _pod(self, arm: str, name: str) -> str:
        """A real Pod object bound to the arm's node, using one claim named like it; its UID."""
        return bound_pod(self.kube, self.nodes[arm], name, [name])

    def _claim(self, arm: str, name: str, nics: list[Nic], pod: tuple[str, str]) -> ClaimTuple:
        """A claim allocated on the arm's node to ``nics`` (a request and a :func:`nic_params` config
        each), reserved for ``pod``."""
        return nic_claim(self.kube, name, self.nodes[arm], [n.ifname for n in nics], [nic_params(n) for n in nics], pod)

    def _client(self, arm: str) -> KubeletClient:
        if arm == "py":
            assert self.py is not None
            return KubeletClient(self.py.registration_socket, self.py.dra_socket, timeout=30)
        assert self.go is not None
        return KubeletClient(self.go.registration_socket, self.go.dra_socket, timeout=30)

    def _kubelet(self, arm: str, fn: Callable[[KubeletClient], Awaitable[Any]]) -> Any:
        async def go() -> Any:
            async with self._client(arm) as k:
                return await fn(k)

        return asyncio.run(go())

    # -- pod cycles --------------------------------------------------------------------------
    def _nri(self, arm: str, op: str) -> float:
        res = self.harness[arm].cmd(op, pod=self.pods[arm])
        if not res["ok"]:
            raise RuntimeError(f"{ARM_NAMES[arm]}: {op} failed: {res}\n{self.log_tail(arm)}")
        return float(res["seconds"]) * 1e3

    def nics_home(self, arm: str, out: Cycles) -> bool:
        """Untimed: are all 4 NICs of ``arm`` back as before? Those that are not are put back."""
        intact = True
        for nic in self.nics[arm]:
            diff = home_diff(self.home[nic.ifname], home_facts(link_facts(nic.ifname)))
            if not diff:
                continue
            intact = False
            out.first_diff.setdefault(arm, f"{nic.ifname}: {diff}")
            if diff == "missing":
                raise RuntimeError(f"{ARM_NAMES[arm]}: {nic.ifname} did not come back\n{self.log_tail(arm)}")
            put_back(nic)
            again = home_diff(self.home[nic.ifname], home_facts(link_facts(nic.ifname)))
            if again:
                raise RuntimeError(f"{nic.ifname} could not be put back: {again}")
        return intact

    def cycles(self, n: int) -> Cycles:
        """One warm-up block, then ``n`` mirrored blocks of this driver, the Go driver and each floor."""
        assert self.floor is not None
        gap = self.args.gap
        kinds = [*ARMS, *self.args.floors]
        out = Cycles(run={k: [] for k in kinds}, stop={k: [] for k in kinds})
        warm = len(kinds)
        for i, kind in enumerate(cycle_order(n + 1, kinds)):
            cpu0 = {a: process_cpu_seconds(self.pid(a)) for a in ARMS}
            if kind in ARMS:
                run = self._nri(kind, "run")
                self.running.add(kind)
                time.sleep(gap)
                stop = self._nri(kind, "stop")
                self.running.discard(kind)
            else:
                run = self.floor.run(kind)
                time.sleep(gap)
                stop = self.floor.stop(kind)
            time.sleep(gap)
            cpu = {a: process_cpu_seconds(self.pid(a)) - cpu0[a] for a in ARMS}
            if kind in ARMS:
                intact = self.nics_home(kind, out)
            else:
                self.floor.check()
            time.sleep(gap)
            if i < warm:
                continue
            out.run[kind].append(run)
            out.stop[kind].append(stop)
            if kind in ARMS:
                out.cpu[kind].append(cpu[kind])
                out.intact[kind] += int(intact)
            else:
                for a in ARMS:
                    out.idle_cpu[a].append(cpu[a])
        return out

    # -- pods started together ---------------------------------------------------------------
    def together(self, n: int) -> Together:
        """One warm-up cycle of each driver, then ``n`` cycles of each (A B B A): its pods'
        prepares at once (the kubelet prepares each pod's claims on its own), their RunPodSandbox
        at once; a pause; StopPodSandbox at once, the unprepares at once. Each NIC is checked
        (and put back) after, untimed."""
        out = Together(pods=len(self.many["py"]))

        async def calls(arm: str, method: str) -> list[float]:
            """Each pod's call, all at once over one connection: ms from the common start to its answer."""
            async with self._client(arm) as k:
                t0 = time.perf_counter()

                async def one(claim: ClaimTuple) -> float:
                    resp = await (k.prepare([claim]) if method == "prepare" else k.unprepare([claim]))
                    if resp.claims[claim[2]].error:
                        raise RuntimeError(f"{ARM_NAMES[arm]}: {method}: {resp.claims[claim[2]].error}")
                    return (time.perf_counter() - t0) * 1e3

                return list(await asyncio.gather(*(one(c) for c, _ in self.many[arm])))

        for i, arm in enumerate(cycle_order(n + 1, ARMS)):
            pods = [pod for _, pod in self.many[arm]]
            t0 = time.perf_counter()
            asyncio.run(calls(arm, "prepare"))
            t1 = time.perf_counter()
            run = self._together(arm, "run-all", pods)
            t2 = time.perf_counter()
            time.sleep(self.args.gap)
            t3 = time.perf_counter()
            stop = self._together(arm, "stop-all", pods)
            t4 = time.perf_counter()
            unprepared = asyncio.run(calls(arm, "unprepare"))
            t5 = time.perf_counter()
            for nic in self.many_nics[arm]:
                if home_diff(self.home[nic.ifname], home_facts(link_facts(nic.ifname))):
                    put_back(nic)
            time.sleep(self.args.gap)
            if i < len(ARMS):
                continue
            out.start[arm].append((t2 - t0) * 1e3)
            out.stop[arm].append((t5 - t3) * 1e3)
            # Each pod's own time, from the common start to its last answer: the prepares, then its
            # RunPodSandbox; its StopPodSandbox, then the unprepares.
            out.start_pod[arm] += [(t1 - t0) * 1e3 + r for r in run]
            out.stop_pod[arm] += [(t4 - t3) * 1e3 + u for u in unprepared]
            del stop
        return out

    def _together(self, arm: str, op: str, pods: list[dict[str, Any]]) -> list[float]:
        res = self.harness[arm].cmd(op, pods=pods)
        if not res["ok"]:
            raise RuntimeError(f"{ARM_NAMES[arm]}: {op} failed: {res}\n{self.log_tail(arm)}")
        return [float(s) * 1e3 for s in res["seconds"]]

    # -- prepare -----------------------------------------------------------------------------
    def prepare(self, n: int) -> Prepares:
        """``n`` prepare+unprepare pairs of each driver's claim, and ``n`` bare GETs, in blocks A B C C B A."""
        out = Prepares()
        gap = self.args.gap
        assert self.cp is not None
        getter = self.cp.kube()
        claim_name = self.prep_claim["py"][1]  # the GET floor reads this driver's claim (the same shape)

        async def go() -> None:
            async with self._client("py") as kpy, self._client("go") as kgo:
                clients = {"py": kpy, "go": kgo}
                for i, kind in enumerate(cycle_order(n + 2, [*ARMS, "get"])):
                    cpu0 = {a: process_cpu_seconds(self.pid(a)) for a in ARMS}
                    if kind == "get":
                        t0 = time.perf_counter()
                        await asyncio.to_thread(getter.read_namespaced_resource_claim, "default", claim_name)
                        took = [(time.perf_counter() - t0) * 1e3]
                        await asyncio.sleep(gap)
                    else:
                        took = await self._prepare_pair(clients[kind], kind)
                    await asyncio.sleep(gap)
                    cpu = {a: process_cpu_seconds(self.pid(a)) - cpu0[a] for a in ARMS}
                    if i < 6:  # two warm-up blocks
                        continue
                    if kind == "get":
                        out.get.append(took[0])
                        for a in ARMS:
                            out.idle_cpu[a].append(cpu[a])
                    else:
                        out.prepare[kind].append(took[0])
                        out.unprepare[kind].append(took[1])
                        out.cpu[kind].append(cpu[kind])
                for i in range(2 * n):  # the gRPC round trip alone: a prepare of no claims, A B B A
                    arm = ARMS[0] if i % 4 in (0, 3) else ARMS[1]
                    t0 = time.perf_counter()
                    await clients[arm].prepare([])
                    out.empty[arm].append((time.perf_counter() - t0) * 1e3)
                # The same after --gap idle, as the calls above come: a driver idle between the
                # kubelet's calls wakes its threads for each (the floor of an unprepare).
                for i in range(n):
                    arm = ARMS[0] if i % 4 in (0, 3) else ARMS[1]
                    await asyncio.sleep(gap)
                    t0 = time.perf_counter()
                    await clients[arm].prepare([])
                    out.empty_after_gap[arm].append((time.perf_counter() - t0) * 1e3)

        asyncio.run(go())
        return out

    async def _prepare_pair(self, k: KubeletClient, arm: str) -> list[float]:
        claim = self.prep_claim[arm]
        t0 = time.perf_counter()
        r = await k.prepare([claim])
        prep = (time.perf_counter() - t0) * 1e3
        if r.claims[claim[2]].error:
            raise RuntimeError(f"{ARM_NAMES[arm]}: prepare: {r.claims[claim[2]].error}\n{self.log_tail(arm)}")
        await asyncio.sleep(self.args.gap)
        t0 = time.perf_counter()
        r = await k.unprepare([claim])
        unprep = (time.perf_counter() - t0) * 1e3
        if r.claims[claim[2]].error:
            raise RuntimeError(f"{ARM_NAMES[arm]}: unprepare: {r.claims[claim[2]].error}\n{self.log_tail(arm)}")
        return [prep, unprep]

    def memory(self) -> dict[str, float]:
        """Each daemon's RSS (MB) after ``--settle`` quiet seconds, and its peak (``<arm>_peak``)."""
        time.sleep(self.args.settle)
        out = {}
        for arm in ARMS:
            out[arm] = rss_mb(self.pid(arm))
            out[f"{arm}_peak"] = _vm_hwm_mb(self.pid(arm))
        return out

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        steps: list[Callable[[], Any]] = []
        for arm in ARMS:
            if arm in self.running:  # NICs home before the namespaces go
                steps.append(lambda arm=arm: self.harness[arm].cmd("stop", pod=self.pods[arm]))
            if self.prepared[arm]:
                steps.append(lambda arm=arm: self._kubelet(arm, lambda k: k.unprepare(self.prepared[arm])))
        steps.append(self._stop_health)
        if self.args.keep_logs:
            steps.append(self._keep_logs)
        steps += [
            lambda: self.py.stop() if self.py else None,
            lambda: self.go.stop() if self.go else None,
            lambda: [h.close() for h in self.harness.values()],
            lambda: self.floor.close() if self.floor else None,
            lambda: self.cp.stop() if self.cp else None,
            self.factory.cleanup,
            lambda: shutil.rmtree(self.workdir, ignore_errors=True),
            lambda: shutil.rmtree(self.runtime_dir, ignore_errors=True),
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every later step still runs
                print(f"cleanup: {exc!r}"[:300], file=sys.stderr)

    def _stop_health(self) -> None:
        proc = self.health_proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def _keep_logs(self) -> None:
        dest = Path(self.args.keep_logs)
        dest.mkdir(parents=True, exist_ok=True)
        for name, path in (
            ("py-driver.log", self.py.log_path if self.py else None),
            ("go-driver.log", self.go.log_path if self.go else None),
            *((f"{arm}-harness.log", Path(h.workdir) / "harness.log") for arm, h in self.harness.items()),
        ):
            if path is not None and path.exists():
                shutil.copy(path, dest / name)


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of ``pid`` in MB (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def _mean_ms(seconds: Sequence[float]) -> float:
    """The mean of CPU seconds per window, in ms (0 without windows)."""
    return 1e3 * sum(seconds) / max(1, len(seconds))


def report(
    b: VsGo,
    argv: Sequence[str],
    source: GoSource,
    cycles: Cycles,
    prep: Prepares | None,
    memory: dict[str, float],
    together: Together | None = None,
) -> str:
    """Everything printed after a run: context, the table, the details behind its rows."""
    floors = b.args.floors
    lines = [
        f"machine: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs",
        f"command: python -m bench.bench_vs_go {shlex.join(argv)}",
        f"Go driver: {source.describe()}, built with {go_version()}: {b.go_binary}",
        "Go driver command line: " + (shlex.join(b.go.command()) if b.go else "–"),
        "  (environment: NRI_PLUGIN_SOCKET=<fd of a connection to its NRI harness>, TMPDIR=<its workdir>)",
        "",
        render(rows_of(cycles, prep, memory, floors, together)),
        "",
    ]
    for op in ("run", "stop"):
        best = cycles.floor_of(op, floors)[0]
        each = ", ".join(
            f"{f} {median(cycles.run[f] if op == 'run' else cycles.stop[f]):.2f}"
            f" / {p99(cycles.run[f] if op == 'run' else cycles.stop[f]):.2f}"
            for f in floors
        )
        lines.append(f"floor candidates, {op} median / p99 ms: {each}; used: {best}")
    for arm in ARMS:
        own, idle = cycles.cpu[arm], cycles.idle_cpu[arm]
        lines.append(
            f"{ARM_NAMES[arm]} CPU: {_mean_ms(own):.1f} ms per own cycle, "
            f"{_mean_ms(idle):.1f} ms per floor cycle (idle, others' NICs moving); "
            f"RSS peak {memory.get(f'{arm}_peak', 0.0):.1f} MB"
        )
        if arm in cycles.first_diff:
            lines.append(f"{ARM_NAMES[arm]}: first NIC not intact after stop: {cycles.first_diff[arm]}")
    refused = b.go.log().count("Failed to update status for claim") if b.go else 0
    if refused:
        lines.append(
            f"Go driver: {refused} claim status writes refused by the apiserver (its server-side apply of"
            " status.devices re-encodes the allocation's opaque parameters: 422 'cannot be modified once set')"
        )
    if prep is not None and prep.prepare["py"]:
        for arm in ARMS:
            own, idle = prep.cpu[arm], prep.idle_cpu[arm]
            lines.append(
                f"{ARM_NAMES[arm]}: CPU per prepare + unprepare window {_mean_ms(own):.1f} ms"
                f" (per GET window {_mean_ms(idle):.1f} ms); "
                f"NodePrepareResources with no claims (the gRPC round trip) median {median(prep.empty[arm]):.2f} "
                f"ms p99 {p99(prep.empty[arm]):.2f} ms, {b.args.gap * 1e3:.0f} ms after the last call median "
                f"{median(prep.empty_after_gap[arm]):.2f} ms p99 {p99(prep.empty_after_gap[arm]):.2f} ms"
            )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    try:
        source = locate(args.go_source)
    except SourceError as exc:
        print(exc, file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("needs root (network namespaces, veths)", file=sys.stderr)
        return 1
    go_binary = build(source)
    harness_bin = harness_binary()
    b = VsGo(args, go_binary, harness_bin)
    started = time.monotonic()
    loads = [_load()]
    prep: Prepares | None = None
    try:
        b.setup()
        loads.append(_load())
        cycles = b.cycles(args.cycles)
        loads.append(_load())
        together = b.together(args.together) if args.together else None
        if args.prepare:
            time.sleep(args.settle)  # the daemons' reactions to the last cycles are done
            prep = b.prepare(args.prepare)
            loads.append(_load())
        memory = b.memory()
        out = report(b, argv, source, cycles, prep, memory, together)
    finally:
        b.close()
    print(out)
    print(f"load average (1/5/15 min) at start, after setup, the cycles, the prepares: {' | '.join(loads)}")
    print(f"wall time: {time.monotonic() - started:.0f} s (setup, measurement and cleanup; the Go build before it)")
    if args.json:
        raw = {
            "cycles": dataclasses.asdict(cycles),
            "prepare": dataclasses.asdict(prep) if prep else None,
            "together": dataclasses.asdict(together) if together else None,
        }
        run = {
            "argv": list(argv),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "family": "ipv6" if args.ipv6 else "ipv4",
            "load_averages": loads,
            "table": out,
        }
        Path(args.json).write_text(json.dumps({"run": run, **raw, "memory": memory}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
