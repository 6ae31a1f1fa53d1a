"""A claim's dra.net config on the real node: applied in the pod, or refused by the kernel.

The host NIC carries its own address and route first, so giving it back "intact" is checked
for addresses and routes too, not only name, MTU and MAC.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterator

import pytest

from devcluster.cluster.controlplane import wait_for
from devcluster.cluster.pods import pod_view
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.e2e.node.support import (
    claim_config_template,
    create_template,
    delete_pod,
    dra_conditions,
    events_for,
    get_pod,
    host_ip,
    nic_snapshot,
    pod_claim,
    start_pod,
    wait_nics_home,
    wait_running,
)

pytestmark = E2E_MARKS


@pytest.fixture
def host_nic(real_node: RealNode) -> Iterator[str]:
    """The node's last NIC, with a host address and a route (removed again afterwards)."""
    nic = real_node.layout.nics[-1]
    net = f"192.168.{random.randint(100, 200)}"
    route = f"10.{random.randint(100, 200)}.0.0/16"
    host_ip(real_node, "addr", "add", f"{net}.1/24", "dev", nic)
    host_ip(real_node, "route", "add", route, "via", f"{net}.254", "dev", nic)
    try:
        yield nic
    finally:
        # Once the NIC is home (a failed test may leave its pod terminating), remove what we added.
        wait_for(lambda: nic in real_node.host_nics(), 60, 0.2, f"{nic} back on the node")
        host_ip(real_node, "route", "del", route, "dev", nic)
        host_ip(real_node, "addr", "del", f"{net}.1/24", "dev", nic)


def _select(nic: str) -> str:
    return f'device.attributes["dra.net"]["ifName"] == "{nic}"'


def test_static_address_mtu_and_route_inside_the_pod(real_node: RealNode, ns: str, host_nic: str) -> None:
    before = nic_snapshot(real_node, [host_nic])
    assert before[host_nic]["addresses"] and before[host_nic]["routes"]
    params = {
        # The sysctl settings too, by the chart's driver as installed (not privileged: its /proc/sys
        # is read-only).
        "interface": {
            "name": "net1",
            "addresses": ["192.168.61.5/24"],
            "mtu": 9000,
            "arpIgnore": 1,
            "arpAnnounce": 2,
            "forwarding": True,
        },
        "routes": [{"destination": "10.61.0.0/16", "gateway": "192.168.61.1"}],
    }
    create_template(real_node, claim_config_template(ns, "static", "net1", params, _select(host_nic)))
    pod = f"static-{secrets.token_hex(2)}"
    start_pod(real_node, ns, pod, "static")
    try:
        wait_running(real_node, ns, pod)
        view = pod_view(real_node.kubectl, ns, pod)
        net1 = view.interfaces.get("net1")
        assert net1 is not None, sorted(view.interfaces)
        assert net1.mtu == 9000 and net1.state == "UP" and net1.mac == before[host_nic]["mac"]
        assert "192.168.61.5/24" in net1.addresses
        assert any(r.startswith("10.61.0.0/16 via 192.168.61.1 dev net1") for r in view.routes), view.routes
        assert host_nic not in view.interfaces
        files = [f"/proc/sys/net/{k}" for k in ("ipv4/conf/net1/arp_ignore", "ipv4/conf/net1/arp_announce")]
        files += [f"/proc/sys/net/{f}/conf/net1/forwarding" for f in ("ipv4", "ipv6")]
        out = real_node.kubectl.run("exec", "-n", ns, pod, "--", "cat", *files)
        assert out.split() == ["1", "2", "1", "1"], out

        # The driver writes the claim's status once the pod's NICs are configured (not before the
        # kubelet reports the pod Running).
        def with_status() -> dict | None:
            c = pod_claim(real_node, ns, pod)
            return c if c["status"].get("devices") else None

        claim = wait_for(with_status, 30, 0.2, "the claim's status.devices")
        (entry,) = [d for d in claim["status"]["devices"] if d["driver"] == "dra.net"]
        assert entry["networkData"]["interfaceName"] == "net1"
        assert "192.168.61.5/24" in entry["networkData"]["ips"]
    finally:
        delete_pod(real_node, ns, pod)
    wait_nics_home(real_node, before)


def test_config_the_kernel_refuses_keeps_the_pod_from_starting(real_node: RealNode, ns: str, host_nic: str) -> None:
    before = nic_snapshot(real_node, [host_nic])
    # Valid for the validator; the kernel refuses a gateway outside every subnet of the link.
    params = {
        "interface": {"addresses": ["192.168.62.5/24"]},
        "routes": [{"destination": "10.62.0.0/16", "gateway": "172.31.62.1"}],
    }
    create_template(real_node, claim_config_template(ns, "refused", "nic", params, _select(host_nic)))
    pod = f"refused-{secrets.token_hex(2)}"
    start_pod(real_node, ns, pod, "refused")
    try:

        def failed() -> dict | None:
            c = dra_conditions(pod_claim(real_node, ns, pod))
            return c if c and all(x.get("Ready", {}).get("status") == "False" for x in c.values()) else None

        conds = wait_for(failed, 60, 0.3, "Ready=False on the claim")
        ((device, dev_conds),) = conds.items()
        ready = dev_conds["Ready"]
        # The status says which device and step failed, and why (the kernel's words).
        assert ready["reason"] == "RouteFailed", ready
        assert device in ready["message"] and "Network is unreachable" in ready["message"], ready
        # The pod never runs; the runtime keeps failing its sandbox, and events say why.
        p = get_pod(real_node, ns, pod)
        assert p["status"].get("phase") == "Pending"
        assert not any(s.get("state", {}).get("running") for s in p["status"].get("containerStatuses", []))
        events = wait_for(
            lambda: [e for e in events_for(real_node, ns, pod) if device in e], 30, 0.5, "an event naming the device"
        )
        assert any("Network is unreachable" in e for e in events), events
        # Rolled back: the NIC is on the host, exactly as before.
        wait_nics_home(real_node, before)
    finally:
        delete_pod(real_node, ns, pod)
    wait_nics_home(real_node, before)
    assert not real_node.pod_states().get("pods")
