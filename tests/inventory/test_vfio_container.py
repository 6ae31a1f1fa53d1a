"""A real container drives a VF that a claim put on vfio-pci: containerd applies the claim's CDI
device, and the process in it opens the VF's VFIO group, attaches it to a VFIO container with an
IOMMU and gets the VF's device fd, as DPDK and QEMU (KubeVirt) begin.

The SR-IOV guests only (``tests/inventory/test_sriov_vfs.py``'s PFs, an emulated IOMMU): the claim
is prepared by the real Preparer, its CDI spec put where containerd's CDI registry reads
(``/var/run/cdi``, the guest's own tmpfs), and ``ctr run --device <CDI name>`` (containerd's own
CDI injection, what its CRI plugin does for the kubelet) runs the check in a container whose root
is the guest's, under runc with cgroup v2's device filter: without the CDI device's nodes and
their cgroup rules the container could not open them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devcluster.builders.components import build_containerd
from driver.inventory.names import pci_device_name
from harness.fake_apiserver import FakeAPIServer
from tests.inventory.test_sriov_vfs import (  # noqa: F401 - the fixture
    PCI,
    _home_as_before,
    _netdev,
    _scan,
    _vf,
    _vf_settings,
    pfs,
    vfio_preparer,
)

pytestmark = [pytest.mark.root, pytest.mark.kernel]

CDI_DIR = Path("/var/run/cdi")
"""One of the CDI registry's default directories, which ``ctr`` reads."""
CGROUP = Path("/sys/fs/cgroup")

# What runs in the container: <linux/vfio.h>'s ioctls (_IO(';', 100 + n)), the way DPDK's
# rte_vfio and QEMU's vfio-pci open a VF. Prints what it found as JSON.
IN_CONTAINER = r"""
import fcntl, json, os, struct
env = {k: v for k, v in os.environ.items() if k.startswith("DRANET_VFIO_")}
group = next(v for k, v in env.items() if k.startswith("DRANET_VFIO_GROUP_"))
bdf = next(v for k, v in env.items() if k.startswith("DRANET_VFIO_DEVICE_"))
container = os.open("/dev/vfio/vfio", os.O_RDWR)
api = fcntl.ioctl(container, 0x3B64)  # VFIO_GET_API_VERSION
fd = os.open(group, os.O_RDWR)
flags = struct.unpack("II", fcntl.ioctl(fd, 0x3B67, struct.pack("II", 8, 0)))[1]  # VFIO_GROUP_GET_STATUS
fcntl.ioctl(fd, 0x3B68, struct.pack("i", container))  # VFIO_GROUP_SET_CONTAINER
iommu = 3 if fcntl.ioctl(container, 0x3B65, 3) else 1  # VFIO_CHECK_EXTENSION: TYPE1v2, else TYPE1
fcntl.ioctl(container, 0x3B66, iommu)  # VFIO_SET_IOMMU
device = fcntl.ioctl(fd, 0x3B6A, bytearray(bdf.encode() + b"\0"), True)  # VFIO_GROUP_GET_DEVICE_FD
info = struct.unpack("6I", fcntl.ioctl(device, 0x3B6B, struct.pack("6I", 24, 0, 0, 0, 0, 0)))  # VFIO_DEVICE_GET_INFO
print(json.dumps({"env": env, "api": api, "viable": bool(flags & 1), "iommu": iommu, "device_fd": device,
                  "pci": bool(info[1] & 2), "regions": info[2], "dev": sorted(os.listdir("/dev/vfio")),
                  "iommufd": os.path.exists("/dev/iommu") and os.close(os.open("/dev/iommu", os.O_RDWR)) is None}))
"""


@dataclass
class Containerd:
    """A containerd of the test's own (no CRI, no NRI) and how to run ``ctr`` against it."""

    socket: str
    ctr: Path
    env: dict[str, str]

    def run(self, rootfs: Path, cdi_device: str, name: str, *command: str) -> subprocess.CompletedProcess[str]:
        args = [str(self.ctr), "-a", self.socket, "run", "--rm", "--rootfs", "--device", cdi_device]
        return subprocess.run(
            [*args, str(rootfs), name, *command], capture_output=True, text=True, env=self.env, timeout=120
        )


def _wait(what: str, done: object, within: float) -> None:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.2)
    assert done(), f"{what} within {within:.0f} s"  # type: ignore[operator]


@pytest.fixture
def containerd(pfs: list[str], tmp_path: Path) -> Iterator[Containerd]:  # noqa: F811 - the fixture
    """containerd on the guest's cgroup v2, its root under the test's folder, stopped after."""
    bin_dir = build_containerd(progress=lambda _msg: None)  # `make binaries` built it; the guest reuses it
    if not (CGROUP / "cgroup.controllers").exists():
        subprocess.run(["mount", "-t", "cgroup2", "cgroup2", str(CGROUP)], check=True)
    state = Path("/run/dranet-vfio-containerd")
    socket = str(state / "containerd.sock")
    config = tmp_path / "containerd.toml"
    config.write_text(
        "version = 3\n"
        f"root = {json.dumps(str(tmp_path / 'containerd'))}\n"
        f"state = {json.dumps(str(state))}\n"
        'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime",'
        ' "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]\n'
        f"[grpc]\n  address = {json.dumps(socket)}\n"
    )
    runc = Path(shutil.which("runc") or "/usr/sbin/runc")
    path = os.pathsep.join([str(bin_dir), str(runc.parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path}
    log = open(tmp_path / "containerd.log", "wb")
    daemon = subprocess.Popen([str(bin_dir / "containerd"), "--config", str(config)], stdout=log, stderr=log, env=env)
    try:
        _wait("containerd's socket", lambda: os.path.exists(socket) or daemon.poll() is not None, within=60)
        assert daemon.poll() is None, (tmp_path / "containerd.log").read_text()[-3000:]
        yield Containerd(socket, bin_dir / "ctr", env)
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


def test_a_container_drives_the_vf_its_claim_put_on_vfio_pci(
    pfs: list[str],  # noqa: F811 - the fixture
    containerd: Containerd,
    tmp_path: Path,
) -> None:
    """The claim prepared with ``sriov.driver: vfio-pci`` and, as a KubeVirt VM's VF has them, a MAC
    and a VLAN through the PF; containerd runs a container with the claim's CDI device: it has
    ``/dev/vfio/<group>`` and ``/dev/vfio/vfio``, the variables naming the group and the VF's PCI
    address, and it gets the VF's device fd (a PCI device with its regions) through a VFIO container
    with an IOMMU. After unprepare the VF is on igbvf again and its PF settings as before."""
    subprocess.run(["modprobe", "vfio-pci"], check=True, capture_output=True)
    subprocess.run(["modprobe", "iommufd"], check=False, capture_output=True)  # 6.2 on: /dev/iommu given too
    bdf = _vf(pfs[1], 1)
    devices = {d.name: d for d in _scan().values()}
    name = pci_device_name(bdf)
    group = devices[name].attributes["dra.net/iommuGroup"]
    mac = "02:d7:00:00:03:01"
    before = _vf_settings(pfs[1], 1)
    uid = "vfio-container-1"
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    # The container's root is the guest's own (a bind of the root mount only: the container gets
    # its own /proc, /dev and /sys from runc), so its Python is the one that runs the check.
    subprocess.run(["mount", "--bind", "/", str(rootfs)], check=True)
    spec_copy: Path | None = None
    with FakeAPIServer() as api:
        sriov = {"driver": "vfio-pci", "vlan": 100, "mac": mac}
        preparer, ref, paths = vfio_preparer(api, tmp_path, devices, name, uid, sriov)
        answer = preparer.prepare_now([ref])[uid]
        try:
            assert answer.error == ""
            pf_says = _vf_settings(pfs[1], 1)
            assert (pf_says["vlan"], pf_says["mac"]) == (100, mac), pf_says
            [written] = Path(paths.cdi_dir).iterdir()
            spec = json.loads(written.read_text())
            cdi_device = f"{spec['kind']}={spec['devices'][0]['name']}"
            CDI_DIR.mkdir(parents=True, exist_ok=True)
            spec_copy = CDI_DIR / written.name
            shutil.copyfile(written, spec_copy)
            done = containerd.run(rootfs, cdi_device, "vfio-check", sys.executable, "-c", IN_CONTAINER)
            assert done.returncode == 0, f"ctr run: {done.stdout}{done.stderr}"
            seen = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"in the container ({cdi_device}): {seen}")
        finally:
            if spec_copy is not None:
                spec_copy.unlink(missing_ok=True)
            subprocess.run(["umount", str(rootfs)], check=False)
            unprepared = preparer.unprepare_now([ref])
    assert seen["dev"] == sorted([str(group), "vfio"]), seen
    assert seen["iommufd"] == Path("/sys/class/misc/iommu").exists(), "/dev/iommu opened where the kernel has it"
    assert bdf in seen["env"].values() and f"/dev/vfio/{group}" in seen["env"].values(), seen["env"]
    assert seen["api"] == 0 and seen["viable"], seen
    assert seen["device_fd"] >= 0 and seen["pci"] and seen["regions"] >= 7, seen  # BARs, ROM, config space
    assert unprepared == {uid: ""}
    assert (PCI / bdf / "driver").resolve().name == "igbvf"
    _wait("the VF's netdev again", lambda: _netdev(bdf) is not None, within=10)
    now = _vf_settings(pfs[1], 1)
    assert _home_as_before(now, before, _netdev(bdf) or ""), (now, before)
