"""Two real nodes: both Ready with a real kubelet, the driver's DaemonSet pod Ready on each, each
node publishing exactly its own NICs; and two pods on two nodes talking over the NICs their
claims got (a static address by claim config), not over the pod network.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import pytest

from devcluster.cluster import fabric
from devcluster.cluster import lifecycle as cluster
from devcluster.cluster.controlplane import wait_for
from driver.kube.client import RESOURCE_API
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import delete_pod, nic_claim, pod_claim, spread_pod, wait_running

pytestmark = E2E_MARKS


def test_every_node_ready_with_the_driver_and_its_own_nics(real_node: RealNode) -> None:
    layout, kube = real_node.layout, real_node.kube
    assert layout.nodes >= 2
    ds = kube.request("GET", f"/apis/apps/v1/namespaces/{cluster.NAMESPACE}/daemonsets/{cluster.RELEASE}")
    assert ds["status"]["desiredNumberScheduled"] == ds["status"]["numberReady"] == layout.nodes
    published: dict[str, set[str]] = {}
    for spec in layout.all_nodes:
        node = kube.read_node(spec.name)
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True", (spec.name, conds)
        # A real kubelet of the release under test reported this, from the node's own address.
        assert node["status"]["nodeInfo"]["kubeletVersion"] == real_node.state.k8s_version
        assert {"type": "InternalIP", "address": spec.ip} in node["status"]["addresses"]
        pod = real_node.wait_driver_ready(node=spec.index)
        assert pod["spec"]["nodeName"] == spec.name
        # Its slices: every NIC of this node, as the driver on this node found them.
        slices = kube.request(
            "GET",
            f"{RESOURCE_API}/resourceslices",
            query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={spec.name}"},
        )["items"]
        assert slices and all(s["spec"]["nodeName"] == spec.name for s in slices)
        ifnames = [
            d["attributes"]["dra.net/ifName"]["string"]
            for s in slices
            for d in s["spec"].get("devices") or []
            if "dra.net/ifName" in d.get("attributes", {})
        ]
        assert sorted(ifnames) == sorted(layout.nics), (spec.name, ifnames)
        # The NICs are this node's own: their hardware addresses (unique per machine, as IPoIB
        # GUIDs are) are the ones in this node's sysfs, and no other node publishes them.
        macs = {
            d["attributes"]["dra.net/ifName"]["string"]: d["attributes"]["dra.net/mac"]["string"]
            for s in slices
            for d in s["spec"].get("devices") or []
            if "dra.net/mac" in d.get("attributes", {})
        }
        assert macs == {n: (spec.sysfs / "class/net" / n / "address").read_text().strip() for n in layout.nics}
        published[spec.name] = set(macs.values())
    names = list(published)
    assert not published[names[0]] & published[names[1]], "two nodes publish the same NICs"


IFA_F_TENTATIVE = 0x40
INET6 = "/proc/net/if_inet6"


def _tentative(if_inet6: str, ifname: str) -> list[str]:
    """``ifname``'s addresses still under duplicate detection, from ``/proc/net/if_inet6`` (the pods'
    busybox ``ip`` cannot filter by flag): address, ifindex, prefix, scope, flags, name per line."""
    rows = [line.split() for line in if_inet6.splitlines()]
    return [r[0] for r in rows if len(r) == 6 and r[5] == ifname and int(r[4], 16) & IFA_F_TENTATIVE]


# Claim addresses per IP version of the cluster (a dual-stack claim sets both).
CLAIM_ADDRESSES = {4: ("192.168.77.{}", 24), 6: ("fd77:77::{}", 64)}


@pytest.mark.parametrize("addresses", ["claim", "rail"])
def test_pods_on_two_nodes_ping_each_other_over_their_claimed_nics(
    real_node: RealNode, ns: str, addresses: str
) -> None:
    """``claim``: the claim's config sets the NIC's addresses; ``rail``: none, so the NIC keeps
    its host addresses on the rail (IPv4, IPv6 or both, as the cluster's family has them)."""
    layout, kube = real_node.layout, real_node.kube
    rail = 2 if addresses == "claim" else 3
    nic = layout.nics[rail]
    group = secrets.token_hex(3)
    pods: dict[str, dict[str, Any]] = {}
    for i, who in enumerate("ab"):
        cidrs = [CLAIM_ADDRESSES[v][0].format(1 + i) + f"/{CLAIM_ADDRESSES[v][1]}" for v in layout.versions]
        claim = nic_claim(ns, f"nic-{who}", nic, cidrs if addresses == "claim" else None)
        kube.request("POST", f"{RESOURCE_API}/namespaces/{ns}/resourceclaims", claim)
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", spread_pod(ns, f"pod-{who}", f"nic-{who}", group))
    pods = {who: wait_running(real_node, ns, f"pod-{who}") for who in "ab"}
    nodes = {who: p["spec"]["nodeName"] for who, p in pods.items()}
    assert nodes["a"] != nodes["b"], f"required anti-affinity: {nodes}"
    index = {s.name: s.index for s in layout.all_nodes}
    # Every address the NIC has in each pod, one per IP version of the cluster.
    addrs: dict[str, list[str]] = {}
    for i, who in enumerate("ab"):
        claim = pod_claim(real_node, ns, f"pod-{who}")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["pool"] == nodes[who], "the claim's NIC is on the pod's own node"
        # The NIC left its node for the pod.
        assert nic not in real_node.host_nics(index[nodes[who]])
        if addresses == "claim":
            want = [CLAIM_ADDRESSES[v][0].format(1 + i) + f"/{CLAIM_ADDRESSES[v][1]}" for v in layout.versions]
        else:
            want = layout.node(index[nodes[who]]).rail_addresses(rail)
        out = real_node.kubectl.exec(ns, f"pod-{who}", "ip", "-o", "addr", "show", "dev", nic)
        for cidr in want:
            assert f"{'inet6' if ':' in cidr else 'inet'} {cidr}" in out, out
        addrs[who] = [c.split("/")[0] for c in want]
    if 6 in layout.versions:
        # The pods' IPv6 addresses start optimistic (RFC 4429) and the pod's link-local one tentative:
        # a first echo sent while duplicate detection runs may get no answer (seen under load).
        # Five of five is asked once detection is over in both pods.
        for who in "ab":
            wait_for(
                lambda who=who: not _tentative(real_node.kubectl.exec(ns, f"pod-{who}", "cat", INET6), nic),
                30,
                0.5,
                f"pod-{who}'s IPv6 addresses past duplicate detection",
            )
    before = fabric.rail_counters(layout)
    for a_ip, b_ip in zip(addrs["a"], addrs["b"], strict=True):
        out = real_node.kubectl.exec(ns, "pod-a", "ping", "-c", "5", "-W", "2", "-I", nic, b_ip, timeout=60)
        assert re.search(r"5 packets transmitted, 5 (packets )?received", out), out
        route = real_node.kubectl.exec(ns, "pod-a", "ip", "route", "get", b_ip)
        assert f"dev {nic}" in route and "eth0" not in route, route
        back = real_node.kubectl.exec(ns, "pod-b", "ping", "-c", "3", "-W", "2", a_ip, timeout=60)
        assert re.search(r"3 packets transmitted, 3 (packets )?received", back), back
    after = fabric.rail_counters(layout)
    # Eight echo requests and replies per IP version (98 bytes or more on the wire each) crossed
    # the rail's switch ports of both nodes; the other rails carried none of it.
    echoes = 16 * len(addrs["a"])
    for who in "ab":
        i = index[nodes[who]]
        sent = sum(after[(i, nic)]) - sum(before[(i, nic)])
        assert sent >= echoes * 98, (nodes[who], sent)
        for other in layout.nics:
            if other != nic:
                assert sum(after[(i, other)]) - sum(before[(i, other)]) < echoes * 98, (nodes[who], other)
    for who in "ab":
        delete_pod(real_node, ns, f"pod-{who}")
    for who in "ab":
        wait_for(lambda i=index[nodes[who]]: nic in real_node.host_nics(i), 60, 0.2, f"{nic} back on {nodes[who]}")
