"""RDMA between two pods over their claimed NICs, on a kernel whose Soft-RoCE has network namespaces
(Linux 7.1 on): the hooks make each NIC's rxe device again inside its pod, and rping (rdma_cm),
``ib_write_bw`` and ``ib_send_lat`` run from one pod's namespace to the other's.

One "host" namespace holds two veth NICs wired to each other, each with an rxe device; two pods
take one each, as RunPodSandbox does. The bytes each link of the pods' and the host's namespaces
moved are counted: the RDMA traffic is on the claimed NICs only. Both pods are then stopped and
nothing is left: no rxe device in a pod, each NIC home with its rxe device made again there.

These are emulated figures (QEMU TCG in the stock-kernel tier); they are printed, never asserted
beyond "it ran and went where claimed". Elsewhere the tests skip, naming the kernel and what it
lacks. Every device, link and namespace made here is removed after, also on failure.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import json_format

from dranet_proto import nri_v1alpha1_pb2 as api
from driver.checkpoint.state import PreparedClaim
from driver.checkpoint.store import CheckpointStore
from driver.claims.status_entries import DeviceResult
from driver.inventory import rdma as rdma_inventory
from driver.inventory.sysfs import SysfsReader
from driver.netlink import rdma_nldev
from driver.netlink.kernel_features import KernelFeatures
from driver.nri.hooks import NRIHooks
from harness.netns import NetnsFactory
from harness.nri import link_facts, pod_json, prepare_claim
from tests.support import kernel

pytestmark = [pytest.mark.root, pytest.mark.kernel, pytest.mark.timeout(600)]
SUBNET = "10.77.0"
TOOLS = ("rdma", "rping", "ib_write_bw", "ib_send_lat")


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
    kernel.skip_unless(not missing, f"use for this test without {', '.join(missing)} (rdma-core, perftest)")


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


def _round(bed: Bed) -> str:
    """Both pods started, RDMA between them, both stopped, nothing left; the figures, as a line."""
    a, b = bed.pods
    before_facts = {pod.nic: link_facts(pod.nic, bed.host) for pod in bed.pods}
    bed.statuses.ready.clear()
    claims = _run_pods(bed)
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
    port = str(next(bed.ports))
    bw = _pair(
        ["ib_write_bw", "-R", "-d", b.rxe, "-p", port, "-s", str(size), "-n", str(iters)],
        ["ib_write_bw", "-R", "-d", a.rxe, "-p", port, "-s", str(size), "-n", str(iters), b.ip],
        a,
        b,
    )
    port = str(next(bed.ports))
    lat = _pair(
        ["ib_send_lat", "-R", "-d", b.rxe, "-p", port, "-s", "64", "-n", "200"],
        ["ib_send_lat", "-R", "-d", a.rxe, "-p", port, "-s", "64", "-n", "200", b.ip],
        a,
        b,
    )
    after = {ns: _link_bytes(ns) for ns in namespaces}
    moved = {f"{ns}/{link}": after[ns][link] - before[ns].get(link, 0) for ns in namespaces for link in after[ns]}
    claimed = {f"{a.netns}/{a.nic}", f"{b.netns}/{b.nic}"}
    for link in claimed:
        assert moved[link] >= size * iters, (link, moved)  # the written data, at least, on each wire
    others = {link: n for link, n in moved.items() if link not in claimed}
    assert all(n == 0 for n in others.values()), f"RDMA traffic off the claimed NICs: {others}"

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
        f" bytes (rx+tx) per link: {moved}"
    )


def test_rdma_runs_between_two_pods_over_their_claimed_nics_only(bed: Bed) -> None:
    """Each pod's rxe device is made in its namespace under the host's name, the containers get its
    char devices and NCCL_IB_HCA, the claim's RDMA condition is True; rping, ib_write_bw and
    ib_send_lat run pod to pod, their bytes on the claimed NICs only; after both stops nothing is
    left. Twice: the second time with the driver restarted (new hooks over the same checkpoint)."""
    assert not Path("/sys/class/infiniband", rdma_nldev.PROBE_RDMA).exists(), "the start's probe leaves no rxe device"
    first = _round(bed)
    bed.hooks.close()
    bed.hooks = _hooks(bed.host, bed.store, bed.statuses)
    second = _round(bed)
    print(f"\nfirst round: {first}\nafter the driver's restart: {second}")
