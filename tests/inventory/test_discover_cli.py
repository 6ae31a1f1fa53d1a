"""`dranet discover` as a user runs it: a real process over a fixture sysfs tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from driver.inventory.discovery import Scanner

REPO = str(Path(__file__).resolve().parents[2])


def dranet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "--log-level", "error", *args],
        capture_output=True,
        text=True,
        timeout=300,  # a Python start: seconds under the stock-kernel tier's emulation
        cwd=REPO,
    )


def test_json_is_exactly_spec_devices(nd_h100_sysfs: Path) -> None:
    res = dranet("discover", "--sysfs-root", str(nd_h100_sysfs), "--output", "json", "--exclude-interfaces", "eth0")
    assert res.returncode == 0, res.stderr
    devices = json.loads(res.stdout)
    expected = [d.to_api() for d in Scanner(str(nd_h100_sysfs), exclude_interfaces=["eth0"]).scan()]
    assert devices == expected
    assert len(devices) == 8
    first = devices[0]
    assert set(first) == {"name", "attributes"}
    assert first["attributes"]["dra.net/rdma"] == {"bool": True}
    assert first["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert first["attributes"]["dra.net/rdmaDevice"] == {"string": "mlx5_0"}


def test_table(single_socket_sysfs: Path) -> None:
    res = dranet("discover", "--sysfs-root", str(single_socket_sysfs))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["NAME", "IFNAME", "PCIADDRESS", "RDMADEVICE", "NUMANODE", "LINKLAYER", "STATE"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["pci-0000-31-00-0"] == [
        "pci-0000-31-00-0",
        "ens2f0np0",
        "0000:31:00.0",
        "mlx5_0",
        "0",
        "Ethernet",
        "up",
    ]
    assert rows["pci-0000-5e-00-0"] == ["pci-0000-5e-00-0", "-", "0000:5e:00.0", "erdma_0", "0", "Ethernet", "-"]
    assert len(rows) == 6


def test_filter_and_bad_filter(single_socket_sysfs: Path) -> None:
    res = dranet(
        "discover",
        "--sysfs-root",
        str(single_socket_sysfs),
        "-o",
        "json",
        "--filter",
        'device.attributes["dra.net"].rdma == true',
    )
    assert [d["name"] for d in json.loads(res.stdout)] == ["pci-0000-31-00-0", "pci-0000-5e-00-0"]
    # The Go driver's syntax, as its users pass it: the same devices.
    go = 'attributes["dra.net/rdma"].BoolValue == true'
    res = dranet("discover", "--sysfs-root", str(single_socket_sysfs), "-o", "json", "--filter", go)
    assert [d["name"] for d in json.loads(res.stdout)] == ["pci-0000-31-00-0", "pci-0000-5e-00-0"]
    bad = dranet("discover", "--sysfs-root", str(single_socket_sysfs), "--filter", "device.(")
    assert bad.returncode == 2 and "--filter" in bad.stderr and bad.stdout == ""
    typo = dranet("discover", "--sysfs-root", str(single_socket_sysfs), "--filter", 'attributes["x"].Bool')
    assert typo.returncode == 2 and "--filter: attributes[...].Bool" in typo.stderr


def test_fixture_root_makes_no_netlink_calls(nd_h100_sysfs: Path) -> None:
    """With a non-host sysfs root, pyroute2 is never even imported."""
    code = (
        "import sys; sys.path.insert(0, %r); from driver.inventory.discovery import Scanner; "
        "Scanner(%r).scan(); print('pyroute2' in sys.modules)"
    ) % (REPO, str(nd_h100_sysfs))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_missing_or_wrong_sysfs_root_is_a_clear_error(tmp_path) -> None:
    import subprocess
    import sys

    for root, why in ((tmp_path / "nope", "no such directory"), (tmp_path, "not a sysfs tree")):
        for cmd in (["discover"], ["run", "--no-nri"]):
            out = subprocess.run(
                [sys.executable, "-m", "driver.cli", "--log-format", "text", *cmd, "--sysfs-root", str(root)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 2, (cmd, out.stderr)
            assert f"--sysfs-root {root}: {why}" in out.stderr, (cmd, out.stderr)
