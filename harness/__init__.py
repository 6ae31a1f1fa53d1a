"""The harness tests and benchmarks share: the driver as a process (`driver_process`, and the NRI plugin
alone in `nri`), the NRI runtime side (`nri`, a Go program in ``nri_harness/``), throwaway namespaces and
veths (`netns`), sysfs fixture trees (`sysfs`), a client that plays the kubelet (`kubelet_client`), a
stand-in kube-apiserver (`fake_apiserver`); here, a tiny sysfs tree and process clean-up."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "distributed_training"


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process, newest first (SIGKILL after 10 s), reap it and close its stdout."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def load_example_module(name: str) -> ModuleType:
    """A module of examples/distributed_training by file path: the example ships as loose files
    in a ConfigMap, not as a package."""
    spec = importlib.util.spec_from_file_location(f"dt_{name}", EXAMPLE_DIR / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_nic_sysfs(root: str | os.PathLike[str], count: int = 4, bus: int = 0x8A) -> list[str]:
    """Write ``count`` Mellanox-like PCI Ethernet functions with netdevs ``eth0..`` under ``root``.

    Shaped like the kernel's sysfs (``bus/pci/devices`` and ``class/net`` are symlinks into
    ``devices/``, a bound ``driver`` link), enough for discovery to publish them. Returns the
    device names discovery gives them (``pci-0000-8a-00-0``...). A bus holds 256 functions (32
    devices of 8), the next ones go on the next bus: every address is a valid one, so discovery
    finds each netdev's function. For full topologies use the fixture builder in harness/sysfs.py.
    """
    if bus + (count - 1) // 256 > 0xFF:
        raise ValueError(f"{count} functions from bus {bus:#x} do not fit below bus 0xff")
    root = Path(root)
    names = []
    drivers = root / "bus/pci/drivers/mlx5_core"
    drivers.mkdir(parents=True, exist_ok=True)
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "class/net").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        bdf = f"0000:{bus + i // 256:02x}:{i % 256 // 8:02x}.{i % 8}"
        dev = root / "devices/pci0000:80/0000:80:01.0" / bdf
        net = dev / "net" / f"eth{i}"
        net.mkdir(parents=True)
        for name, value in {
            "class": "0x020000",
            "vendor": "0x15b3",
            "device": "0x101b",
            "numa_node": "1",
            "subsystem_device": "0x0023",
        }.items():
            (dev / name).write_text(value + "\n")
        for name, value in {
            "address": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}",
            "mtu": "1500",
            "operstate": "up",
            "type": "1",
        }.items():
            (net / name).write_text(value + "\n")
        os.symlink(os.path.relpath(drivers, dev), dev / "driver")
        os.symlink(os.path.relpath(dev, root / "bus/pci/devices"), root / "bus/pci/devices" / bdf)
        os.symlink(os.path.relpath(net, root / "class/net"), root / "class/net" / f"eth{i}")
        names.append("pci-" + bdf.replace(":", "-").replace(".", "-"))
    return names
