"""The Go driver's flags and ``--feature-gates`` on our command line; ``dranet discover`` with cloud
metadata (recorded Azure IMDS on 127.0.0.1) and the list form of the NUMA attribute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from driver.cli import build_parser, go_flag_problems, main, seconds
from driver.config import config_from_args, parse_feature_gates
from tests.support.metadata_server import MetadataServer

REPO = str(Path(__file__).resolve().parents[1])


def run_args(*argv: str) -> object:
    return build_parser().parse_args(["run", *argv])


def test_go_flag_aliases_set_our_settings() -> None:
    args = run_args(
        "--hostname-override=node-7",
        "--kubelet-root-dir=/data/kubelet",
        "--cloud-provider-hint=AZURE",
        "--inventory-min-poll-interval=2s",
        "--inventory-max-poll-interval=1m30s",
        "--feature-gates=DRAListTypeAttributes=true",
        "--v=4",
    )
    cfg = config_from_args(args)  # type: ignore[arg-type]
    assert cfg.node_name == "node-7" and cfg.kubelet_root == "/data/kubelet"
    assert cfg.cloud_provider == "azure"
    assert (cfg.publish_interval, cfg.resync_interval) == (2.0, 90.0)
    assert cfg.list_numa_attribute is True
    assert args.verbosity == 4  # type: ignore[attr-defined]


def test_defaults_are_auto_and_no_gates() -> None:
    cfg = config_from_args(run_args())  # type: ignore[arg-type]
    assert cfg.cloud_provider == "auto" and cfg.cloud_metadata_url is None
    assert cfg.feature_gates == {"DRAListTypeAttributes": False, "PersistentResourceSliceAttributes": False}


@pytest.mark.parametrize(
    ("text", "value"), [("60", 60.0), ("2.5", 2.5), ("500ms", 0.5), ("1h2m3s", 3723.0), ("1.5m", 90.0)]
)
def test_durations(text: str, value: float) -> None:
    assert seconds(text) == value


def test_bad_values_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, needle in (
        (["--cloud-provider=CKS"], "'CKS' is not one of"),
        (["--feature-gates=Nope=true"], "unrecognized feature gate 'Nope'"),
        (["--feature-gates=DRAListTypeAttributes"], "expected <gate>=true|false"),
        (["--resync-interval=1 minute"], "is not a duration"),
    ):
        with pytest.raises(SystemExit) as exc:
            run_args(*argv)
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err
    with pytest.raises(ValueError, match="--feature-gates: unrecognized feature gate 'X'"):
        parse_feature_gates("X=true")


def test_go_flags_without_an_equivalent_warn_or_refuse() -> None:
    warnings, errors = go_flag_problems(
        run_args("--db-path=", "--inventory-poll-burst=5", "--move-ib-interfaces=true", "--profile-provider=cloud")  # type: ignore[arg-type]
    )
    assert [w.split(":")[0] for w in warnings] == ["--db-path", "--inventory-poll-burst"] and errors == []
    _, errors = go_flag_problems(run_args("--move-ib-interfaces=false", "--profile-provider=webhook"))  # type: ignore[arg-type]
    assert [e.split(":")[0] for e in errors] == ["--move-ib-interfaces=false", "--profile-provider=webhook"]
    assert main(["--log-format", "text", "run", "--profile-provider=webhook"]) == 2


def test_the_webhook_profile_provider_flags_are_accepted() -> None:
    """dranet's ``--profile-provider webhook --webhook-url URL`` reach the daemon's config."""
    args = run_args("--profile-provider", "webhook", "--webhook-url", "unix:///run/provider.sock")
    warnings, errors = go_flag_problems(args)  # type: ignore[arg-type]
    assert (warnings, errors) == ([], [])
    config = config_from_args(args)  # type: ignore[arg-type]
    assert (config.profile_provider, config.webhook_url) == ("webhook", "unix:///run/provider.sock")
    warnings, _ = go_flag_problems(run_args("--webhook-url=http://x"))  # type: ignore[arg-type]
    assert [w.split(":")[0] for w in warnings] == ["--webhook-url"]
    with pytest.raises(SystemExit):
        run_args("--profile-provider=acme")


def test_run_refuses_a_webhook_that_serves_no_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.profile_webhook import ProfileWebhook

    hook = ProfileWebhook(capabilities={"cloudProvider": True, "profileProvider": False}).start()
    try:
        argv = ["run", "--node-name=n", "--profile-provider=webhook", f"--webhook-url={hook.url}"]
        assert main(argv) == 2
    finally:
        hook.stop()
    assert "is not a profile provider (profileProvider: false)" in capsys.readouterr().err


def dranet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "--log-level", "error", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_discover_publishes_azure_attributes_and_list_numa(nd_h100_sysfs: Path) -> None:
    base = ["discover", "--sysfs-root", str(nd_h100_sysfs), "-o", "json", "--exclude-interfaces", "eth0"]
    plain = json.loads(dranet(*base).stdout)  # a fixture and no URL: auto means none
    assert not any(k.startswith("azure.") for d in plain for k in d["attributes"])
    with MetadataServer("azure") as server:
        res = dranet(*base, "--cloud-metadata-url", server.url, "--feature-gates", "DRAListTypeAttributes=true")
    assert res.returncode == 0, res.stderr
    devices = json.loads(res.stdout)
    assert len(devices) == 8
    for dev in devices:
        attrs = dev["attributes"]
        assert attrs["azure.dra.net/placementGroupId"] == {"string": "8a2e6f1c-4b7d-4e93-9c05-3f1a7d2b6e48"}
        assert attrs["azure.dra.net/vmSize"] == {"string": "Standard_ND96isr_H100_v5"}
        # Two nodes at SLIT distance 21 and no CPU topology in the fixture (socket unknown): upstream
        # keeps the other node, after the device's own.
        own = attrs["dra.net/numaNode"]["int"]
        assert attrs["resource.kubernetes.io/numaNode"] == {"ints": [own, 1 - own]}
        assert len(attrs) <= 32
    assert ("GET", "/metadata/instance/compute?api-version=2025-11-11&format=json") in server.requests


def _numa_tree(root: Path, distances: list[str], sockets: list[int | None]) -> None:
    for node, (row, sock) in enumerate(zip(distances, sockets, strict=True)):
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "distance").write_text(row + "\n")
        if sock is not None:
            (d / "cpulist").write_text(f"{node * 4}-{node * 4 + 3}\n")
            topo = root / "devices/system/cpu" / f"cpu{node * 4}" / "topology"
            topo.mkdir(parents=True)
            (topo / "physical_package_id").write_text(f"{sock}\n")


def test_numa_list_same_socket_nearest_nodes(tmp_path: Path) -> None:
    from driver.inventory.numa_list import numa_node_list
    from driver.inventory.sysfs import SysfsReader

    # 4 nodes, 2 per socket (SNC-2): node 0's nearest are 1 (same socket, 12) ; 2 and 3 are 21 away.
    rows = ["10 12 21 21", "12 10 21 21", "21 21 10 12", "21 21 12 10"]
    _numa_tree(tmp_path / "a", rows, [0, 0, 1, 1])
    sysfs = SysfsReader(str(tmp_path / "a"))
    assert [numa_node_list(sysfs, n) for n in range(4)] == [[0, 1], [1, 0], [2, 3], [3, 2]]
    # Equal distances across sockets: the other socket's node is left out; a CPU-less node is kept.
    _numa_tree(tmp_path / "b", ["10 12 12", "12 10 12", "12 12 10"], [0, 1, None])
    assert numa_node_list(SysfsReader(str(tmp_path / "b")), 0) == [0, 2]
    assert numa_node_list(SysfsReader(str(tmp_path / "missing")), 3) == [3]
