"""A command run under Debian's stock kernel: QEMU, this machine's root over 9p, one run folder.

QEMU boots the kernel :mod:`devcluster.builders.stock_kernel` prepared; its initramfs mounts this
machine's root read-only (9p) under a tmpfs overlay, so the guest runs the same Python, packages
and project as this machine, writes where it likes and leaves nothing here. The run's own folder
(a fresh temporary one) is shared writable at ``/run/guest``: the script the guest runs, its
output and exit status, whatever the command writes there.

Why QEMU directly and not virtme-ng (which packages the same idea): the tier needs an unpacked
distribution kernel whose modules are not installed on this machine, and a q35 machine with NUMA
nodes and PCI NICs behind expander bridges (:class:`Topology`); virtme-ng expects the modules under
this machine's ``/lib/modules`` and its machine is the one it builds. What is left is one QEMU
command line and a 20-line init.

Acceleration: KVM where ``/dev/kvm`` runs a stock kernel (``DRANET_GUEST_KVM=1``), else TCG,
multi-threaded. Here ``/dev/kvm`` is a paravirtual device stock kernels cannot use, so TCG.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster.builders.binaries import cache_root
from devcluster.builders.qemu import SYSTEM, Qemu
from devcluster.builders.stock_kernel import GUEST_DIR, OUT_TAG, ROOT_TAG, StockKernel, ensure

KVM_ENV = "DRANET_GUEST_KVM"
PYCACHE_ENV = "PYTHONPYCACHEPREFIX"
PROJECT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("driver", "dranet_proto", "harness", "devcluster", "tests", "bench")
LIBRARY_SKIP = r"(/tests?/|/idlelib/|/tkinter/|/turtledemo/|/lib2to3/)"
"""What of the standard library and site-packages no guest imports: not compiled."""
PASS_ENV = ("LANG", "LC_ALL", "DRANET_CACHE_DIR", "XDG_CACHE_HOME", "PYTHONHASHSEED")
"""This machine's environment variables the guest's command sees too (with ``PATH`` and ``HOME``)."""


@dataclass(frozen=True)
class Topology:
    """Two NUMA nodes, each with its CPU, memory and an expander bridge (``pxb-pcie``) whose root
    ports hold ``nics_per_node`` e1000e NICs and ``gpus_per_node`` display controllers of a GPU
    vendor (QEMU's ``ati-vga``: PCI vendor 0x1002, what the topology tools take for an AMD GPU); the
    NICs of one index across the nodes share a rail (a QEMU hub: frames stay inside QEMU).

    ``igb_per_node``: SR-IOV PFs (QEMU's ``igb``, an 82576 with up to 7 VFs; QEMU 8.0 on, see
    :mod:`devcluster.builders.qemu`) on each node's bridge too, the PFs of one index on one rail, and
    an emulated Intel IOMMU (``intel_iommu=on iommu=pt``, as an SR-IOV server boots), so each VF
    is in an IOMMU group of its own."""

    nics_per_node: int = 2
    gpus_per_node: int = 1
    igb_per_node: int = 0

    @property
    def iommu(self) -> bool:
        return self.igb_per_node > 0

    def qemu_args(self, memory_mb: int) -> list[str]:
        half = memory_mb // 2
        args = [
            "-object", f"memory-backend-ram,id=mem0,size={half}M",
            "-object", f"memory-backend-ram,id=mem1,size={memory_mb - half}M",
            "-numa", "node,nodeid=0,cpus=0,memdev=mem0",
            "-numa", "node,nodeid=1,cpus=1,memdev=mem1",
        ]  # fmt: skip
        for node in (0, 1):
            bus = f"pxb{node}"
            args += ["-device", f"pxb-pcie,id={bus},bus_nr={0x40 + 0x40 * node},numa_node={node},bus=pcie.0"]
            for i in range(self.nics_per_node):
                port = f"rp{node}{i}"
                chassis = 1 + node * 16 + i
                mac = f"52:54:00:00:{node:02x}:{i:02x}"
                args += [
                    "-device", f"pcie-root-port,id={port},bus={bus},chassis={chassis},slot={i}",
                    "-netdev", f"hubport,id=n{node}{i},hubid={i}",
                    "-device", f"e1000e,bus={port},netdev=n{node}{i},mac={mac}",
                ]  # fmt: skip
            for i in range(self.gpus_per_node):
                port = f"gp{node}{i}"
                chassis = 1 + node * 16 + self.nics_per_node + i
                args += [
                    "-device", f"pcie-root-port,id={port},bus={bus},chassis={chassis},slot={self.nics_per_node + i}",
                    "-device", f"ati-vga,bus={port}",
                ]  # fmt: skip
            for i in range(self.igb_per_node):
                port, slot = f"sr{node}{i}", self.nics_per_node + self.gpus_per_node + i
                mac = f"52:54:00:10:{node:02x}:{i:02x}"
                args += [
                    "-device", f"pcie-root-port,id={port},bus={bus},chassis={1 + node * 16 + slot},slot={slot}",
                    "-netdev", f"hubport,id=s{node}{i},hubid={100 + i}",
                    "-device", f"igb,bus={port},netdev=s{node}{i},mac={mac}",
                ]  # fmt: skip
        return args


@dataclass
class GuestRun:
    """What one boot did."""

    rc: int  # the command's exit status (-1: it never finished)
    output: str  # its stdout and stderr
    console: str  # the kernel's console
    boot_s: float  # guest uptime when the command started
    wall_s: float  # QEMU start to exit
    folder: Path  # the run's folder (what the command wrote to /run/guest)
    release: str = ""
    panics: tuple[str, ...] = ()  # each boot that died before the command started: its console's panic lines


class GuestError(RuntimeError):
    """The guest did not boot or did not finish; carries the console's tail."""


BOOT = """#!/bin/sh
# Runs in the guest as its init, after the initramfs: the run's command, then power off.
export PATH={path} HOME={home}
{env}
ip link set lo up
# No udev here: load the drivers of the network PCI functions QEMU gave, as a coldplug would.
for f in /sys/bus/pci/devices/*; do
  case "$(cat "$f/class")" in 0x02*) modprobe -q "$(cat "$f/modalias")" ;; esac
done
cut -d' ' -f1 /proc/uptime > {guest_dir}/boot_s
if cd {cwd}; then
  ( {command} ) > {guest_dir}/output.txt 2>&1
  echo $? > {guest_dir}/rc
else
  echo "the guest cannot see {cwd} (under /run, /proc, /sys or /dev: the guest's own)" > {guest_dir}/output.txt
  echo 97 > {guest_dir}/rc
fi
sync
busybox poweroff -f
"""


PANIC_MARKS = ("Kernel panic", "Oops:", "BUG:", "general protection fault")
"""Console lines of a kernel that died (with ``panic=-1`` and ``-no-reboot``, QEMU then exits)."""
BOOT_TRIES = 3
BOOT_DEADLINE_S = 300
"""A boot that has not started its command by then hung (it takes ~5 s alone, ~20 s on a loaded
machine): killed and booted again, as a boot that died."""
STALL_S = 600
"""A running command whose output has not grown for this long: the guest itself stopped (a test
that hangs is ended by the tier's own per-test timeout well before), killed and booted again once."""
WATCH_S = 5.0
"""How often the watchdog looks at a running guest."""
"""Boots of one run that may die before its command starts: under multi-threaded TCG, Linux 7.3
sometimes oopses a second in (int3 in ``sched_clock_cpu``, while the TSC's static keys are patched
on the other vCPU); a boot that got as far as the command is never retried."""


def panic_lines(console: str) -> list[str]:
    """The lines of ``console`` from a kernel that died, and the few after the first (its cause)."""
    lines = console.splitlines()
    first = next((i for i, line in enumerate(lines) if any(m in line for m in PANIC_MARKS)), None)
    return [] if first is None else lines[first : first + 6]


def bytecode_prefix() -> Path:
    """Where the guests find their bytecode (``PYTHONPYCACHEPREFIX``), under the cache."""
    return cache_root() / "pycache"


def _library_stamp() -> str:
    """What the standard library and site-packages are, cheaply: their top-level entries and
    times (an install or upgrade adds, removes or renames some)."""
    parts = []
    for key in ("stdlib", "purelib", "platlib"):
        root = Path(sysconfig.get_paths()[key])
        with os.scandir(root) as entries:
            parts += [f"{e.path} {e.stat(follow_symlinks=False).st_mtime_ns}" for e in entries]
    return hashlib.sha256("\n".join(sorted(set(parts))).encode()).hexdigest()


def warm_bytecode(progress: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)) -> float:
    """Valid ``.pyc`` files under :func:`bytecode_prefix` for what the guests import: this Python's
    standard library and site-packages (compiled again when they change) and the project's packages
    (checked at every call). Under TCG a process compiles what it imports a dozen times slower
    than here, and each guest process would (this machine writes no bytecode: the guest's
    ``__pycache__`` finds none, and what a guest writes goes with its tmpfs overlay). Seconds spent."""
    start = time.monotonic()
    prefix = bytecode_prefix()
    prefix.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {PYCACHE_ENV: str(prefix)}

    def compile_all(*dirs: str | Path, skip: str = "") -> None:
        args = [sys.executable, "-m", "compileall", "-q", "-j", "0", *(["-x", skip] if skip else []), *map(str, dirs)]
        subprocess.run(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    with open(prefix / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp, stamp_file = _library_stamp(), prefix / "library.stamp"
        if not stamp_file.exists() or stamp_file.read_text() != stamp:
            progress(f"[guest] compiling the standard library and site-packages for the guests, into {prefix}")
            paths = sysconfig.get_paths()
            compile_all(*dict.fromkeys(paths[k] for k in ("stdlib", "purelib", "platlib")), skip=LIBRARY_SKIP)
            stamp_file.write_text(stamp)
        compile_all(*(PROJECT / p for p in PROJECT_PACKAGES if (PROJECT / p).is_dir()))
    return time.monotonic() - start


TCG_CPU = "max,erms=off,fsrm=off"
"""The emulated CPU: every feature TCG has but fast string moves. With ERMS, Linux 5.10 clears and
copies pages with ``rep stosb``/``rep movsb``, which TCG runs a byte per iteration: each fork and
exec there cost 5x the system time of 6.12's (300 ``/bin/true`` in 21 s against 13 s without it;
6.1, 6.12 and 7.3 measured the same either way)."""
TCG_CMDLINE = "tsc=reliable"
"""5.10 finds the two vCPUs' TSCs unsynchronized and falls back to the HPET, every read of which is
an emulated MMIO access; TCG's TSCs are the host's clock, so the check is skipped."""


def _accel() -> list[str]:
    if os.environ.get(KVM_ENV) == "1":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]


def qemu_command(
    kernel: StockKernel,
    folder: Path,
    memory_mb: int,
    cpus: int,
    topology: Topology | None,
    extra: Sequence[str] = (),
    qemu: Qemu = SYSTEM,
) -> list[str]:
    """The QEMU command line of one boot (``extra``: more devices, e.g. a NIC wired to another guest)."""
    iommu = topology is not None and topology.iommu
    # The IOMMU before every PCI device (QEMU's rule), interrupt remapping for the VFs' MSI-X.
    machine = ["-machine", "q35,kernel-irqchip=split"] if iommu else ["-machine", "q35"]
    tcg = os.environ.get(KVM_ENV) != "1"
    cmdline = "console=ttyS0 quiet panic=-1 rdinit=/init" + (f" {TCG_CMDLINE}" if tcg else "")
    cmdline += " intel_iommu=on iommu=pt" if iommu else ""
    args = [
        *qemu.command, *machine, *_accel(),
        *(["-device", "intel-iommu,intremap=on,caching-mode=on"] if iommu else []),
        "-smp", str(cpus), "-m", f"{memory_mb}M",
        "-kernel", str(kernel.vmlinux), "-initrd", str(kernel.initramfs),
        "-append", cmdline,
        "-display", "none", "-monitor", "none", "-no-reboot", "-nodefaults",
        "-serial", f"file:{folder / 'console.log'}",
        "-virtfs", f"local,path=/,mount_tag={ROOT_TAG},security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={folder},mount_tag={OUT_TAG},security_model=none",
    ]  # fmt: skip
    if topology is not None:
        args += topology.qemu_args(memory_mb)
    return args + list(extra)


def wired_nic(mac: str, port: int, peer_port: int) -> list[str]:
    """An e1000e NIC whose wire is a UDP socket on 127.0.0.1 (``port``) to another guest's NIC
    (``peer_port``): two guests, two nodes on one rail, nothing leaves this machine."""
    netdev = f"w{port}"
    return [
        "-netdev", f"socket,id={netdev},udp=127.0.0.1:{peer_port},localaddr=127.0.0.1:{port}",
        "-device", f"e1000e,netdev={netdev},mac={mac}",
    ]  # fmt: skip


def run(
    command: str,
    folder: Path,
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 1200,
    topology: Topology | None = None,
    memory_mb: int = 2048,
    cpus: int = 2,
    kernel: StockKernel | None = None,
    qemu_args: Sequence[str] = (),
    qemu: Qemu = SYSTEM,
) -> GuestRun:
    """Boot the stock kernel, run ``command`` (a shell command line) as root in ``cwd``, power off.

    ``folder``: the run's folder (made if missing; the caller removes it); ``env`` adds variables
    to the guest's environment; ``qemu_args``: more of QEMU's devices; ``qemu``: which QEMU (the
    SR-IOV guests need the backport's). :class:`GuestError` when the guest does not finish in time.
    """
    kernel = kernel or ensure()
    if topology is not None and cpus < 2:
        raise ValueError("a two-node topology needs two CPUs")
    folder.mkdir(parents=True, exist_ok=True)
    warm_bytecode()
    variables = (
        {k: os.environ[k] for k in PASS_ENV if k in os.environ} | {PYCACHE_ENV: str(bytecode_prefix())} | (env or {})
    )
    path = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), *os.environ["PATH"].split(os.pathsep)]))
    (folder / "boot.sh").write_text(
        BOOT.format(
            path=shlex.quote(path),
            home=shlex.quote(os.environ.get("HOME", "/root")),
            env="\n".join(f"export {k}={shlex.quote(v)}" for k, v in variables.items()),
            guest_dir=GUEST_DIR,
            cwd=shlex.quote(str(cwd or os.getcwd())),
            command=command,
        )
    )
    panics: list[str] = []
    deadline = time.monotonic() + timeout
    stalls = 0
    for attempt in range(1, BOOT_TRIES + 2):
        for stale in ("rc", "boot_s", "output.txt", "console.log"):
            (folder / stale).unlink(missing_ok=True)
        boot = _boot(kernel, folder, memory_mb, cpus, topology, qemu_args, deadline, qemu)
        if (folder / "rc").exists():
            break
        console = _read(folder / "console.log")
        died = panic_lines(console) or (["(no console line for BOOT_DEADLINE_S)"] if boot.hung == "boot" else [])
        if died and not (folder / "boot_s").exists() and len(panics) + 1 < BOOT_TRIES:
            panics.append("\n".join(died))
            print(f"[guest] {kernel.release}: boot {attempt} died before its command, booting again", file=sys.stderr)
            continue
        if boot.hung == "stall" and not stalls and deadline - time.monotonic() > timeout / 2:
            stalls += 1
            panics.append(f"its output stood still for {STALL_S} s:\n{_tail(folder / 'output.txt', 10)}")
            print(
                f"[guest] {kernel.release}: boot {attempt} stopped running its command, booting again", file=sys.stderr
            )
            continue
        what = {
            "deadline": f"did not finish in {timeout:.0f} s",
            "stall": f"printed nothing for {STALL_S} s",
            "boot": f"did not start its command in {BOOT_DEADLINE_S} s",
        }.get(boot.hung, "stopped before its command finished")
        raise GuestError(
            f"the guest {what} (qemu exit {boot.rc}: {boot.output.strip()[-2000:]}; {len(panics)} earlier boots "
            f"died or stalled); its output:\n{_tail(folder / 'output.txt')}\nconsole:\n{_tail(folder / 'console.log')}"
        )
    wall = boot.wall_s
    return GuestRun(
        rc=int((folder / "rc").read_text().strip() or -1),
        output=_read(folder / "output.txt"),
        console=_read(folder / "console.log"),
        boot_s=float(_read(folder / "boot_s").strip() or 0),
        wall_s=wall,
        folder=folder,
        release=kernel.release,
        panics=tuple(panics),
    )


@dataclass(frozen=True)
class _Boot:
    wall_s: float
    rc: int  # QEMU's exit status (-9 when killed)
    output: str  # QEMU's own output
    hung: str = ""  # why it was killed: "boot", "stall" or "deadline"; "" when QEMU exited


def _boot(
    kernel: StockKernel,
    folder: Path,
    memory_mb: int,
    cpus: int,
    topology: Topology | None,
    qemu_args: Sequence[str],
    deadline: float,
    qemu: Qemu = SYSTEM,
) -> _Boot:
    """One QEMU boot to its exit, or killed at ``deadline`` (monotonic), when it has not started
    its command in :data:`BOOT_DEADLINE_S`, or when its command printed nothing for :data:`STALL_S`."""
    start = time.monotonic()
    proc = subprocess.Popen(
        qemu_command(kernel, folder, memory_mb, cpus, topology, qemu_args, qemu),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **qemu.env},
    )
    hung, grown_at, size = "", start, -1
    while True:
        try:
            qemu_out, _ = proc.communicate(timeout=WATCH_S)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        output = folder / "output.txt"
        current = output.stat().st_size if output.exists() else -1
        if current != size:
            size, grown_at = current, now
        if now >= deadline:
            hung = "deadline"
        elif not (folder / "boot_s").exists() and now - start > BOOT_DEADLINE_S:
            hung = "boot"
        elif (folder / "boot_s").exists() and now - grown_at > STALL_S:
            hung = "stall"
        if hung:
            proc.kill()
            qemu_out, _ = proc.communicate()
            break
    return _Boot(time.monotonic() - start, proc.returncode, qemu_out.decode(errors="replace"), hung)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(_read(path).splitlines()[-lines:])
