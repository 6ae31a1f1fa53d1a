"""NRI test plumbing: the Go runtime-side harness, our plugin as a real process, checkpoint/pod helpers.

- :func:`harness_binary` builds ``harness/nri_harness`` (containerd/nri's runtime adaptation)
  once, cached under ``~/.cache/dranet/nri-harness/<nri version>+<source hash>/``.
- :class:`Harness` runs it on a private socket and sends it JSON commands.
- :class:`DriverProcess` runs ``python -m harness.nri`` = our NRIPlugin + NRIHooks in
  a separate process (so tests can SIGKILL it, or make it ``os._exit`` via DRANET_FAULT_AFTER).
- :func:`link_facts` reads a link's state with ``ip -j`` (independent of the code under test).

Run as a module, this file is that driver process.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HARNESS_SRC = ROOT / "harness" / "nri_harness"
NRI_VERSION = "v0.12.5"


def _nri_version() -> str:
    for line in (HARNESS_SRC / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "github.com/containerd/nri":
            return parts[1]
    return NRI_VERSION


def harness_binary() -> Path:
    """Build (or reuse) the harness binary; raises when Go or the module proxy is unavailable."""
    files = {n: (HARNESS_SRC / n).read_text() for n in ("main.go", "go.sum") if (HARNESS_SRC / n).exists()}
    gomod = (HARNESS_SRC / "go.mod").read_text()
    digest = hashlib.sha256((gomod + "".join(files.values())).encode()).hexdigest()[:10]
    version = f"{_nri_version()}+{digest}"  # source hash: an edited main.go never reuses a stale binary
    try:
        from devcluster.builders.binaries import GoBuild, build_go_tool
    except ImportError:  # pragma: no cover - fallback when devcluster is absent
        return _build_locally(version, gomod, files)
    bin_dir = build_go_tool(
        "nri-harness",
        version,
        gomod,
        [GoBuild(packages=(".",), output="nri-harness", tags=("nri_no_wasm",))],
        extra_files=files,
    )
    return bin_dir / "nri-harness"


def _build_locally(version: str, gomod: str, files: dict[str, str]) -> Path:
    base = Path(os.environ.get("DRANET_CACHE_DIR", Path.home() / ".cache" / "dranet")) / "nri-harness" / version
    binary = base / "bin" / "nri-harness"
    if binary.exists():
        return binary
    src = base / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(gomod)
    for name, text in files.items():
        (src / name).write_text(text)
    env = dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=mod", CGO_ENABLED="0")
    tmp = base / "bin.tmp"
    subprocess.run(
        ["go", "build", "-tags", "nri_no_wasm", "-o", str(tmp / "nri-harness"), "."], cwd=src, env=env, check=True
    )
    tmp.rename(base / "bin")
    return binary


@dataclass
class Harness:
    """A running nri-harness process (the runtime side) listening on ``socket``."""

    proc: subprocess.Popen[str]
    socket: str
    workdir: str

    @classmethod
    def start(cls, binary: Path, request_timeout_s: float | None = None) -> Harness:
        """Start it on a fresh socket in a short private directory (unix paths max 107 bytes);
        ``request_timeout_s``: the time the driver gets for one call (None: the runtimes' 2 s)."""
        workdir = tempfile.mkdtemp(prefix="dn-nri-", dir="/tmp")
        sock = f"{workdir}/nri.sock"
        plugins = f"{workdir}/plugins"
        os.mkdir(plugins)
        proc = subprocess.Popen(
            [
                str(binary),
                "-socket",
                sock,
                "-plugin-dir",
                plugins,
                *(["-request-timeout", f"{request_timeout_s}s"] if request_timeout_s else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(f"{workdir}/harness.log", "w"),
            text=True,
        )
        h = cls(proc, sock, workdir)
        ready = h._read()
        if not ready.get("ok"):
            h.close()
            raise RuntimeError(f"nri-harness failed to start: {ready}")
        return h

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"nri-harness exited; log: {self.log()[-2000:]}")
        return json.loads(line)

    def cmd(self, op: str, **kw: Any) -> dict[str, Any]:
        """Send one command and return its JSON answer (``ok``, ``error``, results)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def log(self) -> str:
        """The harness's stderr (NRI adaptation logs)."""
        try:
            return Path(f"{self.workdir}/harness.log").read_text()
        except OSError:
            return ""

    def close(self) -> None:
        """Stop the process and remove its directory."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass
class DriverProcess:
    """Our NRI plugin (NRIPlugin + NRIHooks) in its own process."""

    proc: subprocess.Popen[bytes]
    log_path: str

    @classmethod
    def start(
        cls,
        socket: str,
        state_dir: str,
        fault_after: str | None = None,
        log_path: str | None = None,
        sysfs_root: str = "/sys",
        host_netns: str | None = None,
    ) -> DriverProcess:
        """Launch it; ``fault_after`` sets DRANET_FAULT_AFTER; ``sysfs_root`` feeds NUMA cpusets and
        VF facts; ``host_netns``: the namespace that plays the node's (default: this process's)."""
        env = dict(os.environ)
        env.pop("DRANET_FAULT_AFTER", None)
        if fault_after:
            env["DRANET_FAULT_AFTER"] = fault_after
        log_path = log_path or f"{state_dir}/driver-{secrets.token_hex(3)}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.nri",
                "--socket",
                socket,
                "--state-dir",
                state_dir,
                "--sysfs-root",
                sysfs_root,
                *(["--host-netns", host_netns] if host_netns else []),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(log_path, "w"),
        )
        return cls(proc, log_path)

    def kill(self) -> None:
        """SIGKILL (idempotent) and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def wait_exit(self, timeout: float = 10.0) -> int:
        """Wait for the process to end on its own (fault injection); its exit code."""
        return self.proc.wait(timeout)

    def log(self) -> str:
        """Its stderr."""
        return Path(self.log_path).read_text()


def pod_json(uid: str, netns_path: str, name: str | None = None, namespace: str = "default") -> dict[str, Any]:
    """An NRI PodSandbox in protojson form."""
    pod: dict[str, Any] = {
        "id": f"sb-{uid}",
        "uid": uid,
        "name": name or f"pod-{uid[:6]}",
        "namespace": namespace,
        "linux": {"namespaces": []},
    }
    if netns_path:
        pod["linux"]["namespaces"].append({"type": "network", "path": netns_path})
    return pod


def prepare_claim(store: Any, pod_uid: str, devices: list[dict[str, Any]]) -> str:
    """Write a PreparedClaim for ``pod_uid`` straight into ``store`` (as NodePrepareResources would).

    Each device dict: ``ifname`` (host netdev), optional ``config`` (``{"opaque": [params, ...]}``,
    decoded and merged in order as prepare does), ``char_devices`` (list of CharDevice kwargs),
    ``rdma_device``, ``numa_node``, ``permanent_mac``, ``pci_address``, ``attributes`` (the snapshot's published ones),
    ``share_id`` (a share of the NIC: the pod gets a sub-interface).
    """
    from driver.api.v1alpha1.decode import decode_config
    from driver.api.v1alpha1.network_config import NetworkConfig
    from driver.checkpoint.state import DriverState, PreparedClaim, PreparedDevice
    from driver.model.device import CharDevice, Device, HostFacts

    def typed(config: dict[str, Any]) -> NetworkConfig:
        result = NetworkConfig()
        for i, params in enumerate(config.get("opaque", [])):
            result = result.merged(decode_config(params, f"config.opaque[{i}]"))
        return result

    uid = f"claim-{secrets.token_hex(4)}"
    prepared = []
    for i, d in enumerate(devices):
        host = HostFacts(
            ifname=d.get("ifname"),
            permanent_mac=d.get("permanent_mac"),
            rdma_device=d.get("rdma_device"),
            numa_node=d.get("numa_node"),
            char_devices=[CharDevice(**c) for c in d.get("char_devices", [])],
            pci_address=d.get("pci_address"),
        )
        name = d.get("device", f"dev{i}-{secrets.token_hex(2)}")
        prepared.append(
            PreparedDevice(
                request="nic",
                pool="node",
                device=name,
                snapshot=Device(name=name, attributes=dict(d.get("attributes", {})), host=host),
                config=typed(d.get("config", {})),
                shared=bool(d.get("share_id")),
                share_id=d.get("share_id"),
            )
        )
    claim = PreparedClaim(uid=uid, namespace="default", name=uid, pod_uids=[pod_uid], devices=prepared)

    def add(s: DriverState) -> None:
        s.claims[uid] = claim

    store.update(add)
    return uid


def restart_driver(
    h: Harness, state_dir: Path, procs: list[DriverProcess], syncs: int, fault: str | None = None, within: float = 15
) -> DriverProcess:
    """A driver process started on ``state_dir`` (dying after step ``fault`` when given), kept in
    ``procs`` for teardown; returns once the runtime side counted ``syncs`` Synchronize calls."""
    drv = DriverProcess.start(h.socket, str(state_dir), fault_after=fault)
    procs.append(drv)
    res = h.cmd("wait-sync", count=syncs, timeout=within)
    assert res["ok"], f"{res}\n{drv.log()[-2000:]}"
    return drv


def _ipj(*args: str, netns: str | None = None) -> Any:
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout or "[]")


def link_facts(ifname: str, netns: str | None = None) -> dict[str, Any] | None:
    """name/mtu/mac/up, global addresses and non-kernel routes (all tables) of a link, via ``ip -j``."""
    links = _ipj("link", "show", "dev", ifname, netns=netns)
    if not links:
        return None
    link = links[0]
    addrs = _ipj("addr", "show", "dev", ifname, netns=netns) or []
    cidrs = sorted(
        f"{a['local']}/{a['prefixlen']}"
        for entry in addrs
        for a in entry.get("addr_info", [])
        if a.get("scope") == "global"
    )
    routes = []
    for fam in ("-4", "-6"):
        for r in _ipj(fam, "route", "show", "table", "all", "dev", ifname, netns=netns) or []:
            if r.get("protocol") == "kernel" or r.get("table") == "local" or r.get("type") not in (None, "unicast"):
                continue
            routes.append((r.get("dst"), r.get("gateway"), str(r.get("table", "main")), r.get("metric")))
    return {
        "ifname": link["ifname"],
        "mtu": link["mtu"],
        "mac": link["address"],
        "up": "UP" in link.get("flags", []),
        "addresses": cidrs,
        "routes": sorted(routes, key=str),
    }


def ip(*args: str) -> None:
    """Run ``ip`` and fail loudly."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def configure_host_nic(ifname: str, peer: str, v4: str, routes: list[list[str]], mtu: int | None = None) -> None:
    """Give a host veth an address, routes (``ip route add`` argument lists) and an up state."""
    if mtu:
        ip("link", "set", ifname, "mtu", str(mtu))
    ip("link", "set", peer, "up")
    ip("link", "set", ifname, "up")
    ip("addr", "add", v4, "dev", ifname)
    for r in routes:
        ip("route", "add", *r, "dev", ifname)


@pytest.fixture(scope="session")
def nri_harness_binary() -> Path:
    """The built harness; skips when it cannot be built (no Go toolchain / proxy)."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain to build the NRI harness")
    try:
        return harness_binary()
    except Exception as exc:  # noqa: BLE001 - any build failure is a skip reason, shown
        pytest.skip(f"cannot build the NRI harness: {exc}")


@pytest.fixture
def nri_harness(nri_harness_binary: Path) -> Iterator[Harness]:
    """A running runtime-side harness; stopped and its socket dir removed at teardown."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    h = Harness.start(nri_harness_binary)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def driver_procs() -> Iterator[list[DriverProcess]]:
    """A list to register started DriverProcess objects in; all are killed at teardown."""
    procs: list[DriverProcess] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="test driver process: NRIPlugin + NRIHooks")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--host-netns", default="/proc/self/ns/net")
    parser.add_argument("--sysfs-root", default="/sys")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s %(kv)s", defaults={"kv": ""})
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    from driver.checkpoint.store import CheckpointStore
    from driver.nri.hooks import NRIHooks
    from driver.nri.plugin import Backoff, NRIPlugin

    hooks = NRIHooks(CheckpointStore(args.state_dir), host_netns=args.host_netns, sysfs_root=args.sysfs_root)
    plugin = NRIPlugin(args.socket, hooks, reconnect=Backoff(0.05, 0.5))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, plugin.stop)
        await plugin.run()

    asyncio.run(run())
    return 0


def wait_for(pred: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``pred()`` until truthy; its value, or AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
