"""The guest node's pure parts: the pods' manifests and script, the spec the host hands the guest.
(The node itself runs under QEMU with `make guest-node`, outside `make test`: docs/testing.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from devcluster.builders.components import NodeBinaries
from devcluster.guest_node.host import Guest, figures, only_tools_failed
from devcluster.guest_node.spec import RAIL_MACS, GuestSpec, PodPair, pod_script


def test_each_pod_claims_one_rail_nic_with_its_own_address() -> None:
    pair = PodPair(round=2, node_name="guest", image="img")
    docs = pair.manifests()
    claims = [d for d in docs if d["kind"] == "ResourceClaim"]
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert [c["metadata"]["name"] for c in claims] == ["rdma-server-2", "rdma-client-2"]
    for claim, mac in zip(claims, RAIL_MACS, strict=True):
        [request] = claim["spec"]["devices"]["requests"]
        assert f'mac == "{mac}"' in request["exactly"]["selectors"][0]["cel"]["expression"]
    addresses = [c["spec"]["devices"]["config"][0]["opaque"]["parameters"]["interface"]["addresses"] for c in claims]
    assert addresses == [["10.77.0.1/24"], ["10.77.0.2/24"]]
    for pod, claim in zip(pods, claims, strict=True):
        assert pod["spec"]["resourceClaims"] == [{"name": "nic", "resourceClaimName": claim["metadata"]["name"]}]
        [container] = pod["spec"]["containers"]
        assert container["resources"]["claims"] == [{"name": "nic"}]
        # The host's tools and verbs providers read-only; only the results folder is writable.
        writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
        assert writable == ["/shared"]
        assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "guest"}


def _fake_tool(folder: Path, name: str, fail_times: int) -> None:
    """A stand-in for a perftest tool: fails ``fail_times`` times (the server not listening yet), then succeeds."""
    count = folder / f"{name}.count"
    (folder / name).write_text(
        f"#!/bin/sh\nn=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}\n"
        f'[ "$n" -ge {fail_times} ] || exit 3\necho ok "$@"\n'
    )
    (folder / name).chmod(0o755)


def test_client_tries_again_while_it_fails_and_records_the_real_status(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    _fake_tool(tools, "ib_write_bw", 2)
    _fake_tool(tools, "ib_send_lat", 0)
    (tools / "rping").write_text("#!/bin/sh\nexit 7\n")  # never connects
    (tools / "rping").chmod(0o755)
    (tools / "sleep").write_text("#!/bin/sh\n")  # no waiting in the test
    (tools / "sleep").chmod(0o755)
    out, server = tmp_path / "out", tmp_path / "server"
    server.mkdir()
    for tool in ("ib_write_bw", "ib_send_lat", "rping"):
        (server / f"{tool}.listening").touch()  # what the server pod writes once the kernel lists its listen
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "DRANET_RDMA_DEVICES": "rxe0,rxe1", "NCCL_IB_HCA": "=rxe0"}
    done = subprocess.run(["sh", "-c", pod_script("client", str(out), "10.77.0.1", str(server))], env=env, timeout=60)
    assert done.returncode == 0
    assert (out / "ib_write_bw.rc").read_text().strip() == "0"
    assert (out / "ib_write_bw.tries").read_text().strip() == "3"
    assert "-d rxe0" in (out / "ib_write_bw.txt").read_text() and "10.77.0.1" in (out / "ib_write_bw.txt").read_text()
    assert (out / "ib_send_lat.tries").read_text().strip() == "1"
    # A tool that never succeeds: its own status after the last try, not the loop's.
    assert (out / "rping.rc").read_text().strip() == "7"
    assert (out / "rping.tries").read_text().strip() == "10"
    assert "DRANET_RDMA_DEVICES=rxe0,rxe1" in (out / "env.txt").read_text()


def test_spec_survives_the_trip_through_the_run_folder(tmp_path: Path) -> None:
    nb = NodeBinaries(*(Path(f"/b/{n}") for n in ("kubelet", "kubectl", "containerd", "shim", "ctr", "runc", "cni")))
    spec = GuestSpec.of("guest-7-3", "g73", [("localhost/pause:dev", "/c/pause.tar")], nb)
    spec.save(tmp_path / "spec.json")
    back = GuestSpec.load(tmp_path / "spec.json")
    assert back == spec
    assert back.binaries() == nb


def test_server_marks_each_tool_listening_once_the_kernel_lists_its_listen(tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("ib_write_bw", "ib_send_lat", "rping"):
        (tools / tool).write_text(f"#!/bin/sh\ntouch {tmp_path}/{tool}.ran\nsleep 0.5\necho served\n")
        (tools / tool).chmod(0o755)
    # The kernel's listing: a listen on each tool's port, once that tool runs.
    (tools / "rdma").write_text(
        "#!/bin/sh\n"
        f"[ -e {tmp_path}/ib_write_bw.ran ] && echo 'link rxe2/1 cm-idn 0 state LISTEN ps TCP src-addr 0.0.0.0:18515'\n"
        f"[ -e {tmp_path}/ib_send_lat.ran ] && echo 'link rxe2/1 cm-idn 1 state LISTEN ps TCP src-addr 0.0.0.0:18516'\n"
        f"[ -e {tmp_path}/rping.ran ] && echo 'link rxe2/1 cm-idn 2 state LISTEN ps TCP src-addr 0.0.0.0:18517'\n"
        "exit 0\n"
    )
    (tools / "rdma").chmod(0o755)
    out = tmp_path / "server"
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "DRANET_RDMA_DEVICES": "rxe2"}
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", pod_script("server", str(out), "10.77.0.1", str(out))], env=env, timeout=60)
    assert done.returncode == 0
    assert time.monotonic() - started < 30  # each marker came from the listing, not from a timeout
    for tool in ("ib_write_bw", "ib_send_lat", "rping"):
        assert (out / f"{tool}.listening").exists()
        assert (out / f"{tool}.rc").read_text().strip() == "0"
        assert (out / f"{tool}.txt").read_text().strip() == "served"


def test_a_guest_that_does_not_answer_has_its_qemu_killed(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    # Stands for QEMU: its command line names the run's console file, as QEMU's -serial does. One
    # process each (no shell), so that nothing outlives the test.
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    stand_in = subprocess.Popen([*sleeper, f"file:{folder / 'console.log'}"])
    other = subprocess.Popen([*sleeper, f"file:{tmp_path / 'other' / 'console.log'}"])
    try:
        killed = Guest(folder, None, None, 1).kill()  # type: ignore[arg-type]
        assert killed == [stand_in.pid]
        assert stand_in.wait(timeout=60) == -9
        assert other.poll() is None, "another run's QEMU is not this one's to kill"
    finally:
        for p in (stand_in, other):
            p.kill()
            p.wait()


def test_a_round_run_again_has_pods_claims_and_results_of_its_own() -> None:
    again = PodPair(round=1, node_name="guest", image="img", attempt=2)
    docs = again.manifests()
    assert {d["metadata"]["name"] for d in docs} == {"rdma-server-1-2", "rdma-client-1-2"}
    for pod in (d for d in docs if d["kind"] == "Pod"):
        script = json.dumps(pod)
        assert "/results/1-2" in script and "/results/1 " not in script and "/results/1/" not in script


def test_only_the_tools_exit_statuses_let_a_round_run_again() -> None:
    tools = ["client: ib_write_bw exit 1: Unexpected CM event", "server: ib_write_bw exit 143: "]
    logs = ["round 1: the guest while the pods ran:\n...", "round 1: the driver's log:\n..."]
    assert only_tools_failed([*tools, *logs], 1)
    assert not only_tools_failed([], 1)
    assert not only_tools_failed(logs, 1), "a failure needs a failed check"
    assert not only_tools_failed([*tools, "client: char devices []"], 1), "the driver's part failed"
    assert not only_tools_failed([*tools, "claimed NIC eth0 moved only 74 bytes"], 1)
    assert not only_tools_failed(["round 1: pods {'server': 'Failed'}", "eth2 is not home"], 1)


def test_the_figures_are_the_last_tries(tmp_path: Path) -> None:
    client = tmp_path / "client"
    client.mkdir()
    (client / "ib_write_bw.txt").write_text(
        "--- try 1\n #bytes #iterations BW peak[MB/sec] BW average[MB/sec]\n"
        "Unexpected CM event bl blka 8\n--- try 2\n"
        " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate\n 65536 512 13.10 12.78 0.000204\n"
    )
    (client / "rping.txt").write_text("--- try 1\nping data: a\n--- try 2\n" + "ping data: b\n" * 10)
    out = figures(tmp_path)
    assert out["ib_write_bw_MBps"] == 12.78 and out["rping_pings"] == 10
