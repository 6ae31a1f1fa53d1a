"""What the driver costs the API server per node, counted on the API server's side (its audit log).

``python -m bench.bench_apiserver_load [--drivers 20] [--steady 360] [--extra-nodes 200] [--storm 30]``

A real kube-apiserver (etcd; no scheduler or controller-manager, so what is counted is the
drivers') writes an audit log of every request made by the drivers' identities: each ``dranet run``
is its own process with its own node name, fixture sysfs tree (ND H100 v5) and ServiceAccount
token, so the log tells the processes apart. The cluster also holds ``--extra-nodes`` simulated
GPU nodes (this driver's and a GPU driver's slices, 2 allocated claims each), so the requests whose
answer grows with the cluster show it. Phases:

- **start**: each driver started in turn; its requests until it is healthy and 10 s quiet;
- **steady**: all drivers running, nothing changing, ``--steady`` seconds: requests per minute
  by verb; writes must be zero;
- **per claim**: one driver prepares and unprepares claims of 4 NICs + 4 GPUs (the allocation
  written like the scheduler writes it) through the kubelet's gRPC API;
- **rolling update**: every driver stopped and started again on its state (a DaemonSet rolling
  update): requests and response bytes per restart;
- **link storm** (root): one more driver on the host's ``/sys`` publishing 50 veths that
  ``bench/link_storm.py`` flips at 100 changes/s for ``--storm`` seconds: slice writes per 100
  link changes.

Response bytes are the JSON of each audited response body (``RequestResponse`` level), so watch
streams are not in them (a quiet node's watch carries only bookmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from bench.api_objects import create_allocated_claim
from bench.scale_fleet import GPU_DRIVER, Fleet, fixture_gpus, gpu_slice
from devcluster.builders.binaries import ensure_control_plane
from devcluster.cluster import certs
from devcluster.cluster.controlplane import ControlPlane, ControlPlaneOptions, create_node, create_objects, wait_for
from devcluster.demo.allocation import build_fixture, seed_docs
from driver.kube.client import RESOURCE_API, KubeClient
from harness.driver_process import DriverProcess
from harness.kubelet_client import KubeletClient

SA_NS = "dranet-bench"
CLAIM_NS = "workloads"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: RequestResponse
  userGroups: ["system:serviceaccounts:{SA_NS}"]
- level: None
"""


@dataclass
class Req:
    """One audited request of a driver."""

    user: str
    verb: str
    resource: str
    uri: str
    code: int
    bytes: int

    @property
    def what(self) -> str:
        u = urlparse(self.uri)
        q = "&".join(p for p in u.query.split("&") if p.split("=")[0] in ("fieldSelector", "limit", "dryRun", "watch"))
        q = q.replace("%3D", "=").replace("%2C", ",").replace(self.user, "<node>")
        return f"{self.verb.upper()} {self.resource} {q}".strip()

    @property
    def write(self) -> bool:
        """Changes something stored (a dry run does not)."""
        return self.verb in WRITE_VERBS and "dryRun=" not in self.uri


class Audit:
    """Reads the audit log from an offset: the requests made since :meth:`mark`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self) -> list[Req]:
        time.sleep(1.0)  # the log backend writes each event as the request completes
        out = []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        for line in data.splitlines():
            ev = json.loads(line)
            stage = ev.get("stage")
            # A watch is logged when it starts and when it ends; a request once, when complete.
            if ev.get("verb") == "watch" and stage != "ResponseStarted":
                continue
            if ev.get("verb") != "watch" and stage != "ResponseComplete":
                continue
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            body = ev.get("responseObject")
            out.append(
                Req(
                    ev["user"]["username"].rsplit(":", 1)[-1],
                    ev["verb"],
                    resource,
                    ev.get("requestURI", ""),
                    (ev.get("responseStatus") or {}).get("code", 0),
                    len(json.dumps(body, separators=(",", ":"))) if body is not None else 0,
                )
            )
        return out


def summarize(reqs: list[Req], per: int = 1) -> str:
    """Requests by kind (``verb resource query``), each count divided by ``per``."""
    c = Counter(r.what for r in reqs)
    b: Counter[str] = Counter()
    for r in reqs:
        b[r.what] += r.bytes
    return "; ".join(f"{n / per:g}x {w} ({b[w] / per / 1024:.1f} KiB)" for w, n in c.most_common())


@dataclass
class Node:
    name: str
    driver: DriverProcess


@dataclass
class Bench:
    args: argparse.Namespace
    work: Path
    cp: ControlPlane | None = None
    nodes: list[Node] = field(default_factory=list)
    storm_driver: DriverProcess | None = None

    def identity(self, kube: KubeClient, name: str) -> Path:
        """A ServiceAccount ``name`` (cluster-admin; we count, not authorize) and a kubeconfig with its token."""
        assert self.cp is not None and self.cp.creds is not None
        kube.request(
            "POST",
            f"/api/v1/namespaces/{SA_NS}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
        kube.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{SA_NS}-{name}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": SA_NS}],
            },
        )
        tok = kube.request(
            "POST",
            f"/api/v1/namespaces/{SA_NS}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}},
        )["status"]["token"]
        path = self.work / f"{name}.kubeconfig"
        path.write_text(certs.kubeconfig_yaml(self.cp.server, self.cp.creds.ca_crt, tok))
        return path

    def add_driver(self, kube: KubeClient, i: int) -> Node:
        name = f"node-{i:03d}"
        create_node(kube, name)
        kc = self.identity(kube, name)
        work = self.work / name
        drv = DriverProcess(kc, name, build_fixture("nd-h100-v5", work / "sysfs"), work / "drv", log_level="warning")
        uid = kube.read_node(name)["metadata"]["uid"]
        kube.request("POST", f"{RESOURCE_API}/resourceslices", gpu_slice(name, uid, fixture_gpus(work / "sysfs")))
        return Node(name, drv)

    def close(self) -> None:
        for n in self.nodes:
            n.driver.stop()
        if self.storm_driver is not None:
            self.storm_driver.stop()
        if self.cp is not None:
            self.cp.stop()


def gpu_nic_claim(
    kube: KubeClient, ns: str, name: str, node: str, nics: list[str], gpus: list[str]
) -> tuple[str, str, str]:
    """A claim of ``nics`` and ``gpus`` on ``node``, allocated the way the scheduler writes it."""
    results = [{"request": "nic", "driver": "dra.net", "pool": node, "device": d} for d in nics]
    results += [{"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": g} for g in gpus]
    requests = [
        {"name": "nic", "exactly": {"deviceClassName": "dranet.net", "count": len(nics)}},
        {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER, "count": len(gpus)}},
    ]
    return create_allocated_claim(kube, ns, name, requests, results)


ND_NICS = [f"pci-01{i:02x}-00-00-0" for i in range(1, 9)]
ND_GPUS = [f"gpu-{i}" for i in range(8)]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drivers", type=int, default=20, help="dranet run processes against the one apiserver")
    ap.add_argument("--steady", type=float, default=360.0, help="seconds of steady state (>= the 300 s watch timeout)")
    ap.add_argument("--extra-nodes", type=int, default=200, help="simulated GPU nodes besides the drivers' nodes")
    ap.add_argument("--claims", type=int, default=10, help="claims prepared and unprepared by one driver")
    ap.add_argument("--storm", type=float, default=30.0, help="seconds of link storm (root only; 0: skip)")
    ap.add_argument("--quiet-after-start", type=float, default=10.0)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dn-apil-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(POLICY)
    log_path = work / "audit.log"
    opts = ControlPlaneOptions(
        scheduler=False,
        controller_manager=False,
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={log_path}", "--audit-log-format=json"),
    )
    b = Bench(args, work)
    audit = Audit(log_path)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    out: list[str] = []

    def say(line: str) -> None:
        out.append(line)
        print(line, flush=True)

    try:
        b.cp = ControlPlane(ensure_control_plane(), opts).start()
        kube = b.cp.kube()
        create_objects(kube, seed_docs()[0])
        for ns in (SA_NS, CLAIM_NS):
            create_objects(kube, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}])
        fleet = Fleet(kube, prefix="sim")
        fleet.grow(args.extra_nodes)
        for n in fleet.nodes:  # 2 claims per simulated node: what a driver's start lists
            for k in range(2):
                gpu_nic_claim(kube, CLAIM_NS, f"{n.name}-{k}", n.name, [], ND_GPUS[4 * k : 4 * k + 4])
        say(
            f"cluster: {args.extra_nodes} simulated GPU nodes, {2 * args.extra_nodes} allocated claims, "
            "+ the drivers' nodes"
        )

        # -- start ---------------------------------------------------------------------------
        starts: list[list[Req]] = []
        for i in range(args.drivers):
            node = b.add_driver(kube, i)
            b.nodes.append(node)
            audit.mark()
            node.driver.start(timeout=180)
            time.sleep(args.quiet_after_start)
            starts.append([r for r in audit.since_mark() if r.user == node.name])
        first = starts[0]
        say(
            f"start of one driver (first start: empty checkpoint, no slices yet): {len(first)} requests: "
            f"{summarize(first)}"
        )
        later = [r for s in starts[1:] for r in s]
        if later:
            say(
                f"start, mean of the next {len(starts) - 1}: {len(later) / (len(starts) - 1):g} requests: "
                f"{summarize(later, len(starts) - 1)}"
            )

        # -- steady --------------------------------------------------------------------------
        audit.mark()
        t0 = time.monotonic()
        time.sleep(args.steady)
        minutes = (time.monotonic() - t0) / 60
        steady = [r for r in audit.since_mark() if r.user.startswith("node-")]
        writes = [r for r in steady if r.write]
        say(
            f"steady state, {args.drivers} drivers, {minutes:.1f} min: {len(steady) / args.drivers / minutes:.2f} "
            f"requests/min per driver, writes {len(writes)}: {summarize(steady, args.drivers)} "
            "(per driver, whole window)"
        )

        # -- per claim -----------------------------------------------------------------------
        node = b.nodes[0]
        claims = [
            gpu_nic_claim(kube, CLAIM_NS, f"c{i}", node.name, ND_NICS[:4] if i % 2 == 0 else ND_NICS[4:], ND_GPUS[:4])
            for i in range(args.claims)
        ]
        audit.mark()

        async def cycle() -> None:
            async with KubeletClient(node.driver.registration_socket, node.driver.dra_socket, timeout=30) as k:
                await k.register()
                for c in claims:
                    r = await k.prepare([c])
                    assert r.claims[c[2]].error == "", r.claims[c[2]].error
                    await asyncio.sleep(0.5)  # the status write follows the answer
                    await k.unprepare([c])
                    await asyncio.sleep(0.5)

        asyncio.run(cycle())
        time.sleep(3)
        per_claim = [r for r in audit.since_mark() if r.user == node.name]
        say(
            f"per claim (prepare + unprepare, 4 NICs + 4 GPUs): {len(per_claim) / len(claims):g} requests: "
            f"{summarize(per_claim, len(claims))}"
        )

        # -- rolling update ------------------------------------------------------------------
        audit.mark()
        t0 = time.monotonic()
        for n in b.nodes:
            n.driver.restart()
        time.sleep(args.quiet_after_start)
        roll = [r for r in audit.since_mark() if r.user.startswith("node-")]
        nbytes = sum(r.bytes for r in roll)
        say(
            f"rolling update of {len(b.nodes)} drivers ({time.monotonic() - t0:.0f} s): {len(roll) / len(b.nodes):g} "
            f"requests and {nbytes / len(b.nodes) / 1024:.1f} KiB of responses per restart, "
            f"writes {sum(r.write for r in roll)}: {summarize(roll, len(b.nodes))}"
        )
        total_nodes = args.extra_nodes + args.drivers
        say(f"cluster at the rolling update: {total_nodes} nodes, {2 * args.extra_nodes + args.claims} claims")

        # -- link storm ----------------------------------------------------------------------
        if args.storm and os.geteuid() == 0:
            say(storm(b, kube, audit, args.storm))
    finally:
        b.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmachine: {os.uname().nodename} {os.uname().release}, {os.cpu_count()} CPUs; started {started}")
    print(f"command: python -m bench.bench_apiserver_load {' '.join(argv)}")
    print("\n".join(out))
    return 0


def storm(b: Bench, kube: KubeClient, audit: Audit, seconds: float, log_level: str = "warning") -> str:
    """One driver on the host's /sys publishing 50 veths that a storm flips: its writes per 100 changes."""
    from harness.netns import NetnsFactory

    factory = NetnsFactory()
    prefix = f"dl{secrets.token_hex(2)}"
    names = [f"{prefix}s{i:02d}" for i in range(50)]
    proc = None
    try:
        peer_ns = factory.netns()
        for name in names:
            factory.veth(name, f"p{name[1:]}", peer_netns=peer_ns)
            # Both ends up: each flip of the host end changes its published operstate (up/down).
            subprocess.run(["ip", "-n", peer_ns, "link", "set", f"p{name[1:]}", "up"], check=True)
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        node = "storm-node"
        create_node(kube, node)
        kc = b.identity(kube, node)
        ifname = 'device.attributes["dra.net"].ifName'
        b.storm_driver = DriverProcess(
            kc,
            node,
            Path("/sys"),
            b.work / "storm",
            extra_args=["--filter", f'has({ifname}) && {ifname}.startsWith("{prefix}")'],
            log_level=log_level,
        ).start(timeout=120)
        wait_for(
            lambda: (
                sum(
                    len(s["spec"].get("devices") or [])
                    for s in kube.list_resource_slice(f"spec.driver=dra.net,spec.nodeName={node}")["items"]
                )
                == len(names)
            ),
            60,
            what="the storm driver's 50 veths published",
        )
        time.sleep(5)
        audit.mark()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.link_storm", "--rate", "100", *names], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and json.loads(proc.stdout.readline()).get("ready")
        time.sleep(seconds)
        proc.terminate()
        result = json.loads(proc.stdout.readline())
        proc.wait(10)
        proc = None
        time.sleep(5)  # the last coalesced write
        reqs = [r for r in audit.since_mark() if r.user == node]
        writes = [r for r in reqs if r.write]
        return (
            f"link storm: {result['changes']} link changes in {result['seconds']:.0f} s -> {len(writes)} writes "
            f"({100 * len(writes) / max(1, result['changes']):.2f} per 100 changes), {len(reqs)} requests: "
            f"{summarize(reqs)}"
        )
    finally:
        if proc is not None:
            proc.kill()
        if b.storm_driver is not None:
            b.storm_driver.stop()
            b.storm_driver = None
        factory.cleanup()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
