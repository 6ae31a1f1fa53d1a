"""One link change, one device: the inventory after an incremental update equals a full scan.

Fixture trees (sysfs only, the event names the interface) and real netlink in a throwaway
network namespace (the scan runs under ``ip netns exec``, which mounts that namespace's sysfs):
after each change the last inventory patched with :class:`LinkUpdater`'s delta must be exactly
what a fresh scanner finds, and only the device the link feeds may be rebuilt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.doubles.sysfs_fixture import build
from driver.inventory.discovery import Scanner
from driver.inventory.incremental import InventoryDelta, LinkChange, LinkUpdater
from driver.model.device import Device

REPO = str(Path(__file__).resolve().parents[2])


def patched(before: list[Device], delta: InventoryDelta) -> list[dict[str, object]]:
    out = {d.name: d for d in before}
    for name in delta.removed:
        out.pop(name, None)
    out.update(delta.updated)
    return [out[n].to_dict() for n in sorted(out)]


def fresh(root: Path) -> list[dict[str, object]]:
    return [d.to_dict() for d in Scanner(str(root), exclude_interfaces=["eth0"], pci_ids_paths=()).scan()]


@pytest.fixture
def nd(tmp_path: Path) -> Path:
    return build("nd-h100-v5", tmp_path / "sys")


def test_fixture_netdev_change_rebuilds_its_pci_device_only(nd: Path) -> None:
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    before = scanner.scan()
    updater = LinkUpdater(scanner)
    netdev = (nd / "class/net/ib2").resolve()
    (netdev / "mtu").write_text("4092\n")
    (netdev / "operstate").write_text("down\n")
    (nd / "class/infiniband/mlx5_2/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    delta = updater.apply([LinkChange(0, "ib2")])
    assert set(delta.updated) == {"pci-0103-00-00-0"} and not delta.removed and not delta.full_scan
    assert patched(before, delta) == fresh(nd)
    device = delta.updated["pci-0103-00-00-0"]
    assert device.attributes["dra.net/mtu"] == 4092 and device.attributes["dra.net/rateGbps"] == 200


def test_fixture_netdev_gone_keeps_the_function_without_netdev_attributes(nd: Path) -> None:
    scanner = Scanner(str(nd), exclude_interfaces=["eth0"], pci_ids_paths=())
    before = scanner.scan()
    (nd / "class/net/ib5").unlink()  # e.g. moved into a pod: the function stays
    delta = LinkUpdater(scanner).apply([LinkChange(0, "ib5")])
    assert (
        set(delta.updated) == {"pci-0106-00-00-0"}
        and "dra.net/ifName" not in delta.updated["pci-0106-00-00-0"].attributes
    )
    assert patched(before, delta) == fresh(nd)


def test_without_a_full_scan_first_the_answer_is_a_full_scan(nd: Path) -> None:
    delta = LinkUpdater(Scanner(str(nd), pci_ids_paths=())).apply([LinkChange(0, "ib0")])
    assert delta.full_scan and not delta.updated


# The netlink half: a script run inside the namespace prints what it found after each step.
SCRIPT = r"""
import json, subprocess, sys
sys.path.insert(0, %r)
from driver.inventory.discovery import Scanner
from driver.inventory.incremental import LinkChange, LinkUpdater

def ip(*a): subprocess.run(["ip", *a], check=True)
def index(n): return int(open(f"/sys/class/net/{n}/ifindex").read())
def dump(devs): return {d.name: d.to_dict() for d in devs}
a, b, c, d, br = sys.argv[1:6]
scanner = Scanner(pci_ids_paths=())
inventory = dump(scanner.scan())
updater = LinkUpdater(scanner)
steps = []
def step(name, *changes):
    delta = updater.apply(list(changes))
    for n in delta.removed: inventory.pop(n, None)
    inventory.update(dump(delta.updated.values()))
    steps.append({"step": name, "full_scan": delta.full_scan, "updated": sorted(delta.updated),
                  "removed": sorted(delta.removed), "same": inventory == dump(Scanner(pci_ids_paths=()).scan())})
ia, ib = index(a), index(b)
ip("link", "set", a, "mtu", "1400", "up"); ip("addr", "add", "10.61.0.2/24", "dev", a)
step("mtu+address", LinkChange(ia, a), LinkChange(ib, b))  # b: its peer's carrier came up
ip("link", "set", a, "down"); ip("link", "set", a, "name", a + "x")
step("rename", LinkChange(ia, a + "x"), LinkChange(ib, b))
ip("link", "set", a + "x", "name", a); ip("link", "set", a, "master", br)
step("enslaved to the uplink", LinkChange(ia, a))
ip("link", "set", a, "nomaster")
step("released", LinkChange(ia, a))
ic, id_ = index(c), index(d); ip("link", "del", c)  # a veth pair goes together
step("deleted", LinkChange(ic, c), LinkChange(id_, d))
print(json.dumps(steps))
"""


@pytest.mark.root
def test_netlink_changes_match_a_full_scan(netns_factory) -> None:
    ns = netns_factory.netns()
    a, b = netns_factory.veth(netns=ns, peer_netns=ns)
    c, d = netns_factory.veth(netns=ns, peer_netns=ns)
    br = "br" + a[2:]
    run = lambda *args: subprocess.run(["ip", "-n", ns, *args], check=True)
    run("link", "add", br, "type", "bridge")
    for link in (br, b, c, d):
        run("link", "set", link, "up")
    run("addr", "add", "10.62.0.2/24", "dev", br)
    run("route", "add", "default", "via", "10.62.0.1", "dev", br)  # the bridge is the uplink
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", SCRIPT % REPO, a, b, c, d, br],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    steps = {s["step"]: s for s in json.loads(out.stdout)}
    assert all(s["same"] and not s["full_scan"] for s in steps.values()), json.dumps(steps, indent=1)
    assert steps["mtu+address"]["updated"] == sorted([a, b])
    assert steps["rename"]["updated"] == sorted([a + "x", b]) and steps["rename"]["removed"] == [a]
    assert a in steps["enslaved to the uplink"]["removed"] and not steps["enslaved to the uplink"]["updated"]
    assert steps["released"]["updated"] == [a]
    assert steps["deleted"]["removed"] == sorted([c, d])
