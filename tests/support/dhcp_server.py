"""A real DHCP server for tests: busybox's udhcpd on a veth end in a namespace of the test's own.

busybox-static is installed by ``make deps`` (hack/install-deps.sh). The server hands out
``<prefix>.10``-``<prefix>.20`` with a /24 mask, the router ``<prefix>.1`` and, when asked,
classless static routes (option 121). ``-a 0``: no ARP probe of an address before offering it
(udhcpd waits 2 s for that by default). Its leases are read with ``dumpleases`` after SIGUSR1
makes it write them: a released lease shows as ``expired``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = shutil.which("busybox") or "/bin/busybox"


@dataclass
class UdhcpdServer:
    """A running udhcpd in network namespace ``netns`` on ``ifname`` (address ``<prefix>.1/24``)."""

    netns: str
    ifname: str
    prefix: str
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def address(self) -> str:
        """The server's own address (its server identifier)."""
        return f"{self.prefix}.1"

    def leases(self) -> dict[str, tuple[str, str]]:
        """MAC -> (address, "expires in" text: ``expired`` once released) as the server has them now."""
        lease_file = self.workdir / "leases"
        before = lease_file.stat().st_mtime_ns
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 2
        while lease_file.stat().st_mtime_ns == before and time.monotonic() < deadline:
            time.sleep(0.01)
        out = subprocess.run(
            [BUSYBOX, "dumpleases", "-f", str(lease_file)], capture_output=True, text=True, check=True
        ).stdout
        leases = {}
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                leases[parts[0]] = (parts[1], parts[-1])
        return leases

    def released(self, mac: str, timeout: float = 2.0) -> bool:
        """Whether the server marks ``mac``'s lease expired within ``timeout`` s (a release is not
        answered: it may still be on its way when the leases are first read)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.leases().get(mac, ("", ""))[1] == "expired":
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def log(self) -> str:
        """What the server printed so far."""
        return (self.workdir / "server.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_udhcpd(
    netns: str, ifname: str, prefix: str, workdir: Path, routes: list[tuple[str, str]] = (), lease: int = 600
) -> UdhcpdServer:
    """Address ``ifname`` (already in ``netns``) as ``<prefix>.1/24``, bring it up and serve DHCP on it."""
    subprocess.run(["ip", "-n", netns, "addr", "add", f"{prefix}.1/24", "dev", ifname], check=True)
    subprocess.run(["ip", "-n", netns, "link", "set", ifname, "up"], check=True)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "leases").write_bytes(b"")
    lines = [
        f"start {prefix}.10",
        f"end {prefix}.20",
        f"interface {ifname}",
        f"lease_file {workdir / 'leases'}",
        f"pidfile {workdir / 'udhcpd.pid'}",
        "option subnet 255.255.255.0",
        f"option router {prefix}.1",
        f"option lease {lease}",
        "auto_time 0",
    ]
    if routes:
        lines.append("option staticroutes " + ", ".join(f"{dst} {gw}" for dst, gw in routes))
    conf = workdir / "udhcpd.conf"
    conf.write_text("\n".join(lines) + "\n")
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(
        ["ip", "netns", "exec", netns, BUSYBOX, "udhcpd", "-f", "-a", "0", str(conf)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    server = UdhcpdServer(netns=netns, ifname=ifname, prefix=prefix, workdir=workdir, process=process)
    deadline = time.monotonic() + 5
    while "started" not in server.log():
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"udhcpd did not start: {server.log()}")
        time.sleep(0.01)
    return server
