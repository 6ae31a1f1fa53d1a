"""RDMA between two pods over their claimed NICs, on a kernel whose Soft-RoCE has network namespaces
(Linux 7.1 on): the hooks make each NIC's rxe device again inside its pod, and rping (rdma_cm),
``ib_write_bw``, ``ib_send_lat`` and an Open MPI allreduce over UCX's verbs transports (no TCP in
``UCX_TLS``, UCX_NET_DEVICES from the container's ``DRANET_RDMA_DEVICES`` as docs/workloads.md
says) run from one pod's namespace to the other's, each pod with a hostname of its own.

UCX's UD transport (which wires up its RC one) checks the destination GID of each packet it
receives; the packets of rxe devices in two namespaces fail that check and are dropped, so the
endpoints time out. ``UCX_UD_VERBS_ETH_DGID_CHECK=n`` turns the check off (docs/workloads.md).

One "host" namespace holds two veth NICs wired to each other, each with an rxe device; two pods
take one each, as RunPodSandbox does. The bytes each link of the pods' and the host's namespaces
moved are counted: the RDMA traffic is on the claimed NICs only. Both pods are then stopped and
nothing is left: no rxe device in a pod, each NIC home with its rxe device made again there.

These are emulated figures (QEMU TCG in the stock-kernel tier); they are printed, never asserted
beyond "it ran and went where claimed". Elsewhere the tests skip, naming the kernel and what it
lacks. Every device, link and namespace made here is removed after, also on failure.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.container_settings import pod_gid_index
from driver.claims.status_entries import DeviceResult
from driver.inventory import rdma as rdma_inventory
from driver.inventory.sysfs import SysfsReader
from driver.netlink import rdma_nldev
from driver.netlink.kernel_features import KernelFeatures
from driver.nic_settings import rdma
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.support import kernel

pytestmark = [pytest.mark.root, pytest.mark.kernel, pytest.mark.timeout(600)]
SUBNET = "10.77.0"
TOOLS = ("rdma", "rping", "ib_write_bw", "ib_send_lat", "mpirun", "unshare")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, which python3-mpi4py is for
ALLREDUCE_FLOATS = 1 << 20  # 4 MiB of float32 per rank
ALLREDUCE = Path(__file__).resolve().parents[2] / "examples" / "distributed_training" / "rdma_allreduce.py"
"""The example's own check, which its launcher runs over the workers' RDMA devices."""
UCX_ENV = {"UCX_LOG_LEVEL": "info"}  # the lanes UCX chose, printed; the rest is the example's to set


def _run(*args: str, netns: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=timeout)


def _capable() -> None:
    """Skip unless this kernel makes rxe devices whose socket is in their link's namespace."""
    kernel.skip_unless(kernel.features().has("rdmaNetlink"), "RDMA core (RDMA netlink)")
    kernel.skip_unless(_run("modprobe", "rdma_rxe").returncode == 0, "Soft-RoCE (the rdma_rxe module)")
    _run("modprobe", "rdma_ucm")  # rdma_cm's char device, loaded on a node by rdma-core's service
    capable, why = rdma_nldev.rxe_netns_probe()
    kernel.skip_unless(capable, f"Soft-RoCE in network namespaces (Linux 7.1's per-namespace rxe socket): {why}")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if _run(SYSTEM_PYTHON, "-c", "import mpi4py").returncode != 0:
        missing.append("mpi4py")
    kernel.skip_unless(not missing, f"use for this test without {', '.join(missing)} (make deps)")


class Statuses:
    """The hooks' status sink: what each RunPodSandbox reported."""

    def __init__(self) -> None:
        self.ready: dict[str, list[DeviceResult]] = {}

    def pod_network_ready(self, pod_uid: str, claim: PreparedClaim, results: list[DeviceResult]) -> None:
        self.ready.setdefault(pod_uid, []).extend(results)

    def pod_network_failed(self, pod_uid: str, claim: PreparedClaim, device: str, step: str, message: str) -> None:
        raise AssertionError(f"{device} {step}: {message}")


@dataclass
class Pod:
    uid: str
    netns: str
    nic: str  # the claimed NIC (its host name, kept in the pod)
    rxe: str  # its rxe device's name, the same on the host and in the pod
    ip: str
    sandbox: api.PodSandbox


@dataclass
class Bed:
    host: str
    pods: list[Pod]
    hooks: NRIHooks
    statuses: Statuses
    store: CheckpointStore
    # Each server its own port: a listen on the last server's port can find its service ID still held.
    ports: Iterator[int] = field(default_factory=lambda: itertools.count(18600))


def _link_bytes(netns: str) -> dict[str, int]:
    """rx+tx bytes of every link in ``netns`` (its sysfs, as the namespace sees it)."""
    out = _run(
        "sh",
        "-c",
        "for d in /sys/class/net/*; do echo ${d##*/} $(cat $d/statistics/rx_bytes) $(cat $d/statistics/tx_bytes); done",
        netns=netns,
    )
    found = {}
    for line in out.stdout.splitlines():
        name, rx, tx = line.split()
        found[name] = int(rx) + int(tx)
    return found


def _wait_gone(path: Path, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


def _links_in(netns: str) -> dict[str, str]:
    """rxe device -> its netdev, for the devices whose netdev is in ``netns`` (``rdma link``)."""
    out = _run("rdma", "link", "show", netns=netns).stdout
    return dict(re.findall(r"^link (\S+)/\d+ .* netdev (\S+)", out, re.M))


@pytest.fixture
def bed(netns_factory: NetnsFactory, tmp_path: Path) -> Iterator[Bed]:
    """Two pods' worth of node: two wired NICs with an rxe each in a host namespace, two pod
    namespaces, the hooks (with Soft-RoCE made in the pods). Everything goes after, pods stopped first."""
    _capable()
    host = netns_factory.netns()
    token = host[-4:]
    nic_a, nic_b = netns_factory.veth(f"ra{token}", f"rb{token}", netns=host, peer_netns=host)
    pods: list[Pod] = []
    made: list[str] = []
    statuses = Statuses()
    store = CheckpointStore(str(tmp_path / "state"), str(tmp_path / "run"))
    hooks = _hooks(host, store, statuses)
    bed = Bed(host, pods, hooks, statuses, store)
    try:
        for i, nic in enumerate((nic_a, nic_b), start=1):
            ip = f"{SUBNET}.{i}"
            subprocess.run(["ip", "-n", host, "addr", "add", f"{ip}/24", "dev", nic], check=True)
            subprocess.run(["ip", "-n", host, "link", "set", nic, "up"], check=True)
            name = f"rx{'ab'[i - 1]}{token}"
            added = _run("rdma", "link", "add", name, "type", "rxe", "netdev", nic, netns=host)
            assert added.returncode == 0, added.stderr
            made.append(name)
            netns = netns_factory.netns()
            uid = f"rxe-pod-{'ab'[i - 1]}-{token}"
            sandbox = json_format.ParseDict(pod_json(uid, f"/run/netns/{netns}"), api.PodSandbox())
            pods.append(Pod(uid, netns, nic, name, ip, sandbox))
        yield bed
    finally:
        for pod in pods:
            try:
                bed.hooks.stop_pod_sandbox(pod.sandbox)
            except Exception as exc:  # noqa: BLE001 - the rest is cleaned up whatever the hooks say
                print(f"cleanup: stop of {pod.uid}: {exc}")
        bed.hooks.close()
        for name in made:
            _run("rdma", "link", "delete", name, netns=host)


def _hooks(bed_host: str, store: CheckpointStore, statuses: Statuses) -> NRIHooks:
    """The driver's hooks over ``store`` (a new instance: the driver restarted), rxe made in the pods."""
    return NRIHooks(
        store, statuses, host_netns=f"/run/netns/{bed_host}", kernel=KernelFeatures(kernel.release()), rxe_in_pod=True
    )


def _run_pods(bed: Bed) -> list[str]:
    """RunPodSandbox of each pod with its NIC claimed (as published: its rxe device and char
    devices); the claims' UIDs."""
    sysfs = SysfsReader("/sys")
    claims = []
    for pod in bed.pods:
        found = rdma_inventory.scan_rdma(sysfs)[pod.rxe]
        chars = [{"path": c.path, "major": c.major, "minor": c.minor} for c in found.char_devices]
        devices = [{"ifname": pod.nic, "rdma_device": pod.rxe, "char_devices": chars}]
        claims.append(prepare_claim(bed.store, pod.uid, devices))
        bed.hooks.run_pod_sandbox(pod.sandbox)
    return claims


def _listening(netns: str, pid: int, device: str) -> bool:
    """Whether process ``pid`` listens with rdma_cm on ``device`` (``rdma resource show cm_id``):
    a listen on every address is one id per device, and a device whose listen the kernel could not
    register (its service ID still held by the last server on that port) rejects the connection."""
    out = _run("rdma", "resource", "show", "cm_id", netns=netns, timeout=30)
    return any(
        line.startswith(f"link {device}/") and "state LISTEN" in line and f" pid {pid} " in f"{line} "
        for line in out.stdout.splitlines()
    )


CLOCK_SAMPLING_FAILED = "Correlation coefficient r^2"
"""What perftest prints when its own measure of the CPU's clock (cycles against gettimeofday over a
few sleeps) is too noisy to convert cycles to time, and it reports nothing: under emulation on a
loaded host a vCPU descheduled mid-sample does that. The RDMA transfer itself ran."""
PERFTEST_TRIES = 3


def _perftest(
    bed: Bed, tool: str, args: list[str], a: Pod, b: Pod, gids: tuple[int, int] | None = None
) -> tuple[str, str]:
    """``tool`` (perftest, over rdma_cm; with ``gids``, the GID index of ``a``'s and ``b``'s device,
    over verbs alone, its QPs' addresses exchanged over TCP) from pod ``a`` to pod ``b`` with
    ``args``; tried again, on a new port, only when perftest could not time its own run
    (:data:`CLOCK_SAMPLING_FAILED`): every other failure fails at once."""
    cm_a, cm_b = (["-x", str(gids[0])], ["-x", str(gids[1])]) if gids else (["-R"], ["-R"])
    for attempt in range(1, PERFTEST_TRIES + 1):
        port = str(next(bed.ports))
        try:
            return _pair(
                [tool, *cm_b, "-d", b.rxe, "-p", port, *args],
                [tool, *cm_a, "-d", a.rxe, "-p", port, *args, b.ip],
                a,
                b,
            )
        except AssertionError as failed:
            if CLOCK_SAMPLING_FAILED not in str(failed) or attempt == PERFTEST_TRIES:
                raise
            print(f"{tool}: perftest could not time its run (attempt {attempt}), again", file=sys.stderr)
    raise AssertionError("unreachable")


def _pair(server: list[str], client: list[str], a: Pod, b: Pod, timeout: float = 120) -> tuple[str, str]:
    """``server`` in pod ``b``, then, once it listens on ``b``'s device, ``client`` in pod ``a``; both
    must succeed. (server, client) output. On any failure both sides' output is in the message, and the
    server never outlives the call."""
    srv = subprocess.Popen(
        ["ip", "netns", "exec", b.netns, *server], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    srv_out, cli_out, cli_rc = "", "", None
    try:
        # Under emulation a fixed head start was once too short; the listen is what the client needs.
        deadline = time.monotonic() + 60
        while not _listening(b.netns, srv.pid, b.rxe) and srv.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            cli = _run(*client, netns=a.netns, timeout=timeout)
            cli_out, cli_rc = cli.stdout + cli.stderr, cli.returncode
        except subprocess.TimeoutExpired as e:
            cli_out = f"(no exit in {timeout:.0f} s) {e.stdout or ''}{e.stderr or ''}"
        srv_out, _ = srv.communicate(timeout=timeout if cli_rc == 0 else 10)
    except subprocess.TimeoutExpired:
        srv.kill()
        srv_out = f"(no exit; killed) {srv.communicate()[0]}"
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli_rc == 0 and srv.returncode == 0, f"{' '.join(client[:1])}: client:\n{cli_out}\nserver:\n{srv_out}"
    return srv_out, cli_out


def _figure(output: str, header: str) -> list[str]:
    """The numbers of perftest's result row under the column ``header`` starts."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(header) and i + 1 < len(lines):
            return lines[i + 1].split()
    return []


def _rxe_sent(netns: str, device: str) -> int:
    """Bytes ``device`` has sent (``rdma statistic``: what rxe itself put on the wire)."""
    out = _run("rdma", "statistic", "show", "link", f"{device}/1", netns=netns).stdout
    found = re.search(r"\bsent_bytes (\d+)", out)
    return int(found.group(1)) if found else 0


def _allreduce(bed: Bed, envs: dict[str, dict[str, str]], folder: Path, timeout: float = 300) -> str:
    """The example's RDMA check (its ``rdma_allreduce.py``): an Open MPI allreduce of two ranks, one
    per pod, over UCX's verbs transports only (``pml ucx``, no TCP transport, no TCP BTL: the script
    sets them, from its container's DRANET_RDMA_DEVICES). mpirun runs in pod ``a``; its rsh agent
    starts the other rank's daemon in pod ``b``, which reaches it over the claimed NICs. Each pod
    has a hostname of its own (a UTS namespace, as a pod has). The ranks' lines and the bytes each
    rxe device sent."""
    a, b = bed.pods
    folder.mkdir(parents=True)
    where = {pod.ip: pod.netns for pod in bed.pods}
    cases = "".join(f"  {ip}) ns={ns};;\n" for ip, ns in where.items())
    (folder / "agent.sh").write_text(
        "#!/bin/sh\nhost=$1; shift\ncase $host in\n"
        f"{cases}  *) echo unknown host $host >&2; exit 1;;\nesac\n"
        'exec ip netns exec $ns unshare --uts sh -c "hostname $ns; $*"\n'
    )
    for pod in bed.pods:  # the container's environment, as the example's rank.sh restores it
        (folder / f"{pod.netns}.env").write_text(f"export DRANET_RDMA_DEVICES={envs[pod.uid]['DRANET_RDMA_DEVICES']}\n")
    (folder / "rank.sh").write_text(
        f"#!/bin/sh\n. {folder}/$(ip netns identify $$).env\n"
        f"exec {SYSTEM_PYTHON} {ALLREDUCE} --floats {ALLREDUCE_FLOATS} --rounds 10\n"
    )
    for script in ("agent.sh", "rank.sh"):
        (folder / script).chmod(0o755)
    mpirun = [
        "mpirun", "--allow-run-as-root", "-np", "2", "--host", f"{a.ip},{b.ip}",
        "--mca", "plm_rsh_agent", str(folder / "agent.sh"), "--mca", "oob_tcp_if_include", f"{a.nic},{b.nic}",
        *[arg for key in UCX_ENV for arg in ("-x", key)], "-x", "PATH", str(folder / "rank.sh"),
    ]  # fmt: skip
    sent = {pod.uid: _rxe_sent(pod.netns, pod.rxe) for pod in bed.pods}
    launch = ["ip", "netns", "exec", a.netns, "unshare", "--uts", "sh", "-c", f'hostname {a.netns}; exec "$@"', "sh"]
    proc = subprocess.Popen(
        [*launch, *mpirun],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **UCX_ENV},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = "(no exit)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the other pod's daemon and rank too
        proc.wait()
    ranks = sorted(line for line in out.splitlines() if line.startswith("rank "))
    assert proc.returncode == 0 and len(ranks) == 2, f"mpirun ({proc.returncode}):\n{out[-6000:]}"
    assert [r.split(" on ")[1].split(":")[0] for r in ranks] == [a.netns, b.netns], ranks
    lanes = sorted(set(re.findall(r"tag\(([^)]*)\)", out)))
    assert lanes and all("tcp" not in lane for lane in lanes), lanes
    moved = {pod.uid: _rxe_sent(pod.netns, pod.rxe) - sent[pod.uid] for pod in bed.pods}
    floor = 10 * ALLREDUCE_FLOATS * 4 // 2  # each rank sends at least half its vector per allreduce
    assert all(n >= floor for n in moved.values()), f"the allreduce's bytes not on the rxe devices: {moved}"
    return f"{'; '.join(r.split(': ', 1)[1] for r in ranks)}; UCX lanes {lanes}; rxe sent bytes {moved}"


def _round(bed: Bed, folder: Path) -> str:
    """Both pods started, RDMA between them, both stopped, nothing left; the figures, as a line."""
    a, b = bed.pods
    before_facts = {pod.nic: link_facts(pod.nic, bed.host) for pod in bed.pods}
    bed.statuses.ready.clear()
    claims = _run_pods(bed)
    envs: dict[str, dict[str, str]] = {}
    for pod in bed.pods:
        assert _links_in(pod.netns) == {pod.rxe: pod.nic}, "its rxe device made in the pod, on its NIC"
        record = bed.store.read(lambda s, uid=pod.uid: s.pods[uid].devices[0].records["rdma"])
        assert record["soft"] == pod.rxe and record["in_pod"] and "reason" not in record, record
        (result,) = bed.statuses.ready[pod.uid]
        assert result.no_rdma is None and result.rdma_in_pod == pod.rxe, result
        container = api.Container(id=f"c-{pod.uid}", name="main", pod_sandbox_id=pod.sandbox.id)
        adjustment = bed.hooks.create_container(pod.sandbox, container)
        assert adjustment is not None
        paths = {d.path: (d.major, d.minor) for d in adjustment.linux.devices}
        verbs = [p for p in paths if p.startswith("/dev/infiniband/uverbs")]
        assert len(verbs) == 1 and "/dev/infiniband/rdma_cm" in paths, paths
        uverbs = verbs[0].rsplit("/", 1)[1]
        assert Path(f"/sys/class/infiniband_verbs/{uverbs}/ibdev").read_text().strip() == pod.rxe
        assert Path(f"/sys/class/infiniband_verbs/{uverbs}/dev").read_text().strip() == "%d:%d" % paths[verbs[0]]
        env = {e.key: e.value for e in adjustment.env}
        assert env.get("NCCL_IB_HCA") == f"={pod.rxe}", env
        envs[pod.uid] = env

    namespaces = [bed.host, a.netns, b.netns]
    before = {ns: _link_bytes(ns) for ns in namespaces}
    port = str(next(bed.ports))
    rping = _pair(
        ["rping", "-s", "-a", b.ip, "-p", port, "-C", "5", "-S", "256"],
        ["rping", "-c", "-a", b.ip, "-p", port, "-C", "5", "-S", "256", "-v"],
        a,
        b,
    )
    pings = [line for line in rping[1].splitlines() if line.startswith("ping data:")]
    assert len(pings) == 5, rping
    size, iters = 65536, 200
    bw = _perftest(bed, "ib_write_bw", ["-s", str(size), "-n", str(iters)], a, b)
    lat = _perftest(bed, "ib_send_lat", ["-s", "64", "-n", "200"], a, b)
    after = {ns: _link_bytes(ns) for ns in namespaces}
    moved = {f"{ns}/{link}": after[ns][link] - before[ns].get(link, 0) for ns in namespaces for link in after[ns]}
    claimed = {f"{a.netns}/{a.nic}", f"{b.netns}/{b.nic}"}
    for link in claimed:
        assert moved[link] >= size * iters, (link, moved)  # the written data, at least, on each wire
    others = {link: n for link, n in moved.items() if link not in claimed}
    assert all(n == 0 for n in others.values()), f"RDMA traffic off the claimed NICs: {others}"
    mpi = _allreduce(bed, envs, folder)
    final = {ns: _link_bytes(ns) for ns in namespaces}
    # Open MPI's daemon talks to its local rank over the pod's own loopback: inside the pod, no NIC.
    own = {f"{a.netns}/lo", f"{b.netns}/lo"}
    mpi_moved = {f"{ns}/{link}": final[ns][link] - after[ns].get(link, 0) for ns in namespaces for link in final[ns]}
    off = {link: n for link, n in mpi_moved.items() if link not in claimed | own and n}
    assert not off, f"MPI traffic off the claimed NICs: {off}"

    for pod in bed.pods:
        bed.hooks.stop_pod_sandbox(pod.sandbox)
    bed.store.update(lambda s: [s.claims.pop(uid) for uid in claims])  # unprepared, as the kubelet does
    for pod in bed.pods:
        assert not _links_in(pod.netns), "no rxe device left in the pod"
        assert link_facts(pod.nic, bed.host) == before_facts[pod.nic], "the NIC home as it was"
        assert Path(f"/sys/class/infiniband/{pod.rxe}/parent").read_text().strip() == pod.nic, "made again at home"
    assert _links_in(bed.host) == {pod.rxe: pod.nic for pod in bed.pods}
    assert bed.store.read(lambda s: [uid for uid in s.pods if uid in {a.uid, b.uid}]) == []
    bw_row, lat_row = _figure(bw[1], "#bytes"), _figure(lat[1], "#bytes")
    return (
        f"rping: {len(pings)} pings of 256 B; ib_write_bw {size} B x {iters} (#bytes #iterations BW-peak BW-average"
        f" MB/s, Mpps): {bw_row}; ib_send_lat 64 B x 200 (t_min t_max t_typical t_avg usec ...): {lat_row};"
        f" bytes (rx+tx) per link: {moved}; Open MPI + UCX: {mpi}; its bytes per link: {mpi_moved}"
    )


def test_rdma_runs_between_two_pods_over_their_claimed_nics_only(bed: Bed, tmp_path: Path) -> None:
    """Each pod's rxe device is made in its namespace under the host's name, the containers get its
    char devices and NCCL_IB_HCA, the claim's RDMA condition is True; rping, ib_write_bw,
    ib_send_lat and an MPI allreduce over UCX verbs run pod to pod, their bytes on the claimed NICs
    only; after both stops nothing is left. Twice: the second time with the driver restarted (new
    hooks over the same checkpoint)."""
    assert not Path("/sys/class/infiniband", rdma_nldev.PROBE_RDMA).exists(), "the start's probe leaves no rxe device"
    first = _round(bed, tmp_path / "first")
    bed.hooks.close()
    bed.hooks = _hooks(bed.host, bed.store, bed.statuses)
    second = _round(bed, tmp_path / "second")
    print(f"\nfirst round: {first}\nafter the driver's restart: {second}")


def test_two_shares_of_one_soft_roce_nic_each_get_an_rxe_device_of_their_own(bed: Bed) -> None:
    """Two pods, each a share of the first NIC (a macvlan in the pod, the NIC and its rxe device on
    the host): each gets an rxe device of its own on its sub-interface in its namespace, named for
    its share, its char devices to the containers; ibv_rc_pingpong (50 round trips of 64 KiB) runs
    between the two shares' devices, each sending its 3.2 MB on its own, the host's device untouched;
    after both stops only the host's device is left."""
    nic = bed.pods[0]
    found = rdma_inventory.scan_rdma(SysfsReader("/sys"))[nic.rxe]
    chars = [{"path": c.path, "major": c.major, "minor": c.minor} for c in found.char_devices]
    shares: list[Pod] = []
    for i, pod in enumerate(bed.pods):
        share_id, ip = f"{i}a{secrets.token_hex(4)}", f"{SUBNET}.{21 + i}"
        config = {"opaque": [{"interface": {"type": "macvlan", "name": "net1", "addresses": [f"{ip}/24"]}}]}
        claim = [
            {"ifname": nic.nic, "rdma_device": nic.rxe, "char_devices": chars, "share_id": share_id, "config": config}
        ]
        prepare_claim(bed.store, pod.uid, claim)
        bed.hooks.run_pod_sandbox(pod.sandbox)
        name = rdma.share_device_name(nic.rxe, share_id)
        assert _links_in(pod.netns) == {name: "net1"}, "the share's own device, on its sub-interface"
        (result,) = bed.statuses.ready[pod.uid]
        assert result.no_rdma is None and result.rdma_in_pod == name, result
        container = api.Container(id=f"c-{pod.uid}", name="main", pod_sandbox_id=pod.sandbox.id)
        env = {e.key: e.value for e in bed.hooks.create_container(pod.sandbox, container).env}
        assert env.get("NCCL_IB_HCA") == f"={name}", env
        shares.append(Pod(pod.uid, pod.netns, "net1", name, ip, pod.sandbox))
    assert _links_in(bed.host).get(nic.rxe) == nic.nic, "the host's device stays on its NIC"
    a, b = shares
    # Each share's device has the GID of its own address; the host's device has them too (the kernel
    # adds an upper device's addresses to its lower's GIDs), and rdma_cm binds to the first device
    # with the address, the host's, while rxe hands a packet to the device of the link it came in on,
    # the share's: so verbs with the share's device and GID, as NCCL and UCX use them, not rdma_cm.
    gids = (pod_gid_index("/sys", a.rxe, [f"{a.ip}/24"]), pod_gid_index("/sys", b.rxe, [f"{b.ip}/24"]))
    assert None not in gids, f"no RoCE v2 GID of the shares' addresses on their devices: {gids}"
    port = str(next(bed.ports))
    sent = {pod.uid: _rxe_sent(pod.netns, pod.rxe) for pod in shares}
    pingpong = _pair(
        ["ibv_rc_pingpong", "-d", b.rxe, "-g", str(gids[1]), "-p", port, "-n", "50", "-s", "65536"],
        ["ibv_rc_pingpong", "-d", a.rxe, "-g", str(gids[0]), "-p", port, "-n", "50", "-s", "65536", b.ip],
        a,
        b,
    )
    assert "50 iters" in pingpong[1], pingpong
    moved = {pod.uid: _rxe_sent(pod.netns, pod.rxe) - sent[pod.uid] for pod in shares}
    assert all(n >= 50 * 65536 for n in moved.values()), f"each share's own device sent its half: {moved}"
    for pod in bed.pods:
        bed.hooks.stop_pod_sandbox(pod.sandbox)
        assert _links_in(pod.netns) == {}, "the share's device deleted"
    assert _links_in(bed.host) == {pod.rxe: pod.nic for pod in bed.pods}, "the host's devices as they were"
