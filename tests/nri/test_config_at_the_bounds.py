"""The heaviest configuration the API admits, applied by the real hooks to real veths.

A pod with two claims, each at the API's bounds (one NIC with the most entries a NIC may have, the
claim with the most netlink requests a claim may take), starts with every address, route, rule
and neighbor in place, and stops with the NICs back as they were. The pod's NICs are configured in
one pipelined batch of 400 requests: more acknowledgements than the socket's default receive
buffer holds at once, so the channel must send them in windows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.api.v1alpha1.decode import MAX_NIC_ENTRIES, MAX_POD_REQUESTS
from driver.api.v1alpha1.validation import validate_claim_spec
from driver.checkpoint.store import CheckpointStore
from driver.nri.hooks import NRIHooks
from harness.bounds import REST_ROUTES, at_the_bounds, entries, nic_params
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.support.hook_node import ipj, neighbors, rules, sh

pytestmark = pytest.mark.root

OPAQUE_LIMIT = 10_240  # the apiserver's limit on one config's parameters


def claim_spec(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """A claim of two NICs, one request and one config each (as a user writes it)."""
    return {
        "devices": {
            "requests": [{"name": n, "exactly": {"deviceClassName": "dranet.net"}} for n in ("a", "b")],
            "config": [
                {"requests": [n], "opaque": {"driver": "dra.net", "parameters": p}}
                for n, p in (("a", first), ("b", second))
            ],
        }
    }


def test_two_claims_at_the_apis_bounds_start_and_stop_a_pod(netns_factory: NetnsFactory, tmp_path: Path) -> None:
    host, fabric, pod_ns = netns_factory.netns(), netns_factory.netns(), netns_factory.netns()
    nics = []
    for _ in range(4):
        nic, peer = netns_factory.veth(netns=host, peer_netns=fabric)
        sh(host, "link", "set", nic, "up")
        sh(fabric, "link", "set", peer, "up")
        nics.append(nic)
    before = {nic: link_facts(nic, host) for nic in nics}

    # Per claim: one NIC at the per-NIC bound (128 entries, 129 requests with its link-up), the
    # other taking the claim to its bound (200 requests).
    params = at_the_bounds()
    assert [entries(p) for p in params] == [MAX_NIC_ENTRIES, MAX_POD_REQUESTS - MAX_NIC_ENTRIES - 2] * 2
    for pair in (params[:2], params[2:]):
        assert validate_claim_spec(claim_spec(*pair), "spec") == []  # admitted
        assert sum(entries(p) + 1 for p in pair) == MAX_POD_REQUESTS  # at the claim's bound
    assert all(len(json.dumps(p, separators=(",", ":"))) <= OPAQUE_LIMIT for p in params)
    one_more = nic_params(1, REST_ROUTES + 1, 6)
    assert validate_claim_spec(claim_spec(params[0], one_more), "spec")  # the bound is the bound

    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = NRIHooks(store, host_netns=f"/run/netns/{host}")
    uid = "pod-at-the-bounds"
    pod = json_format.ParseDict(pod_json(uid, f"/run/netns/{pod_ns}"), api.PodSandbox())
    for pair in ((0, 1), (2, 3)):
        prepare_claim(store, uid, [{"ifname": nics[i], "config": {"opaque": [params[i]]}} for i in pair])
    hooks.run_pod_sandbox(pod)
    try:
        for i, p in enumerate(params):
            name = p["interface"]["name"]
            facts = link_facts(name, pod_ns)
            assert facts is not None, name
            assert set(p["interface"]["addresses"]) <= set(facts["addresses"]), name
            main = {r["dst"] for r in ipj(pod_ns, "route", "show", "dev", name)}
            table = {r["dst"] for r in ipj(pod_ns, "route", "show", "table", str(100 + i), "dev", name)}
            want = [r["destination"] for r in p["routes"]]
            assert {d for k, d in enumerate(want) if not k % 2} <= main, name
            assert {d for k, d in enumerate(want) if k % 2} <= table, name
            got = {(dst, mac) for dst, mac, _ in neighbors(pod_ns, name)}
            assert {(n["destination"], n["hardwareAddr"]) for n in p["neighbors"]} <= got, name
            assert {r["priority"] for r in p["rules"]} <= {r[0] for r in rules(pod_ns)}, name
    finally:
        hooks.stop_pod_sandbox(pod)
    assert {nic: link_facts(nic, host) for nic in nics} == before  # every NIC home, as it was
    assert not ipj(pod_ns, "link", "show", "type", "veth")
