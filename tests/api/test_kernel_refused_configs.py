"""Configs the kernel always refuses (or acknowledges and drops) are refused before any pod starts:
by ``dranet validate`` (the real CLI) and the webhook (its HTTP application), naming the field.
The kernel itself is the oracle: each address or MTU is also tried on a real veth in a throwaway
namespace, and refused or not kept there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api.test_validate_cli import run
from tests.support.admission import review_of, webhook_client

P = "spec.devices.config[0].opaque.parameters"

CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    # name: (interface config, refused field, reason)
    "ipv6-multicast": ({"addresses": ["ff02::1/64"]}, "interface.addresses[0]", "IPv6 multicast"),
    "ipv6-unspecified": ({"addresses": ["::/128"]}, "interface.addresses[0]", "unspecified"),
    "ipv6-default": ({"addresses": ["::/0"]}, "interface.addresses[0]", "unspecified"),
    "ipv6-loopback": ({"addresses": ["::1/128"]}, "interface.addresses[0]", "loopback"),
    "ipv4-unspecified": ({"addresses": ["0.0.0.0/0"]}, "interface.addresses[0]", "unspecified"),
    "ipv6-twice": (
        {"addresses": ["fd00::5/64", "fd00::5/80"]},
        "interface.addresses[1]",
        "fd00::5/64 again at another prefix length",
    ),
    "mtu-below-ipv6": ({"mtu": 1200, "addresses": ["fd00::7/64"]}, "interface.mtu", "below 1280"),
}


def _claim(interface: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net"}}],
                "config": [{"opaque": {"driver": "dra.net", "parameters": {"interface": interface}}}],
            }
        },
    }


def test_dranet_validate_refuses_what_the_kernel_refuses(tmp_path: Path) -> None:
    files = {}
    for case, (interface, _, _) in CASES.items():
        files[case] = tmp_path / f"{case}.yaml"
        files[case].write_text(yaml.safe_dump(_claim(interface)))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_claim({"mtu": 1280, "addresses": ["fd00::5/64", "fd00::6/80", "10.1.0.5/24"]})))
    out = run(*map(str, files.values()), str(good))
    assert out.returncode == 1 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    for case, (_, field, reason) in CASES.items():
        [line] = [ln for ln in lines if ln.startswith(f"{files[case]}:")]
        assert f"{P}.{field}: " in line and reason in line, line
    assert not [ln for ln in lines if ln.startswith(str(good))]


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_webhook_refuses_what_the_kernel_refuses(case: str) -> None:
    interface, field, reason = CASES[case]
    async with webhook_client() as client:
        resp = await client.post("/", data=json.dumps(review_of(_claim(interface))).encode())
        answer = (await resp.json())["response"]
    assert answer["allowed"] is False
    assert f"{P}.{field}: " in answer["status"]["message"] and reason in answer["status"]["message"]


def _ip(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True)


@pytest.mark.root
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_refuses_it_or_keeps_nothing(case: str, netns_factory) -> None:
    """The oracle: the same setting on a real link is refused, or acknowledged without effect."""
    ns = netns_factory.netns()
    nic, _ = netns_factory.veth(netns=ns, peer_netns=ns)
    interface = CASES[case][0]
    if "mtu" in interface:
        assert _ip(ns, "link", "set", nic, "mtu", str(interface["mtu"])).returncode == 0
    refused = 0
    for cidr in interface["addresses"]:
        refused += _ip(ns, "addr", "add", cidr, "dev", nic).returncode != 0
    kept = [
        f"{a['local']}/{a['prefixlen']}"
        for entry in json.loads(_ip(ns, "-j", "addr", "show", "dev", nic).stdout)
        for a in entry.get("addr_info", [])
        if a.get("scope") == "global"
    ]
    assert refused or len(kept) < len(interface["addresses"]), (refused, kept)
