"""bench.bench_vs_go's pure parts: arguments, the source and its build cache key, the ABCCBA order,
the intact check's comparison, and the table's rows and ratios (the run itself needs root, Go and
the control plane: ``python -m bench.bench_vs_go``)."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from bench import go_driver
from bench.bench_hooks import _nic_set
from bench.bench_vs_go import (
    ARMS,
    Compared,
    Cycles,
    Prepares,
    Scalar,
    cycle_order,
    home_diff,
    home_facts,
    keeps_its_network,
    main,
    nic_params,
    parse_args,
    render,
    rows_of,
)
from bench.floors import FLOORS, Nic
from bench.go_driver import SOURCE_ENV, GoDriver, GoSource, SourceError, cache_key, go_filter, locate
from driver.netlink.rtnl import Route
from harness.netns import NetnsFactory

# -- arguments -------------------------------------------------------------------------------------


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    args = parse_args([])
    assert (args.cycles, args.prepare, args.floors, args.go_source, args.go_v) == (60, 100, list(FLOORS), None, 0)
    assert args.driver_args == [] and not args.ipv6
    assert parse_args(["--ipv6"]).ipv6


def test_options_and_the_source_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOURCE_ENV, "/src/dranet")
    args = parse_args(["--cycles", "40", "--prepare", "40", "--floors", "batched"])
    assert (args.cycles, args.prepare, args.floors, args.go_source) == (40, 40, ["batched"], "/src/dranet")
    assert parse_args(["--go-source", "/other"]).go_source == "/other"
    assert parse_args(["--driver-args", "--no-device-metadata --log-format json"]).driver_args == [
        "--no-device-metadata",
        "--log-format",
        "json",
    ]


@pytest.mark.parametrize("argv", [["--cycles", "0"], ["--prepare", "-1"], ["--floors", "fastest"]])
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_without_a_source_it_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert f"Set {SOURCE_ENV}" in err and "go.mod" in err and "git directory" in err


def test_a_source_that_is_not_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SourceError, match="no such directory"):
        locate(str(tmp_path / "absent"))
    with pytest.raises(SourceError, match="neither a checkout"):
        locate(str(tmp_path))
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path))
    assert main([]) == 2


# -- the source and the build cache ------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env)
    return out.stdout.strip()


def _checkout(root: Path) -> Path:
    (root / "cmd" / "dranet").mkdir(parents=True)
    (root / "go.mod").write_text("module sigs.k8s.io/dranet\n")
    (root / "cmd" / "dranet" / "app.go").write_text("package main\n")
    _git("init", "-q", cwd=root)
    _git("add", "-A", cwd=root)
    _git("commit", "-qm", "x", cwd=root)
    return root


def test_a_tree_without_git_is_keyed_by_its_content(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module sigs.k8s.io/dranet\n")
    first = locate(str(tmp_path))
    assert (first.kind, first.commit) == ("tree", "") and len(first.digest) == 64
    (tmp_path / "go.mod").write_text("module sigs.k8s.io/dranet\n\ngo 1.26.0\n")
    assert locate(str(tmp_path)).digest != first.digest


def test_a_checkout_is_keyed_by_its_commit_and_by_its_changes(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "dranet")
    head = _git("rev-parse", "HEAD", cwd=root)
    clean = locate(str(root))
    assert (clean.kind, clean.commit, clean.digest) == ("tree", head, "")
    (root / "cmd" / "dranet" / "app.go").write_text("package main // changed\n")
    dirty = locate(str(root))
    assert dirty.commit == head and dirty.digest


def test_a_git_directory_builds_its_head(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "dranet")
    subprocess.run(["git", "clone", "-q", "--bare", str(root), str(tmp_path / "bare")], check=True)
    src = locate(str(tmp_path / "bare"))
    assert (src.kind, src.commit, src.digest) == ("git-dir", _git("rev-parse", "HEAD", cwd=root), "")
    dest = tmp_path / "export"
    go_driver._export(src, dest)
    assert (dest / "go.mod").is_file() and (dest / "cmd" / "dranet" / "app.go").is_file()


def test_a_git_directory_of_something_else_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "other"
    root.mkdir()
    (root / "README").write_text("x\n")
    _git("init", "-q", cwd=root)
    _git("add", "-A", cwd=root)
    _git("commit", "-qm", "x", cwd=root)
    with pytest.raises(SourceError, match="no cmd/dranet"):
        locate(str(root / ".git"))


def test_cache_key() -> None:
    commit = "f258477cbea0551b7ad239e3873a997a7a3d116b"
    assert cache_key(commit, "", "go1.26.8") == "f258477cbea0-go1.26.8"
    assert cache_key(commit, "ab" * 32, "go1.26.8") == "f258477cbea0-dirty-abababababab-go1.26.8"
    assert cache_key("", "cd" * 32, "go1.26.8") == "tree-cdcdcdcdcdcd-go1.26.8"
    assert cache_key(commit, "", "go1.27.0") != cache_key(commit, "", "go1.26.8")
    assert "/" not in cache_key(commit, "", "go1.26 X:foo/bar")
    with pytest.raises(ValueError):
        cache_key("", "", "go1.26.8")


def test_a_built_binary_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRANET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(go_driver, "_GO_VERSION", ["go1.26.8"])
    src = GoSource(tmp_path / "src", "git-dir", "f258477cbea0551b7ad239e3873a997a7a3d116b")
    binary = tmp_path / "dranet-go" / "f258477cbea0-go1.26.8" / "bin" / "dranet"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/true\n")
    assert go_driver.build(src, progress=lambda _: pytest.fail("rebuilt")) == binary


def test_the_go_driver_runs_with_private_paths(tmp_path: Path) -> None:
    d = GoDriver(
        Path("/cache/dranet"), tmp_path / "kubeconfig", "node-go", tmp_path / "go", tmp_path / "shm", "/x/nri.sock", "f"
    )
    d.port, d.nri_fd = 9999, 7
    cmd = d.command()
    assert cmd[0] == "/cache/dranet"
    assert f"--kubelet-root-dir={tmp_path / 'go' / 'kubelet'}" in cmd
    assert f"--db-path={tmp_path / 'shm' / 'dranet.db'}" in cmd
    assert {"--hostname-override=node-go", "--bind-address=127.0.0.1:9999", "--cloud-provider-hint=NONE"} <= set(cmd)
    assert "--v=0" in cmd and "--filter=f" in cmd
    assert d.registration_socket == str(tmp_path / "go" / "kubelet" / "plugins_registry" / "dra.net-reg.sock")
    env = d.environment()
    assert env["NRI_PLUGIN_SOCKET"] == "7" and env["TMPDIR"] == str(tmp_path / "go" / "tmp")


def test_go_filter() -> None:
    assert go_filter("dv12g") == (
        '"dra.net/ifName" in attributes && attributes["dra.net/ifName"].StringValue.startsWith("dv12g")'
    )


# -- the order ---------------------------------------------------------------------------------------


def test_cycles_are_mirrored_abccba() -> None:
    assert cycle_order(2, ["py", "go", "floor"]) == ["py", "go", "floor", "floor", "go", "py"]
    order = cycle_order(5, ["py", "go", *FLOORS])
    assert order[:10] == ["py", "go", *FLOORS, *reversed(FLOORS), "go", "py"]
    assert set(Counter(order).values()) == {5}


# -- the NICs ----------------------------------------------------------------------------------------


def _nic(i: int) -> Nic:
    return Nic(
        f"dv00a{i}",
        10 + i,
        f"10.100.{i}.1/24",
        Route(dst=f"10.101.{i * 16}.0/20", gateway=f"10.100.{i}.254"),
        f"net{i + 1}",
        f"192.168.{i}.2/24",
        Route(dst=f"172.{16 + i}.0.0/16", gateway=f"192.168.{i}.1"),
    )


def test_the_pod_keeps_the_nics_network() -> None:
    nic = keeps_its_network([_nic(1)])[0]
    assert (nic.pod_cidr, nic.pod_route) == ("10.100.1.1/24", Route(dst="10.101.16.0/20", gateway="10.100.1.254"))
    assert nic_params(nic) == {
        "interface": {"name": "net2", "mtu": 1400, "addresses": ["10.100.1.1/24"]},
        "routes": [{"destination": "10.101.16.0/20", "gateway": "10.100.1.254"}],
    }


def test_home_diff() -> None:
    facts = {
        "ifname": "dv00g0",
        "mtu": 1500,
        "mac": "02:00:00:00:00:01",
        "up": True,
        "addresses": ["10.102.0.1/24"],
        "routes": [("10.103.0.0/20", "10.102.0.254", "main", None)],
    }
    before = home_facts(facts)
    assert before is not None and set(before) == {"ifname", "mtu", "addresses", "routes"}
    assert home_diff(before, home_facts({**facts, "up": False, "mac": "x"})) == ""  # not compared
    back = home_facts({**facts, "mtu": 1400, "addresses": [], "routes": []})
    assert home_diff(before, back) == (
        "mtu 1500 -> 1400; addresses ['10.102.0.1/24'] -> []; "
        "routes [('10.103.0.0/20', '10.102.0.254', 'main', None)] -> []"
    )
    assert home_diff(before, home_facts(None)) == "missing"


# -- the table ---------------------------------------------------------------------------------------


def test_a_compared_row_gives_medians_p99s_and_ratios() -> None:
    row = Compared("RunPodSandbox, 4 NICs", [70.0, 72.0, 80.0], [75.0, 77.0, 90.0], [68.0, 69.0, 70.0])
    assert row.cells() == [
        "RunPodSandbox, 4 NICs",
        "3",
        "72.00 / 80.00 ms",
        "77.00 / 90.00 ms",
        "69.00 / 70.00 ms",
        "0.94 / 0.89",
        "1.04 (+3.00 ms)",
        "1.12 (+8.00 ms)",
        "ahead",
    ]
    assert Compared("x", [2.0, 3.0], [1.0, 2.0]).verdict() == "behind"
    assert Compared("x", [1.0, 1.0, 9.0], [2.0, 2.0, 3.0]).verdict() == "mixed"
    no_floor = Compared("NodeUnprepareResources", [2.0], [1.0]).cells()
    assert no_floor[4] == no_floor[6] == no_floor[7] == "–" and no_floor[5] == "2.00 / 2.00"


def test_scalar_rows() -> None:
    cpu = Scalar("CPU", 13.4, 21.9, "ms", n="40")
    assert cpu.cells() == ["CPU", "40", "13.4 ms", "21.9 ms", "–", "0.61", "–", "–", "ahead"]
    assert Scalar("RSS", 70.0, 67.9, "MB").verdict() == "behind"
    intact = Scalar("intact", 40, 0, higher_is_better=True, n="40", out_of=40)
    assert intact.cells()[2:6] == ["40/40", "0/40", "–", "–"] and intact.verdict() == "ahead"
    assert Scalar("intact", 40, 40, higher_is_better=True, out_of=40).verdict() == "level"


def test_the_table_has_every_row_of_the_issue() -> None:
    kinds = [*ARMS, *FLOORS]
    cycles = Cycles(run={k: [70.0 + i for i in range(4)] for k in kinds}, stop={k: [60.0, 61.0] for k in kinds})
    cycles.run["down-first"] = [50.0, 51.0]
    cycles.cpu = {"py": [0.02, 0.01], "go": [0.03, 0.02]}
    cycles.idle_cpu = {"py": [0.0, 0.01], "go": [0.01, 0.0]}
    cycles.intact = {"py": 4, "go": 0}
    prep = Prepares(prepare={"py": [6.0], "go": [5.0]}, unprepare={"py": [2.0], "go": [1.0]}, get=[3.0])
    assert cycles.floor_of("run", FLOORS) == ("down-first", [50.0, 51.0])
    assert cycles.cpu_ms("py") == pytest.approx(10.0) and cycles.cpu_ms("go") == pytest.approx(20.0)
    rows = rows_of(cycles, prep, {"py": 60.4, "go": 67.9}, FLOORS)
    assert [r.name for r in rows] == [
        "NodePrepareResources, 1 claim of 4 NICs",
        "NodeUnprepareResources, same claim",
        "RunPodSandbox, 4 NICs",
        "StopPodSandbox, 4 NICs",
        "driver CPU per Run+Stop cycle (mean)",
        "RSS at the end",
        "host NICs intact after stop (all 4: name, MTU, addresses, routes)",
    ]
    assert [r.verdict() for r in rows] == ["behind", "behind", "level", "level", "ahead", "ahead", "ahead"]
    table = render(rows).splitlines()
    assert len(table) == 2 + len(rows)
    assert all(line.count("|") == 10 for line in table)
    assert "| 4/4 | 0/4 |" in table[-1]
    assert [r.name for r in rows_of(cycles, None, {}, FLOORS)][0] == "RunPodSandbox, 4 NICs"


@pytest.mark.root
def test_an_ipv6_nic_set_is_configured_like_a_hosts(netns_factory: NetnsFactory) -> None:
    """``--ipv6``: each veth has its IPv6 address (already detected) and a route through a gateway
    on its link, what the drivers copy into the pod and must bring home."""
    peer, name = netns_factory.netns(), f"b6{secrets.token_hex(3)}"
    (nic,) = _nic_set(netns_factory, peer, [name], 200, ipv6=True)
    assert nic.host_route.family == socket.AF_INET6
    assert (nic.host_cidr, nic.host_route.dst, nic.host_route.gateway) == (
        "fdc8:0:0:0::1/64",
        "fdc9:0:0::/60",
        "fdc8:0:0:0::fe",
    )
    show = subprocess.run(["ip", "-j", "-6", "addr", "show", name], capture_output=True, text=True, check=True)
    addrs = [
        (a["local"], a.get("tentative", False))
        for a in json.loads(show.stdout)[0]["addr_info"]
        if a["scope"] == "global"
    ]
    assert addrs == [("fdc8::1", False)]
    show = subprocess.run(["ip", "-j", "-6", "route", "show", "dev", name], capture_output=True, text=True, check=True)
    assert [(r["dst"], r.get("gateway")) for r in json.loads(show.stdout) if r["dst"] == "fdc9::/60"] == [
        ("fdc9::/60", "fdc8::fe")
    ]
