"""A throwaway node for the NRI hooks: a "host" network namespace with one veth NIC (its peer in a
fabric namespace), a pod namespace, a checkpoint and the hooks, plus readers of what the kernel
has (``ip -j``, sysctls, offload sizes). The host being a namespace of its own, nothing the tests
add to it touches the machine's links, rules or routes."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.store import CheckpointStore
from driver.netlink.channel import netlink_socket, open_netns
from driver.netlink.rtnl import Rtnl
from driver.nic_settings import offload_sizes
from driver.nic_settings.registry import SETTINGS
from driver.nic_settings.setting import NicSetting
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import pod_json, prepare_claim


def ipj(netns: str, *args: str) -> Any:
    out = subprocess.run(["ip", "-j", "-n", netns, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def sh(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, text=True)


def rules(netns: str, family: str = "-4") -> list[tuple[Any, ...]]:
    """(priority, src, dst, iif, oif, table) of the rules beyond the three defaults."""
    out = []
    for r in ipj(netns, family, "rule", "show"):
        if r.get("priority") in (0, 32766, 32767) and r.get("src") == "all":
            continue
        src, dst = (
            None if r.get(k) in (None, "all") else f"{r[k]}/{r[k + 'len']}" if k + "len" in r else r[k]
            for k in ("src", "dst")
        )
        out.append((r.get("priority"), src, dst, r.get("iif"), r.get("oif"), str(r.get("table"))))
    return sorted(out, key=str)


def neighbors(netns: str, dev: str) -> list[tuple[str, str, list[str]]]:
    return sorted((n["dst"], n.get("lladdr", ""), n.get("state", [])) for n in ipj(netns, "neigh", "show", "dev", dev))


def sysctl(netns: str, path: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", netns, "cat", f"/proc/sys/net/{path}"], capture_output=True, text=True)
    return int(out.stdout)


def sizes(netns: str, ifname: str) -> dict[str, int]:
    """The GSO/GRO sizes of ``ifname`` in ``netns`` (claim field names)."""
    fd = open_netns(netns)
    rtnl = Rtnl(netlink_socket(socket.NETLINK_ROUTE, fd))
    try:
        link = rtnl.link(ifname)
        assert link is not None
        return offload_sizes.read(rtnl, link.index)[0]
    finally:
        rtnl.close()
        os.close(fd)


class Node:
    """A host namespace with one veth NIC (peer in a fabric namespace), a store and the hooks."""

    def __init__(self, factory: NetnsFactory, tmp: Path, settings: Sequence[NicSetting] = SETTINGS) -> None:
        self.host = factory.netns()
        self.fabric = factory.netns()
        self.nic, self.peer = factory.veth(netns=self.host, peer_netns=self.fabric)
        sh(self.host, "addr", "add", "10.61.0.2/24", "dev", self.nic)
        sh(self.host, "link", "set", self.nic, "up")
        sh(self.fabric, "link", "set", self.peer, "up")
        self.pod_ns = factory.netns()
        self.store = CheckpointStore(str(tmp / "state"), str(tmp / "run"))
        self.hooks = NRIHooks(self.store, host_netns=f"/run/netns/{self.host}", settings=settings)
        self.uid = secrets.token_hex(8)
        self.pod = json_format.ParseDict(pod_json(self.uid, f"/run/netns/{self.pod_ns}"), api.PodSandbox())

    def run(self, interface: dict[str, object]) -> None:
        """RunPodSandbox of a pod whose claim gives the NIC this ``interface`` section."""
        prepare_claim(self.store, self.uid, [{"ifname": self.nic, "config": {"opaque": [{"interface": interface}]}}])
        self.hooks.run_pod_sandbox(self.pod)

    def record(self, setting: str) -> Any:
        """What ``setting`` recorded for the pod's NIC in the pod state (None: nothing)."""
        return self.store.read(lambda s: s.pods[self.uid].devices[0].records.get(setting))


class NoKernel:
    """Stands in for the host's or a pod's namespace in pure tests: reaching for the kernel through it
    fails the test. ``names``: the pod's link names, for the checks that read them."""

    def __init__(self, names: tuple[str, ...] = ()) -> None:
        self.names = set(names)
        self.created: list[dict[str, object]] = []
        self.rdma_exclusive = True  # the mode: not the kernel

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} used: this must not reach the kernel")
