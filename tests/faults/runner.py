"""The fault-injection engine: ``python -m tests.faults.runner --pod-netns P --host-netns H --work DIR``.

Run inside a throwaway network namespace (``ip netns exec``): that namespace is the "host" the
NICs (veth pairs made here) belong to, ``--pod-netns`` the pod's. For each scenario the engine
first counts the kill points of the hook (a dry run), then, for every point k, forks a child that
runs the hook and ``os._exit(137)``\\s right after the k-th operation: a real kill (no ``finally``,
no cleanup, half-written files stay), as cheap as a fork. A kill point is the completion of:

- a netlink request/dump on any raw socket of the driver (``NetlinkChannel.exchange``/``dump``:
  link lookups, moves, pipelined configuration, returns, ethtool); pyroute2 is used only for
  read-only slow-path lookups;
- a state-file step (``FileOps.write``, ``fsync`` of the file and of the directory, ``replace``; the
  claims journal's ``pwrite``, ``fdatasync`` and ``ftruncate``).

The parent then plays the restarted driver, in-process: a new ``CheckpointStore`` (must load
without quarantining anything: the state file is valid) and ``NRIHooks.synchronize`` with the pod
still running (the runtime lists it), and checks where every NIC is: all in the pod fully
configured (the hook had finished) or all back on the host exactly as before; then
``StopPodSandbox`` must bring every NIC back exactly as before (name, MTU, MAC, addresses,
routes, ethtool features). A NIC anywhere else is *stranded*. Links the driver does not own (an
uplink with the default route on the host, the pod's own ``eth0``) must be exactly as they were
after every fault (else *foreign links touched*).

A share of a shared NIC (a sub-interface made in the pod, addressed by the claim or from the NIC's
pool) is killed the same way: after the restart and the StopPodSandbox no link of ours is left in
the pod, no pod state (nor lease) is left, and the NIC, which never moves, is exactly as before.

Two scenarios make the kernel refuse a move half-way, as a name or MTU appearing between the
hook's checks and the move would (the checks are bypassed in the child): a rename to a name the
pod has (refused after the namespace change) and an MTU above the NIC's maximum (refused in the
second step). Killed anywhere in them, every NIC must end on the host. For prepare, every claim the
kubelet was answered "prepared" before the kill must still be in the checkpoint (else *lost*),
and the kubelet's retry must then prepare every claim. The summary is one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.files import FileOps
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.claims.recovery import rebuild_prepared_claims
from driver.dra.protocol import ClaimRef
from driver.netlink.rtnl import Rtnl
from driver.nri import pod_attach
from driver.nri.claim_reports import HookError
from driver.nri.hooks import NRIHooks
from harness.fake_apiserver import make_claim, result
from harness.nri import prepare_claim
from tests.claims.conftest import inventory
from tests.nic_settings.test_ethtool import ioctl_features
from tests.nri.test_crash import POD_CONFIG

KILLED = 137
FULL_CONFIG = {
    "opaque": [
        {
            **POD_CONFIG["opaque"][0],
            "routes": [{"destination": "10.200.0.0/16", "gateway": "192.168.50.1"}],
            # dranet's later config fields: their host values (sysctl, GSO size, neighbors) must come back too
            "rules": [{"priority": 400, "destination": "10.201.0.0/16", "table": 400}],
            "neighbors": [{"destination": "192.168.50.1", "hardwareAddr": "02:00:00:00:50:01"}],
        },
        {"interface": {"arpIgnore": 1, "forwarding": False, "gsoMaxSize": 131072}},
    ]
}
"""test_crash's pod config (rename, MTU, MAC, address, ethtool), a route through the pod's NIC, a rule,
a neighbor, per-interface sysctls and a GSO size."""


@dataclass
class Tally:
    """Counts over all scenarios (the numbers the issue asks to report)."""

    faults: int = 0
    stranded: int = 0
    lost_claims: int = 0
    invalid_state: int = 0
    foreign_touched: int = 0
    by_scenario: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # families this kernel cannot run, and why
    # Per kind of journal damage: the records it left intact and how many of them a restart read, the
    # records with only their magic or length damaged and how many were read all the same, and the
    # claims of records it left torn at the file's end (dropped as a crash's tear would be).
    journal_records: dict[str, dict[str, int]] = field(default_factory=dict)

    def problem(self, what: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(what)


# -- the kill switch (child only) ----------------------------------------------------------------


def _channel_class() -> type:
    """The raw netlink socket class under Rtnl, wherever the netlink package defines it."""
    return next(c for c in Rtnl.__mro__ if c.__name__ == "NetlinkChannel")


def arm(kill_at: int | None, counter: list[int]) -> FileOps:
    """Patch (in this child process) every kill point to count, and die after the ``kill_at``-th.
    Returns the file operations for the child's CheckpointStore."""

    def tick() -> None:
        counter[0] += 1
        if kill_at is not None and counter[0] == kill_at:
            os._exit(KILLED)

    def counted(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            tick()
            return out

        return wrapper

    channel = _channel_class()
    channel.exchange = counted(channel.exchange)  # type: ignore[attr-defined]
    channel.dump = counted(channel.dump)  # type: ignore[attr-defined]
    return FileOps(
        write=counted(os.write),
        fsync=counted(os.fsync),
        replace=counted(os.replace),
        pwrite=counted(os.pwrite),
        fdatasync=counted(os.fdatasync),
        ftruncate=counted(os.ftruncate),
    )


def in_child(work: Callable[[FileOps], None], kill_at: int | None) -> tuple[int, int]:
    """Run ``work`` in a forked child armed to die at ``kill_at``; (exit code, points it passed)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        os.close(read_fd)
        counter = [0]
        code = 0
        try:
            work(arm(kill_at, counter))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as exit code 1
            os.write(2, f"child failed: {type(exc).__name__}: {exc}\n".encode())
            code = 1
        os.write(write_fd, str(counter[0]).encode())
        os._exit(code)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        passed = int(pipe.read() or -1)
    return os.waitstatus_to_exitcode(status), passed


# -- NICs and their observable state -------------------------------------------------------------


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _ipj(*args: str, netns: str | None = None) -> Any:
    cmd = ["ip", "-j"] + (["-n", netns] if netns else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return json.loads(out.stdout or "[]") if out.returncode == 0 else None


DUMP = ("addr show", "route show table all", "route show table all root ::/0", "neigh show nud permanent")
"""What one :func:`dump` asks ``ip`` (with ``-d``: each link's details beside its addresses; the
``::/0`` root selects the IPv6 routes, as ``-6`` would outside a batch)."""


@dataclass(frozen=True)
class Dump:
    """A namespace's links (by name, details and addresses), routes of every table, permanent neighbours."""

    links: dict[str, dict[str, Any]]
    routes: list[dict[str, Any]]
    neighbors: list[dict[str, Any]]


def dump(netns: str | None = None) -> Dump:
    """One ``ip -batch`` of :data:`DUMP` (one process: under emulation each ``ip`` costs tens of ms)."""
    cmd = ["ip", "-j", "-d"] + (["-n", netns] if netns else []) + ["-batch", "-"]
    out = subprocess.run(cmd, input="\n".join(DUMP) + "\n", capture_output=True, text=True, check=False)
    decoder, text, at, parts = json.JSONDecoder(), out.stdout, 0, []
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        part, at = decoder.raw_decode(text, at)
        parts.append(part)
    if out.returncode != 0 or len(parts) != len(DUMP):
        where = netns or "the host"
        raise RuntimeError(f"ip -batch in {where}: exit {out.returncode}, {len(parts)} answers: {out.stderr}")
    links, routes4, routes6, neighbors = parts
    return Dump({link["ifname"]: link for link in links}, routes4 + routes6, neighbors)


def snapshot(names: list[str], netns: str | None = None, found: Dump | None = None) -> dict[str, dict[str, Any] | None]:
    """Everything a return must restore, per link name (None: not in that namespace), read with
    ``ip`` (one batch for all links, or ``found``) and SIOCETHTOOL: an oracle independent of the
    code under test."""
    found = found or dump(netns)
    out: dict[str, dict[str, Any] | None] = {}
    for name in names:
        link = found.links.get(name)
        if link is None:
            out[name] = None
            continue
        features = ioctl_features(name, netns)
        out[name] = {
            "mtu": link["mtu"],
            "mac": link["address"],
            "up": "UP" in link.get("flags", []),
            "addresses": sorted(
                f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("scope") == "global"
            ),
            "routes": sorted(
                str((r.get("dst"), r.get("gateway"), r.get("table", "main")))
                for r in found.routes
                if r.get("dev") == name and r.get("protocol") != "kernel" and r.get("table") != "local"
            ),
            "features": {k: v for k, v in features.items() if k in ("tx-checksum-ip-generic", "rx-gro")},
            "gso_max_size": link.get("gso_max_size"),
            "neighbors": sorted(f"{n['dst']} {n.get('lladdr')}" for n in found.neighbors if n.get("dev") == name),
            "sysctls": _sysctls(name) if netns is None else None,
        }
    return out


def _sysctls(name: str) -> dict[str, str]:
    """The per-interface sysctls the full config sets, read in this (the "host") namespace."""
    out = {}
    for key in ("ipv4/conf/{}/arp_ignore", "ipv4/conf/{}/forwarding"):
        try:
            with open(f"/proc/sys/net/{key.format(name)}") as f:
                out[key] = f.read().strip()
        except OSError:
            out[key] = "-"
    return out


def facts(ifname: str, netns: str | None = None) -> dict[str, Any] | None:
    """:func:`snapshot` of one link."""
    return snapshot([ifname], netns)[ifname]


@dataclass
class Nic:
    """A host veth used as a NIC (its peer stays on the host so the link has a carrier)."""

    name: str
    peer: str
    before: dict[str, Any] = field(default_factory=dict)


def make_nics(count: int) -> list[Nic]:
    nics = []
    for i in range(count):
        nic = Nic(f"fn{secrets.token_hex(3)}", f"fp{secrets.token_hex(3)}")
        ip("link", "add", nic.name, "type", "veth", "peer", "name", nic.peer)
        ip("link", "set", nic.name, "mtu", str(1400 + i))
        ip("link", "set", nic.peer, "up")
        ip("link", "set", nic.name, "up")
        ip("addr", "add", f"10.9{i}.0.1/24", "dev", nic.name)
        ip("route", "add", f"10.{100 + i}.0.0/16", "via", f"10.9{i}.0.254", "dev", nic.name)
        ip("route", "add", f"10.{110 + i}.0.0/16", "via", f"10.9{i}.0.254", "dev", nic.name, "table", str(500 + i))
        ip("neigh", "add", f"10.9{i}.0.9", "lladdr", "02:00:00:00:09:09", "dev", nic.name, "nud", "permanent")
        # The sysctls stay at the namespace defaults: a namespace move resets them to those for every
        # NIC, and only a claim that sets them pays for recording and setting back other values.
        nic.before = facts(nic.name) or {}
        nics.append(nic)
    return nics


def where(nics: list[Nic], pod_netns: str, configured: dict[str, str]) -> str:
    """ "host": every NIC back, exactly as before; "pod": every NIC in the pod, fully configured
    (the hook had finished); anything else (some here, some there, half configured): "stranded"."""
    host = snapshot([n.name for n in nics])
    if all(host[n.name] == n.before for n in nics):
        return "host"
    pod = snapshot([configured.get(n.name, n.name) for n in nics], pod_netns)
    for nic in nics:
        inside = pod[configured.get(nic.name, nic.name)]
        want = POD_FACTS if nic.name in configured else {k: nic.before[k] for k in ("mtu", "mac", "addresses")}
        if inside is None or not inside["up"] or any(inside[k] != v for k, v in want.items()):
            return "stranded"
    return "pod"


POD_FACTS = {"mtu": 1300, "mac": "02:aa:bb:cc:dd:01", "addresses": ["192.168.50.2/24"]}
"""The first NIC in the pod under FULL_CONFIG (and VRF_CONFIG)."""
VRF_CONFIG = {
    "opaque": [
        {
            "interface": {**POD_CONFIG["opaque"][0]["interface"], "vrf": {"name": "vrf-f", "table": 10}},
            "routes": [{"destination": "10.200.0.0/16", "gateway": "192.168.50.1"}],
        }
    ]
}
"""test_crash's interface in a VRF on table 10, with a route there: a kernel with VRF only."""


# -- scenarios -----------------------------------------------------------------------------------


def pod_sandbox(uid: str, netns: str) -> api.PodSandbox:
    pod = api.PodSandbox(id=f"sb-{uid}", uid=uid, name=f"pod-{uid[:6]}", namespace="default")
    pod.linux.namespaces.add(type="network", path=f"/run/netns/{netns}")
    return pod


@contextmanager
def fresh_state(root: Path) -> Iterator[Path]:
    state = root / secrets.token_hex(4)
    state.mkdir()
    yield state


REFUSED = {
    "rename-refused": {"opaque": [{"interface": {"name": "eth0", "addresses": ["192.168.51.2/24"]}}]},
    "mtu-refused": {"opaque": [{"interface": {"name": "net1", "mtu": 65536}}]},
}
"""Configs the kernel refuses half-way through a move (the pod has an ``eth0``; a veth's maximum MTU
is 65535), once the hook's own checks are out of the way."""


def foreign(pod_netns: str) -> dict[str, Any]:
    """The links the driver does not own, as they are: the host's uplink and routes, the pod's eth0."""
    host = dump()
    return {
        "up0": snapshot(["up0"], None, host)["up0"],
        "default": [r for r in host.routes if r.get("dst") == "default"],
        "pod eth0": facts("eth0", pod_netns),
    }


def subnet_pools(devices: list[dict[str, Any]]) -> dict[str, None]:
    """Each shared NIC's address pool: its own subnet (the throwaway host is alone on it)."""
    return {d["ifname"]: None for d in devices if d.get("share_id")}


def pod_with_claim(state: Path, devices: list[dict[str, Any]], pod_netns: str, hook: str) -> tuple[str, api.PodSandbox]:
    """A prepared claim with ``devices`` for a new pod in ``pod_netns`` (its UID, the pod); before a
    StopPodSandbox the pod has its NICs already."""
    uid = f"uid-{secrets.token_hex(4)}"
    claim = prepare_claim(CheckpointStore(state), uid, devices)
    pod = pod_sandbox(uid, pod_netns)
    if hook == "stop":
        hooks = NRIHooks(CheckpointStore(state), pools=subnet_pools(devices))
        hooks.run_pod_sandbox(pod)  # the NICs are in the pod before the fault
        hooks.close()
    return claim, pod


def restarted(tally: Tally, label: str, state: Path, claim: str) -> NRIHooks:
    """The restarted driver's hooks after a fault (counted): the state must load without
    quarantining anything, with the prepared claim still there."""
    tally.faults += 1
    name = label.rsplit(" k=", 1)[0]
    tally.by_scenario[name] = tally.by_scenario.get(name, 0) + 1
    store = CheckpointStore(state)
    if store.quarantined or list(state.glob("*.tmp")):
        tally.invalid_state += 1
        tally.problem(f"{label}: state file invalid at restart: {store.quarantined}")
    if store.read(lambda s: list(s.claims)) != [claim]:
        tally.lost_claims += 1
        tally.problem(f"{label}: prepared claim lost")
    return NRIHooks(store)


def nri_scenario(
    tally: Tally,
    name: str,
    hook: str,
    nics: list[Nic],
    full: bool | str,
    netns: tuple[str, str],
    root: Path,
    full_config: dict[str, Any] = FULL_CONFIG,
) -> None:
    """Every kill point of RunPodSandbox (``hook="run"``) or StopPodSandbox (``"stop"``);
    ``netns``: (the pod's, the host's) names; ``full``: NIC 0 gets ``full_config``, or a key of
    :data:`REFUSED` (a RunPodSandbox that fails half-way and rolls back). After the stop, no link
    of the driver's (a VRF) is left in the pod."""
    pod_netns, host_netns = netns
    config = REFUSED[full] if isinstance(full, str) else full_config
    pods_own = _pod_links(pod_netns)
    devices = [{"ifname": n.name, **({"config": config} if full and i == 0 else {})} for i, n in enumerate(nics)]
    configured = {nics[0].name: "net1"} if full is True else {}
    refused = isinstance(full, str)
    outside = foreign(pod_netns)

    def setup(state: Path) -> tuple[str, api.PodSandbox]:
        return pod_with_claim(state, devices, pod_netns, hook)

    def child_work(state: Path, pod: api.PodSandbox) -> Callable[[FileOps], None]:
        def work(ops: FileOps) -> None:
            if refused:  # the kernel, not the hook's checks, refuses: a name or MTU that changed since
                pod_attach.check_names_and_mtus = lambda *args, **kwargs: None  # type: ignore[assignment]
            hooks = NRIHooks(CheckpointStore(state, ops=ops))
            try:
                (hooks.run_pod_sandbox if hook == "run" else hooks.stop_pod_sandbox)(pod)
            except HookError:
                if not refused:
                    raise

        return work

    with fresh_state(root) as state:
        _, pod = setup(state)
        code, points = in_child(child_work(state, pod), None)
        if code != 0:
            raise RuntimeError(f"{name}: the hook fails without a fault")
        if refused and snapshot([n.name for n in nics]) != {n.name: n.before for n in nics}:
            raise RuntimeError(f"{name}: the refused move did not roll back without a fault")
        NRIHooks(CheckpointStore(state)).stop_pod_sandbox(pod)  # back to the start
    for k in range(1, points + 1):
        with fresh_state(root) as state:
            claim, pod = setup(state)
            code, _ = in_child(child_work(state, pod), k)
            hooks = restarted(tally, f"{name} k={k}", state, claim)
            store = hooks.store
            hooks.synchronize([pod], [])  # the runtime still runs the pod
            # "pod" is right for both hooks: a RunPodSandbox killed after its commit, a
            # StopPodSandbox killed before its plan was durable (the runtime retries the stop).
            place = where(nics, pod_netns, configured)
            if place == "stranded" or (refused and place != "host"):
                tally.stranded += len(nics)
                tally.problem(f"{name} k={k} (exit {code}): NICs {place} after restart")
            hooks.stop_pod_sandbox(pod)
            hooks.close()
            after = snapshot([n.name for n in nics])
            for nic in nics:
                now = after[nic.name]
                if now != nic.before:
                    tally.stranded += 1
                    tally.problem(f"{name} k={k}: {nic.name} not restored after stop: {now} != {nic.before}")
                    restore(nic, pod_netns, host_netns, configured)
            if store.read(lambda s, uid=pod.uid: uid in s.pods):
                tally.invalid_state += 1
                tally.problem(f"{name} k={k}: pod state left after stop")
            links_left(tally, f"{name} k={k}", pod_netns, pods_own)
            if foreign(pod_netns) != outside:
                tally.foreign_touched += 1
                tally.problem(f"{name} k={k}: a link the driver does not own changed: {foreign(pod_netns)}")


def links_left(tally: Tally, label: str, pod_netns: str, pods_own: list[str]) -> None:
    """Links of the driver's left in the pod after the stop (counted as stranded, then removed)."""
    left = [link for link in _pod_links(pod_netns) if link not in pods_own]
    if left:
        tally.stranded += 1
        tally.problem(f"{label}: links left in the pod after stop: {left}")
        for link in left:
            subprocess.run(["ip", "-n", pod_netns, "link", "del", link], capture_output=True)


def _pod_links(pod_netns: str) -> list[str]:
    """The names of the links in the pod's namespace the driver may have made (not lo, not eth0)."""
    return sorted(
        link["ifname"] for link in _ipj("link", "show", netns=pod_netns) or [] if link["ifname"] not in ("lo", "eth0")
    )


def share_scenario(
    tally: Tally, name: str, hook: str, nic: Nic, pooled: bool, pod_netns: str, root: Path, kind: str = "macvlan"
) -> None:
    """Every kill point of RunPodSandbox or StopPodSandbox of a pod holding a share of ``nic`` (a
    ``kind`` sub-interface made in the pod; ``pooled``: its address a lease of the NIC's subnet,
    else the claim's). After the restart's Synchronize and the StopPodSandbox: no link of ours left
    in the pod, no pod state (so no lease), the NIC exactly as before (it never moves)."""
    iface: dict[str, Any] = {"name": "net1", "mtu": 1300, **({"type": kind} if kind != "macvlan" else {})}
    if not pooled:
        iface["addresses"] = ["10.190.0.5/24"]
    config = {"opaque": [{"interface": iface, "routes": [{"destination": "10.191.0.0/16", "gateway": "10.190.0.1"}]}]}
    if pooled:
        config = {"opaque": [{"interface": iface}]}
    devices = [{"ifname": nic.name, "device": "shared", "share_id": "share-0", "config": config}]
    outside, pods_own = foreign(pod_netns), _pod_links(pod_netns)

    def setup(state: Path) -> tuple[str, api.PodSandbox]:
        return pod_with_claim(state, devices, pod_netns, hook)

    def child_work(state: Path, pod: api.PodSandbox) -> Callable[[FileOps], None]:
        def work(ops: FileOps) -> None:
            hooks = NRIHooks(CheckpointStore(state, ops=ops), pools=subnet_pools(devices))
            (hooks.run_pod_sandbox if hook == "run" else hooks.stop_pod_sandbox)(pod)

        return work

    with fresh_state(root) as state:
        _, pod = setup(state)
        code, points = in_child(child_work(state, pod), None)
        if code != 0:
            raise RuntimeError(f"{name}: the hook fails without a fault")
        NRIHooks(CheckpointStore(state), pools=subnet_pools(devices)).stop_pod_sandbox(pod)
    for k in range(1, points + 1):
        with fresh_state(root) as state:
            claim, pod = setup(state)
            code, _ = in_child(child_work(state, pod), k)
            hooks = restarted(tally, f"{name} k={k}", state, claim)
            store = hooks.store
            hooks.synchronize([pod], [])
            hooks.stop_pod_sandbox(pod)
            hooks.close()
            links_left(tally, f"{name} k={k} (exit {code})", pod_netns, pods_own)
            if facts(nic.name) != nic.before:
                tally.stranded += 1
                tally.problem(f"{name} k={k}: the shared NIC changed: {facts(nic.name)} != {nic.before}")
            if store.read(lambda s: dict(s.pods)):
                tally.invalid_state += 1
                tally.problem(f"{name} k={k}: pod state (or a lease) left after stop")
            if foreign(pod_netns) != outside:
                tally.foreign_touched += 1
                tally.problem(f"{name} k={k}: a link the driver does not own changed: {foreign(pod_netns)}")


def restore(nic: Nic, pod_netns: str, host_netns: str, configured: dict[str, str]) -> None:
    """Put a stranded NIC back by hand so the next fault starts clean (the failure is counted)."""
    pod_name = configured.get(nic.name, nic.name)
    if facts(pod_name, pod_netns) is not None:
        subprocess.run(["ip", "-n", pod_netns, "link", "set", pod_name, "netns", host_netns], capture_output=True)
    subprocess.run(["ip", "link", "set", pod_name, "name", nic.name], capture_output=True)


class StubKube:
    """The kubelet's claims as the API server would return them (prepare needs only GET; the
    rebuild after a damaged checkpoint lists them, and this node's slices)."""

    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self.claims = claims

    def read_namespaced_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.claims[name]))

    def list_resource_claim_for_all_namespaces(self, limit: int, cont: str | None = None) -> dict[str, Any]:
        return {"items": json.loads(json.dumps(list(self.claims.values()))), "metadata": {}}

    def list_resource_slice(self, field_selector: str) -> dict[str, Any]:
        return {"items": []}


CORRUPTED_FIELDS = {"magic": 0, "length": 5, "crc": 9, "epoch": 13, "sequence": 21, "base": 28, "payload": 60}
"""A byte of each part of a journal record (header: magic, length, crc, epoch, sequence, base)."""

INSERTED = bytes(range(0xA0, 0xA0 + 37))
"""Bytes inserted into the journal (no record's magic in them); as many are cut out."""

JOURNAL_DAMAGE = ("flipped", "bytes inserted", "bytes cut out", "truncated")
"""What is done to the journal at a byte: that byte flipped, :data:`INSERTED` put before it, as many
bytes cut out from it on, the file cut there."""


def damaged_journal(journal: bytes, at: int, kind: str) -> bytes:
    """``journal`` with one of :data:`JOURNAL_DAMAGE` at byte ``at``."""
    if kind == "flipped":
        return journal[:at] + bytes([journal[at] ^ 0x40]) + journal[at + 1 :]
    if kind == "bytes inserted":
        return journal[:at] + INSERTED + journal[at:]
    if kind == "bytes cut out":
        return journal[:at] + journal[at + len(INSERTED) :]
    return journal[:at]


def intact_records(extents: list[range], at: int, kind: str) -> set[int]:
    """The records whose own bytes (header, payload) ``kind`` at byte ``at`` leaves untouched."""
    end = {"flipped": at + 1, "bytes inserted": at, "bytes cut out": at + len(INSERTED)}.get(kind, sys.maxsize)
    return {i for i, extent in enumerate(extents) if extent.stop <= at or extent.start >= end}


def corruption_scenario(tally: Tally, root: Path) -> None:
    """The claims journal's acknowledged records damaged, in every part of every record, each of
    :data:`JOURNAL_DAMAGE`: at the restart every record the damage left intact is read (counted in
    :attr:`Tally.journal_records`), and after the rebuild from the API server the store asks for (the
    daemon's way) every claim the kubelet was told was prepared is there, but those of records the
    damage left torn at the file's end (bytes cut out of or into them, the file cut, no intact record
    after them): a crash leaves such a tear of a record it never acknowledged, and no reader can tell
    them apart (counted, as ``torn``)."""
    node = "node-f"
    pods = ["p"]
    claims = {
        f"c{i}": make_claim("ns", f"c{i}", f"uid-{i}", [result(f"pci-0000-8a-00-{i}", node)], pods=pods)
        for i in range(4)
    }
    refs = [ClaimRef("ns", name, claim["metadata"]["uid"]) for name, claim in claims.items()]

    def preparer(state: Path) -> Preparer:
        store = CheckpointStore(state, journal=True)
        return Preparer(StubKube(claims), store, ClaimBuilder(lambda: inventory(4), "dra.net", node))

    with fresh_state(root) as template:
        first = preparer(template)
        for ref in refs:  # one record each, every one acknowledged
            if asyncio.run(first.prepare([ref]))[ref.uid].error:
                raise RuntimeError(f"prepare {ref.name} fails without a fault")
        journal = (template / CheckpointStore.JOURNAL_FILENAME).read_bytes()
    extents: list[range] = []
    while (at := extents[-1].stop if extents else 0) < len(journal):
        extents.append(range(at, at + 40 + int.from_bytes(journal[at + 4 : at + 8], "little")))
    if len(extents) != len(refs):
        raise RuntimeError(f"{len(extents)} journal records for {len(refs)} prepares")
    cases = itertools.product(enumerate(extents), JOURNAL_DAMAGE, CORRUPTED_FIELDS.items())
    for (position, extent), kind, (part, delta) in cases:
        name = f"journal record {position} {kind} ({part})"
        tally.faults += 1
        tally.by_scenario[name] = tally.by_scenario.get(name, 0) + 1
        whole = intact_records(extents, extent.start + delta, kind)
        intact = {refs[i].uid for i in whole}
        # Its magic or length alone flipped, a record is still read (its checksum covers neither).
        mendable = {refs[position].uid} if kind == "flipped" and delta < 8 else set()
        # A flip leaves every record whole: a damaged one is always told from a tear.
        torn = set() if kind == "flipped" else {ref.uid for i, ref in enumerate(refs) if i > max(whole, default=-1)}
        count = tally.journal_records.setdefault(
            kind, dict.fromkeys(("intact", "kept", "mendable", "mended", "torn"), 0)
        )
        with fresh_state(root) as state:
            shutil.copytree(template, state, dirs_exist_ok=True)
            damaged = damaged_journal(journal, extent.start + delta, kind)
            (state / CheckpointStore.JOURNAL_FILENAME).write_bytes(damaged)
            restarted = preparer(state)
            read = set(restarted.store.read(lambda s: list(s.claims)))
            count["intact"] += len(intact)
            count["kept"] += len(intact & read)
            count["mendable"] += len(mendable)
            count["mended"] += len(mendable & read)
            if (intact | mendable) - read:
                tally.problem(f"{name}: records of {sorted((intact | mendable) - read)} not read at the restart")
            if restarted.store.claims_quarantined:
                asyncio.run(rebuild_prepared_claims(restarted, restarted.kube))  # type: ignore[arg-type]
            lost = {ref.uid for ref in refs} - set(restarted.store.read(lambda s: list(s.claims)))
            count["torn"] += len(lost & torn)
            tally.lost_claims += len(lost - torn)
            if lost - torn:
                tally.problem(f"{name}: {sorted(lost - torn)} answered prepared, missing after restart and rebuild")


def prepare_scenario(tally: Tally, root: Path, journal: bool) -> None:
    """Every kill point of a kubelet sequence: prepare c0, prepare c1+c2, unprepare c0, prepare c3;
    ``journal``: the claims are journaled (the lease holder's way), and the journal is folded into
    the claims file after the second prepare (a compaction, killed at each of its steps too)."""
    node = "node-f"
    claims = {f"c{i}": make_claim("ns", f"c{i}", f"uid-{i}", [result(f"pci-0000-8a-00-{i}", node)]) for i in range(4)}
    steps: list[tuple[str, list[str]]] = [("prepare", ["c0"]), ("prepare", ["c1", "c2"]), ("unprepare", ["c0"])]
    steps.append(("prepare", ["c3"]))
    refs = {n: ClaimRef("ns", n, f"uid-{n[1:]}") for n in claims}

    def kubelet(state: Path, ops: FileOps, acked: int | None) -> None:
        store = CheckpointStore(state, ops=ops, journal=journal)
        preparer = Preparer(StubKube(claims), store, ClaimBuilder(lambda: inventory(4), "dra.net", node))
        for i, (verb, names) in enumerate(steps):
            if journal and i == 2:
                store.compact()
            call = preparer.prepare if verb == "prepare" else preparer.unprepare
            out = asyncio.run(call([refs[n] for n in names]))
            errors = [r.error if verb == "prepare" else r for r in out.values()]
            if any(errors):
                raise RuntimeError(f"{verb} {names}: {errors}")
            if acked is not None:
                os.write(acked, f"{verb} {' '.join(names)}\n".encode())  # the kubelet got the answer

    name = "prepare/unprepare" + (" (journal)" if journal else "")
    with fresh_state(root) as state:
        code, points = in_child(lambda ops: kubelet(state, ops, None), None)
        if code != 0:
            raise RuntimeError("the prepare sequence fails without a fault")
    for k in range(1, points + 1):
        with fresh_state(root) as state:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            code, _ = in_child(lambda ops, fd=write_fd: kubelet(state, ops, fd), k)
            os.close(write_fd)
            try:
                told = os.read(read_fd, 65536).decode().splitlines()
            except BlockingIOError:
                told = []
            os.close(read_fd)
            tally.faults += 1
            tally.by_scenario[name] = tally.by_scenario.get(name, 0) + 1
            store = CheckpointStore(state, journal=journal)
            if store.quarantined or list(state.glob("*.tmp")):
                tally.invalid_state += 1
                tally.problem(f"{name} k={k}: state file invalid at restart")
            held: set[str] = set()
            for line in told:
                verb, *names = line.split()
                held = held | set(names) if verb == "prepare" else held - set(names)
            if len(told) < len(steps) and steps[len(told)][0] == "unprepare":
                held -= set(steps[len(told)][1])  # an unprepare in flight may have been applied
            stored = set(store.read(lambda s: list(s.claims)))
            lost = {refs[n].uid for n in held} - stored
            tally.lost_claims += len(lost)
            if lost:
                tally.problem(f"{name} k={k}: {sorted(lost)} answered prepared, missing after restart")
            # The kubelet retries the call it got no answer to, and goes on.
            preparer = Preparer(StubKube(claims), store, ClaimBuilder(lambda: inventory(4), "dra.net", node))
            for verb, names in steps[len(told) :]:
                call = preparer.prepare if verb == "prepare" else preparer.unprepare
                out = asyncio.run(call([refs[n] for n in names]))
                if any((r.error if verb == "prepare" else r) for r in out.values()):
                    tally.lost_claims += len(names)
                    tally.problem(f"{name} k={k}: retry of {verb} {names} failed: {out}")
            final = set(CheckpointStore(state).read(lambda s: list(s.claims)))
            if final != {"uid-1", "uid-2", "uid-3"}:
                tally.lost_claims += len({"uid-1", "uid-2", "uid-3"} - final)
                tally.problem(f"{name} k={k}: after the retries the checkpoint holds {sorted(final)}")


def links_we_do_not_own(pod_netns: str) -> None:
    """The host's uplink (holding the default route) and the pod's CNI eth0, peers in the pod."""
    ip("link", "add", "up0", "type", "veth", "peer", "name", "up0p")
    ip("link", "set", "up0", "up")
    ip("link", "set", "up0p", "up")
    ip("addr", "add", "10.254.0.2/24", "dev", "up0")
    ip("route", "add", "default", "via", "10.254.0.1", "dev", "up0")
    ip("-n", pod_netns, "link", "add", "eth0", "type", "veth", "peer", "name", "cni0")
    ip("-n", pod_netns, "link", "set", "eth0", "up")


FAMILIES = ("refused", "nri", "share", "prepare", "corruption", "macvlan", "ipvlan", "vrf")
"""The scenario families; ``macvlan``, ``ipvlan`` and ``vrf`` (the paths that differ by kernel, one
variant each: a macvlan share addressed by its claim, an ipvlan share leased from the pool, a NIC
in a VRF) need those link kinds in the kernel."""
DEFAULT_FAMILIES = ("refused", "nri", "share", "prepare", "corruption")


def kernel_has(kind: str) -> bool:
    """Whether this kernel makes ``kind`` links (asked in this namespace, nothing created)."""
    from driver.netlink.channel import netlink_socket
    from driver.netlink.kernel_features import link_kind_supported

    rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE))
    try:
        return link_kind_supported(rtnl, kind)[0]
    finally:
        rtnl.close()


def kernel_families(tally: Tally, families: set[str], args: argparse.Namespace) -> None:
    """The scenarios on paths that differ by kernel: shares as ipvlan, a NIC in a VRF (each only where
    the kernel has the kind; the summary lists what it skipped)."""
    for kind, pooled in (("macvlan", False), ("ipvlan", True)):
        if kind not in families:
            continue
        if not kernel_has(kind):
            tally.skipped.append(f"{kind}: kernel {os.uname().release} has no {kind} links")
            continue
        [nic] = make_nics(1)
        for hook in ("run", "stop"):
            what = "RunPodSandbox" if hook == "run" else "StopPodSandbox"
            label = f"{what} a {kind} share {'pool lease' if pooled else 'claim address'}"
            share_scenario(tally, label, hook, nic, pooled, args.pod_netns, args.work, kind)
        subprocess.run(["ip", "link", "del", nic.name], capture_output=True)
    if "vrf" in families:
        if not kernel_has("vrf"):
            tally.skipped.append(f"vrf: kernel {os.uname().release} has no VRF links")
            return
        nics = make_nics(1)
        for hook in ("run", "stop"):
            what = "RunPodSandbox" if hook == "run" else "StopPodSandbox"
            netns = (args.pod_netns, args.host_netns)
            nri_scenario(tally, f"{what} 1 NIC in a VRF", hook, nics, True, netns, args.work, VRF_CONFIG)
        subprocess.run(["ip", "link", "del", nics[0].name], capture_output=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pod-netns", required=True)
    parser.add_argument("--host-netns", required=True, help="the netns this runs in (ip netns exec)")
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument(
        "--only", default=",".join(DEFAULT_FAMILIES), help=f"comma-separated scenario families of {FAMILIES}"
    )
    args = parser.parse_args(argv)
    families = set(args.only.split(","))
    started = time.monotonic()
    tally = Tally()
    links_we_do_not_own(args.pod_netns)
    for count in (1, 2) if "refused" in families else ():
        for refused in REFUSED:
            nics = make_nics(count)
            label = f"RunPodSandbox {count} NIC(s) {refused}"
            nri_scenario(tally, label, "run", nics, refused, (args.pod_netns, args.host_netns), args.work)
            for nic in nics:
                subprocess.run(["ip", "link", "del", nic.name], capture_output=True)
    for count in (1, 2, 3) if "nri" in families else ():
        for full in (True, False):
            nics = make_nics(count)
            for hook in ("run", "stop"):
                what = "RunPodSandbox" if hook == "run" else "StopPodSandbox"
                label = f"{what} {count} NIC(s) {'configured' if full else 'plain'}"
                nri_scenario(tally, label, hook, nics, full, (args.pod_netns, args.host_netns), args.work)
            for nic in nics:
                subprocess.run(["ip", "link", "del", nic.name], capture_output=True)
    for pooled in (False, True) if "share" in families else ():
        [nic] = make_nics(1)
        for hook in ("run", "stop"):
            what = "RunPodSandbox" if hook == "run" else "StopPodSandbox"
            label = f"{what} a share (sub-interface) {'pool lease' if pooled else 'claim address'}"
            share_scenario(tally, label, hook, nic, pooled, args.pod_netns, args.work)
        subprocess.run(["ip", "link", "del", nic.name], capture_output=True)
    for journal in (False, True) if "prepare" in families else ():
        prepare_scenario(tally, args.work, journal)
    if "corruption" in families:
        corruption_scenario(tally, args.work)
    kernel_families(tally, families, args)
    summary = {**tally.__dict__, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
