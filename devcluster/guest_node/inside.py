"""The guest half of a real node on a stock kernel: what runs inside QEMU as the guest's command.

The guest is this machine's userland over 9p (:mod:`harness.guest`), so every binary is the
host's cached build at the same path; what it needs besides is in ``spec.json`` of the run folder
(``/run/guest``), written by the host half (:mod:`devcluster.guest_node.__main__`):

1. the uplink (QEMU's user network: ``10.0.2.15``, the host's loopback is ``10.0.2.2``) up, every
   other NIC given a Soft-RoCE device (``rdma link add``), as rdma-core's service does on a node;
2. cgroup v2 mounted with its controllers on, a tmpfs for containerd's root (its overlay snapshots
   cannot sit on the guest's own overlay root), the images imported;
3. containerd (NRI on), the kubelet (joined to the host's apiserver), the driver (a process of the
   node, as ``harness.driver_process`` runs it: no registry to pull its image from);
4. then it answers the host's requests (``control/cmd-<n>``: ``counters``, ``kill-driver``,
   ``stop``) until ``stop``, and stops everything it started, in reverse order.

Each step's outcome is a line of ``node.log``; a failure writes ``failed`` with the reason and
powers the guest off (the host half sees it and says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import yaml

from devcluster.builders.binaries import K8S_RELEASE
from devcluster.builders.images import ImageArchive, import_image
from devcluster.cluster.node_config import write_node_configs
from devcluster.cluster.node_layout import IN_NODE, NodeLayout
from devcluster.guest_node.spec import (
    CONTROL,
    GUEST_IP,
    HOST_FROM_GUEST,
    UPLINK_MAC,
    GuestSpec,
    link_counters,
)
from harness.driver_process import DriverProcess

GUEST = Path("/run/guest")
BASE = Path("/var/lib/dranet-guest")
"""A tmpfs: containerd's root, the configs, the driver's state and kubelet root."""
POLL_S = 0.5
GUEST_NRI_REQUEST_TIMEOUT_S = 30
"""containerd's time for one NRI call in the guest. Under TCG on a busy 2-core host the whole guest
slows tenfold or more at times (one RunPodSandbox took 17 s, a device scan 9.8 s): containerd then
drops the driver and starts pods without their devices, which tells nothing about RDMA between
pods. The 2 s a node gives is held by the tiers that run containerd on this machine's kernel."""


def write_whole(path: Path, text: str) -> None:
    """Written under a hidden name, then renamed: the host polls for the name over 9p and reads
    the file at once, so it must never see it half written."""
    hidden = path.with_name("." + path.name)
    hidden.write_text(text)
    hidden.rename(path)


def say(msg: str) -> None:
    with open(GUEST / "node.log", "a") as log:
        log.write(f"{time.monotonic():9.1f} {msg}\n")


def sh(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({out.returncode}): {(out.stderr or out.stdout).strip()}")
    return out


def links() -> dict[str, str]:
    """Every link of the guest's own namespace: name -> MAC."""
    found = {}
    for d in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            found[d.name] = (d / "address").read_text().strip()
    return found


def uplink_up() -> str:
    """QEMU's user network on the NIC with :data:`UPLINK_MAC`; its name."""
    sh("modprobe", "virtio_net")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        name = next((n for n, mac in links().items() if mac == UPLINK_MAC), "")
        if name:
            break
        time.sleep(0.2)
    else:
        raise RuntimeError(f"no NIC with the uplink's MAC {UPLINK_MAC}: {links()}")
    sh("ip", "addr", "add", f"{GUEST_IP}/24", "dev", name)
    sh("ip", "link", "set", name, "up")
    sh("ip", "route", "add", "default", "via", HOST_FROM_GUEST)
    return name


def soft_roce(uplink: str) -> dict[str, str]:
    """An rxe device on every Ethernet NIC but the uplink (rdma-core's service on a RoCE node);
    NIC -> device."""
    for module in ("rdma_rxe", "rdma_ucm"):
        sh("modprobe", module)
    made = {}
    for i, name in enumerate(sorted(n for n in links() if n not in (uplink, "lo"))):
        sh("ip", "link", "set", name, "up")
        sh("rdma", "link", "add", f"rxe{i}", "type", "rxe", "netdev", name)
        made[name] = f"rxe{i}"
    return made


def cgroups() -> None:
    """cgroup v2 with the controllers the kubelet needs on for its children."""
    root = Path("/sys/fs/cgroup")
    if not (root / "cgroup.controllers").exists():
        sh("mount", "-t", "cgroup2", "cgroup2", str(root))
    wanted = set((root / "cgroup.controllers").read_text().split()) & {"cpuset", "cpu", "io", "memory", "pids"}
    (root / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))


def write_configs(spec: GuestSpec, layout: NodeLayout) -> Path:
    """The dev cluster's node configs (containerd, CNI, resolver, kubelet), then this guest's own in
    the kubelet's and the resolver's (cgroup root, address, DNS); the kubelet's config path."""
    node = layout.node(0)
    write_node_configs(
        node, spec.binaries(), K8S_RELEASE.fail_cgroup_v1, K8S_RELEASE.feature_gates, GUEST_NRI_REQUEST_TIMEOUT_S
    )
    node.resolv_conf.write_text(f"nameserver {spec.dns}\n")
    cfg = yaml.safe_load(node.kubelet_config.read_text())
    cfg |= {"cgroupRoot": "/", "address": "0.0.0.0", "clusterDNS": [spec.dns]}
    node.kubelet_config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return node.kubelet_config


class Daemons:
    """What this guest started, stopped in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.driver: DriverProcess | None = None

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = open(GUEST / f"{name}.log", "ab")  # the daemon's, closed with the guest
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)  # fmt: skip
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        if self.driver is not None:
            self.driver.stop()
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            say(f"{name} stopped ({proc.returncode})")


def wait_socket(path: str, proc: subprocess.Popen[bytes], within: float) -> None:
    deadline = time.monotonic() + within
    while not Path(path).is_socket():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no socket at {path} (exit {proc.poll()})")
        time.sleep(0.2)


def requests() -> Iterator[tuple[Path, str]]:
    """The host's requests, in order, as they come: (file, word)."""
    seen = 0
    while True:
        nxt = GUEST / CONTROL / f"cmd-{seen}"
        if nxt.exists():
            seen += 1
            yield nxt, nxt.read_text().strip()
        else:
            time.sleep(POLL_S)


SNAPSHOT = (
    "rdma link show",
    "rdma resource show cm_id",
    "rdma resource show qp",
    "ip -br link",
    'for ns in $(ls /var/run/netns); do echo "netns $ns:"; ip -n $ns -br addr; done',
    "dmesg | tail -n 40",
)
"""What the guest shows of its RDMA and links when a round takes too long (the pods' namespaces too)."""


def snapshot() -> str:
    parts = []
    for cmd in SNAPSHOT:
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        parts.append(f"$ {cmd}\n{out.stdout}{out.stderr}")
    return "\n".join(parts)


def serve(spec: GuestSpec, daemons: Daemons, nics: dict[str, str]) -> None:
    for path, word in requests():
        reply: dict[str, object] = {"request": word}
        if word == "counters":
            reply["links"], reply["macs"] = link_counters(), links()
            reply["rdma"] = sh("rdma", "link", "show", check=False).stdout
        elif word == "kill-driver":
            assert daemons.driver is not None
            daemons.driver.stop(signal.SIGKILL)
            start = time.monotonic()
            daemons.driver.start(timeout=spec.driver_timeout_s)
            reply["restart_s"] = round(time.monotonic() - start, 2)
            say(f"driver killed and started again in {reply['restart_s']} s")
        elif word == "snapshot":
            reply["text"] = snapshot()
        elif word != "stop":
            reply["error"] = f"unknown request {word!r}"
        write_whole(path.with_name(path.name.replace("cmd-", "done-")), json.dumps(reply))
        if word == "stop":
            return


def main() -> int:
    spec = GuestSpec.load(GUEST / "spec.json")
    (GUEST / CONTROL).mkdir(exist_ok=True)
    daemons = Daemons()
    try:
        start = time.monotonic()
        uplink = uplink_up()
        nics = soft_roce(uplink)
        say(f"uplink {uplink}; Soft-RoCE {nics}")
        cgroups()
        BASE.mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "size=2g", "dranet-guest", str(BASE))
        sh("mount", "--make-rshared", "/")
        layout = NodeLayout(name=spec.layout_name, root=BASE, nodes=1)
        kubelet_cfg = write_configs(spec, layout)
        binaries = spec.binaries()
        # RDMA memory registration counts against RLIMIT_MEMLOCK (a node's containerd unit has it unlimited).
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        env = dict(os.environ, PATH=":".join([*binaries.path_dirs, os.environ.get("PATH", "")]))
        node = layout.node(0)
        containerd = daemons.spawn(
            "containerd", [str(binaries.containerd), "--config", str(node.containerd_config)], env
        )
        wait_socket(IN_NODE.containerd_socket, containerd, 120)
        say(f"containerd up at {time.monotonic() - start:.1f} s")
        for ref, path in spec.images:
            import_image(binaries.ctr, IN_NODE.containerd_socket, ImageArchive(ref, Path(path)))
        say(f"images imported at {time.monotonic() - start:.1f} s")
        driver = DriverProcess(
            kubeconfig=GUEST / "guest.kubeconfig",
            node_name=spec.node_name,
            sysfs_root=Path("/sys"),
            workdir=BASE / "driver",
            nri_socket=IN_NODE.nri_socket,
            exclude_interfaces=uplink,
            extra_args=["--cdi-dir", IN_NODE.cdi_dir],
        )
        kubelet_root = driver.kubelet_root
        kubelet_root.mkdir(parents=True, exist_ok=True)
        driver.log_path.symlink_to(GUEST / "driver.log")  # the host reads it live, and after a crash
        daemons.spawn(
            "kubelet",
            [
                str(binaries.kubelet),
                f"--config={kubelet_cfg}",
                f"--kubeconfig={GUEST / 'guest.kubeconfig'}",
                f"--hostname-override={spec.node_name}",
                f"--node-ip={GUEST_IP}",
                f"--root-dir={kubelet_root}",
                "--v=2",
            ],
            env,
        )
        daemons.driver = driver
        driver.start(timeout=spec.driver_timeout_s)
        say(f"kubelet and driver up at {time.monotonic() - start:.1f} s")
        write_whole(GUEST / "node-up", json.dumps({"seconds": round(time.monotonic() - start, 1), "nics": nics,
                                                   "uplink": uplink}))  # fmt: skip
        serve(spec, daemons, nics)
        return 0
    except Exception:  # noqa: BLE001 - the host half reads why from the run folder
        (GUEST / "failed").write_text(traceback.format_exc())
        return 1
    finally:
        daemons.stop()


if __name__ == "__main__":
    sys.exit(main())
