"""The cluster's wiring: the cluster network and the rails, all switches in one "fabric" netns.

* The cluster network: a bridge (``cluster``) in the fabric namespace. Every node's ``eth0`` is
  a port (its node IP), and so is the host's one link into the cluster (``dn<name>``, address
  `NodeLayout.gateway`, where the apiserver and the cluster DNS listen). Each node routes its
  pods' /24 (and /64 on IPv6) over its pods' bridge and the other nodes' pod ranges via their node IPs, so pods on
  different nodes reach each other without any encapsulation or NAT; the host routes every pod
  /24 via its node, so the control plane reaches pods (webhooks) and pods reach the apiserver.
* The rails: NIC ``ib<r>`` of every node is a veth whose far end is a port of bridge ``rail<r>``
  in the fabric namespace: one L2 segment per rail, as on a rail-optimized InfiniBand fabric. Each
  NIC carries a host address on its rail's subnet (as IPoIB NICs do), so two pods on two nodes
  given NICs of the same rail talk over them directly.

Nothing here touches a host link other than the cluster's own ``dn<name>``; the host gets one
route per node (the pods' /24 via that node), removed with the link.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from pathlib import Path

from devcluster.cluster.node_layout import NodeLayout, NodeSpec

NIC_MTU = 4092  # the IPoIB datagram MTU family; a veth takes any MTU up to 65535
CLUSTER_BRIDGE = "cluster"
HOST_PORT = "host"


class FabricError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its error."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise FabricError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()}")
    return out


def _batch(lines: list[str], netns: str | None = None) -> None:
    """Several ``ip`` commands in one process (``ip -batch -``); stops at the first error."""
    cmd = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    out = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if out.returncode != 0:
        raise FabricError(f"`{' '.join(cmd)}` failed: {out.stderr.strip()}")


def rail(index: int) -> str:
    return f"rail{index}"


def nic_mac(node: NodeSpec, nic: str) -> str:
    """A stable, locally administered MAC per cluster, node and NIC."""
    h = hashlib.sha256(f"{node.layout.name}/{node.index}/{nic}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in h[:5])


def netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


# The first word of an ``ip route`` line when it is a route type, not a destination.
_NOT_A_PREFIX = ("default", "broadcast", "local", "unreachable", "prohibit", "blackhole", "multicast", "anycast")


def overlapping_routes(layout: NodeLayout) -> list[str]:
    """Host routes that overlap the cluster's address ranges (another cluster, or the host's own)."""
    found = []
    for mine in layout.ranges:
        out = _ip(f"-{mine.version}", "route", "show", "table", "all", check=False).stdout.splitlines()
        for line in out:
            dest = line.split()[0] if line.split() else ""
            if dest in _NOT_A_PREFIX:
                continue
            try:
                net = ipaddress.ip_network(dest, strict=False)
            except ValueError:
                continue
            if net.overlaps(mine) and f"dev {layout.host_link}" not in line and not net.is_loopback:  # type: ignore[arg-type]
                found.append(line.strip())
    return found


def create(layout: NodeLayout) -> None:
    """The fabric namespace with the cluster bridge and one bridge per rail, and the host link."""
    if _ip("link", "show", "dev", layout.host_link, check=False).returncode == 0:
        raise FabricError(f"host link {layout.host_link} exists: cluster {layout.name!r} is up or was not removed")
    clash = overlapping_routes(layout)
    if clash:
        raise FabricError(
            f"cluster_cidr {layout.cluster_cidr} ({', '.join(map(str, layout.ranges))}) overlaps host routes "
            f"({'; '.join(clash[:3])}): another "
            "cluster uses it; pick another range (--cidr)"
        )
    if not netns_exists(layout.fabric_netns):
        _ip("netns", "add", layout.fabric_netns)
    lines = ["link set lo up", f"link add {CLUSTER_BRIDGE} type bridge", f"link set {CLUSTER_BRIDGE} up"]
    for r in range(len(layout.nics)):
        lines += [f"link add {rail(r)} mtu {NIC_MTU} type bridge", f"link set {rail(r)} up"]
    _batch(lines, layout.fabric_netns)
    _ip("link", "add", layout.host_link, "type", "veth", "peer", "name", HOST_PORT, "netns", layout.fabric_netns)
    _batch([f"link set {HOST_PORT} master {CLUSTER_BRIDGE}", f"link set {HOST_PORT} up"], layout.fabric_netns)
    _batch([*_addr_lines(layout, layout.gateways, layout.host_link), f"link set {layout.host_link} up"])


def _addr_lines(layout: NodeLayout, addresses: list[str], dev: str) -> list[str]:
    """``ip addr add`` of one address per IP version on the cluster network."""
    return [
        _addr_add(f"{a}/{layout.node_network_of(v).prefixlen}", dev)
        for v, a in zip(layout.versions, addresses, strict=True)
    ]


def _addr_add(cidr: str, dev: str) -> str:
    """``ip addr add``; an IPv6 address skips duplicate address detection: every address here is
    assigned once, by this module, and a tentative one cannot be bound (the apiserver, the kubelet
    and CoreDNS bind theirs at once)."""
    return f"addr add {cidr} dev {dev}" + (" nodad" if ":" in cidr else "")


def add_node(node: NodeSpec) -> None:
    """Cable a node (its netns exists): ``eth0`` to the cluster network, its NICs to the rails,
    the routes to every node's pods; and the host's route to this node's pods."""
    layout, fabric, ns = node.layout, node.layout.fabric_netns, node.netns
    _ip("link", "add", node.uplink_peer, "type", "veth", "peer", "name", "eth0", "netns", ns, netns=fabric)
    lines = [f"link set {node.uplink_peer} master {CLUSTER_BRIDGE}", f"link set {node.uplink_peer} up"]
    for r, nic in enumerate(layout.nics):
        peer = node.peer(nic)
        _ip("link", "add", peer, "mtu", str(NIC_MTU), "type", "veth", "peer", "name", nic, "netns", ns, netns=fabric)
        lines += [f"link set {peer} master {rail(r)}", f"link set {peer} up"]
    _batch(lines, fabric)
    inside = ["link set lo up", *_addr_lines(layout, node.ips, "eth0"), "link set eth0 up"]
    inside += [f"route add default via {gw} dev eth0" for gw in layout.gateways]
    for other in layout.all_nodes:
        if other.index != node.index:
            for v in layout.versions:
                inside.append(f"route add {other.pod_subnet_of(v)} via {other.ip_of(v)} dev eth0")
    for r, nic in enumerate(layout.nics):
        inside += [
            f"link set {nic} address {nic_mac(node, nic)} mtu {NIC_MTU}",
            *(_addr_add(a, nic) for a in node.rail_addresses(r)),
            f"link set {nic} up",
        ]
    _batch(inside, ns)
    # The node forwards between its pods' bridge and the cluster network.
    forwarding = {4: "net.ipv4.ip_forward=1", 6: "net.ipv6.conf.all.forwarding=1"}
    subprocess.run(
        ["nsenter", f"--net={node.netns_path}", "sysctl", "-q", "-w", *(forwarding[v] for v in layout.versions)],
        check=True,
        capture_output=True,
    )
    for v in layout.versions:
        _ip("route", "replace", node.pod_subnet_of(v), "via", node.ip_of(v), "dev", layout.host_link)


def remove_node(node: NodeSpec) -> None:
    """Unplug a node: its ports on the switches (its own links go with its netns) and its route."""
    for link in (node.uplink_peer, *(node.peer(n) for n in node.layout.nics)):
        if netns_exists(node.layout.fabric_netns):
            _ip("link", "del", link, netns=node.layout.fabric_netns, check=False)
    for v in node.layout.versions:
        _ip("route", "del", node.pod_subnet_of(v), "dev", node.layout.host_link, check=False)


def remove(layout: NodeLayout) -> None:
    """The host link (its routes go with it) and the fabric namespace (every port and bridge)."""
    if _ip("link", "show", "dev", layout.host_link, check=False).returncode == 0:
        _ip("link", "del", layout.host_link, check=False)
    if netns_exists(layout.fabric_netns):
        _ip("netns", "del", layout.fabric_netns, check=False)


def unplug_nic(node: NodeSpec, nic: str) -> None:
    """Take ``nic`` out of the node as a failed or removed card would go: its veth (both ends) is
    deleted; :func:`plug_nic` puts one back as it was."""
    _ip("link", "del", node.peer(nic), netns=node.layout.fabric_netns)


def plug_nic(node: NodeSpec, nic: str) -> None:
    """Put ``nic`` back into the node as :func:`add_node` cabled it: name, MAC, MTU, rail, address."""
    layout, r = node.layout, node.layout.nics.index(nic)
    peer = node.peer(nic)
    _ip(
        "link",
        "add",
        peer,
        "mtu",
        str(NIC_MTU),
        "type",
        "veth",
        "peer",
        "name",
        nic,
        "netns",
        node.netns,
        netns=layout.fabric_netns,
    )
    _batch([f"link set {peer} master {rail(r)}", f"link set {peer} up"], layout.fabric_netns)
    _batch(
        [
            f"link set {nic} address {nic_mac(node, nic)} mtu {NIC_MTU}",
            *(_addr_add(a, nic) for a in node.rail_addresses(r)),
            f"link set {nic} up",
        ],
        node.netns,
    )


def set_link(node: NodeSpec, nic: str, up: bool) -> None:
    """Pull or plug the cable of ``nic``: its far end on the rail goes down or up (carrier)."""
    _ip("link", "set", node.peer(nic), "up" if up else "down", netns=node.layout.fabric_netns)


def rail_counters(layout: NodeLayout) -> dict[tuple[int, str], tuple[int, int]]:
    """(node index, NIC) -> (bytes the NIC sent, bytes it received), read at the rail's switch
    port (the NIC's far end: its rx is the NIC's tx), wherever the NIC itself is (host or pod)."""
    out = json.loads(_ip("-s", "-j", "link", "show", netns=layout.fabric_netns).stdout)
    stats = {link["ifname"]: link.get("stats64", {}) for link in out}
    counters = {}
    for node in layout.all_nodes:
        for nic in layout.nics:
            s = stats.get(node.peer(nic))
            if s:
                counters[(node.index, nic)] = (int(s["rx"]["bytes"]), int(s["tx"]["bytes"]))
    return counters


def node_nics(node: NodeSpec) -> dict[str, dict[str, object]]:
    """The node's NICs currently in its own network namespace (not in a pod): name -> ``ip -j`` facts."""
    out = _ip("-j", "-d", "addr", "show", netns=node.netns, check=False)
    if out.returncode != 0:
        return {}
    return {link["ifname"]: link for link in json.loads(out.stdout) if link["ifname"] in node.layout.nics}
