"""Shared NICs: a sub-interface made in the pod vs a whole NIC moved in vs no NIC, in one run.

``python -m bench.bench_sharing [--cycles 200] [--cluster NAME --runs 20 --load 100]`` (root).

**Hooks** (always; real namespaces, no cluster): the NRI hooks (``driver/nri/hooks.py``) in this
process, interleaved ABBA-style per cycle over three arms on throwaway veths in a private "host"
namespace: ``sub-interface`` (a share of a NIC: a macvlan made in the pod's namespace, named,
MTU, an address and a route), ``whole-nic`` (the same config on a veth moved into the pod),
``no-nic`` (a pod whose claim holds no netdev: the hooks' fixed cost). RunPodSandbox and
StopPodSandbox times, median and p99, and the ratio sub-interface / whole-nic.

**Pods** (with ``--cluster``, a running ``python -m devcluster up --set sharing.filter=...``
cluster whose ``ib0`` is shared and ``ib1`` is not): pod creation -> Ready, interleaved, for a pod
with a 1% share of ib0 (a sub-interface), a pod with ib1 whole, and a pod without a claim; then
``--load`` pods holding shares of the shared NICs: their prepare + start under that load and the
driver's RSS with that many shares.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from bench.stats import median, pct
from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import DriverState
from driver.checkpoint.store import CheckpointStore
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory, _ip
from harness.nri import pod_json, prepare_claim

ARMS = ("sub-interface", "whole-nic", "no-nic")


def _config(i: int) -> dict[str, Any]:
    iface = {"name": "net1", "mtu": 1400, "addresses": [f"10.{90 + i % 100}.0.2/24"]}
    return {
        "opaque": [
            {"interface": iface, "routes": [{"destination": "10.200.0.0/16", "gateway": f"10.{90 + i % 100}.0.1"}]}
        ]
    }


def hook_times(cycles: int) -> dict[str, dict[str, list[float]]]:
    """RunPodSandbox and StopPodSandbox (ms) of each arm, ``cycles`` each, interleaved."""
    factory = NetnsFactory()
    out: dict[str, dict[str, list[float]]] = {a: {"run": [], "stop": []} for a in ARMS}
    work = Path(tempfile.mkdtemp(prefix="dn-bench-share-"))
    host = factory.netns()
    try:
        fabric = factory.netns()
        shared, peer = factory.veth(netns=host, peer_netns=fabric)
        _ip("-n", host, "link", "set", shared, "up")
        _ip("-n", fabric, "link", "set", peer, "up")
        store = CheckpointStore(str(work / "state"), str(work / "run"))
        hooks = NRIHooks(store, host_netns=f"/run/netns/{host}")
        for i in range(cycles):
            order = ARMS if i % 2 == 0 else tuple(reversed(ARMS))
            for arm in order:
                pod_ns, uid = factory.netns(), secrets.token_hex(8)
                if arm == "sub-interface":
                    devices = [{"ifname": shared, "device": "shared", "share_id": uid, "config": _config(i)}]
                elif arm == "whole-nic":
                    nic, _ = factory.veth(netns=host, peer_netns=fabric)
                    devices = [{"ifname": nic, "device": nic, "config": _config(i)}]
                else:
                    devices = [{"ifname": None, "device": "rdma-only"}]
                prepare_claim(store, uid, devices)
                pod = json_format.ParseDict(pod_json(uid, f"/run/netns/{pod_ns}"), api.PodSandbox())
                out[arm]["run"].append(_ms(lambda p=pod: hooks.run_pod_sandbox(p)))
                out[arm]["stop"].append(_ms(lambda p=pod: hooks.stop_pod_sandbox(p)))
                store.update(lambda s, u=uid: _drop_claims(s, u))
                _ip("netns", "del", pod_ns)
                factory.namespaces.remove(pod_ns)
        hooks.close()
    finally:
        factory.cleanup()
    return out


def _drop_claims(state: DriverState, pod_uid: str) -> None:
    """The kubelet's unprepare of the pod's claims (the pod is gone)."""
    for uid in [k for k, claim in state.claims.items() if pod_uid in claim.pod_uids]:
        del state.claims[uid]


def _ms(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0)


def report_hooks(times: dict[str, dict[str, list[float]]]) -> None:
    n = len(times[ARMS[0]]["run"])
    print(f"NRI hooks in-process, {n} cycles per arm, interleaved (ms):")
    for arm in ARMS:
        for hook in ("run", "stop"):
            ms = times[arm][hook]
            print(f"  {arm:<14} {hook:<4} median {median(ms):6.2f}   p99 {pct(ms, 99):6.2f}")
    for hook in ("run", "stop"):
        sub, whole, none = (median(times[a][hook]) for a in ARMS)
        print(
            f"  {hook}: sub-interface / whole-nic median {sub / whole:.2f}; over no-nic: sub-interface "
            f"+{sub - none:.2f} ms, whole-nic +{whole - none:.2f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=200, help="hook cycles per arm")
    ap.add_argument("--cluster", help="a running devcluster whose ib0 is shared: also time pod starts")
    ap.add_argument("--runs", type=int, default=20, help="pod starts per arm (with --cluster)")
    ap.add_argument("--load", type=int, default=100, help="pods holding shares at once (with --cluster)")
    ap.add_argument("--json", type=Path, help="also write the hook times (ms per cycle, by arm and hook) here")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_sharing needs root (namespaces)", file=sys.stderr)
        return 2
    if a.cycles:
        times = hook_times(a.cycles)
        report_hooks(times)
        if a.json:
            a.json.write_text(json.dumps({"release": os.uname().release, "times": times}))
    if a.cluster:
        from bench.sharing_pods import run_pods

        run_pods(a.cluster, a.runs, a.load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
