"""Verbs traffic over Soft-RoCE on Debian's stock kernel: two guests, two nodes, one rail.

``python -m bench.bench_soft_roce [--seconds 5] [--json FILE]`` (root; builds nothing but the stock
kernel, :mod:`devcluster.builders.stock_kernel`). Two QEMU guests (TCG: every figure is under
emulation, labelled so) each get one e1000e NIC; the two NICs are wired to each other by a UDP
socket on 127.0.0.1 (:func:`harness.guest.wired_nic`), so nothing leaves this machine. Each guest
makes ``rxe0`` on its NIC and perftest runs between them over rdma_cm, twice:

- ``host network``: the NICs stay in each guest's root namespace: ``ib_write_bw`` (bandwidth) and
  ``ib_write_lat`` (latency), with the bytes each NIC moved (its own counters);
- ``pod``: each NIC moved into a namespace of its own (what the driver does for a pod) and
  ``rxe0`` made there: the device comes up, but the connection never does. On 6.1 Soft-RoCE sends
  and receives through one UDP socket in the root namespace and routes there, so a pod's NIC
  carries no RoCE; the bench shows the connection error and the bytes (none) that moved.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from harness import guest

NIC = "eth0"
SERVER, CLIENT = "10.200.0.1", "10.200.0.2"
PORTS = {"host": (41001, 41002), "pod": (41011, 41012)}
STATS = f"/sys/class/net/{NIC}/statistics/tx_bytes /sys/class/net/{NIC}/statistics/rx_bytes"


def _script(role: str, placement: str, test: str, seconds: int) -> str:
    """The guest's shell script: the NIC (in a namespace ``pod`` for ``placement == "pod"``), rxe0
    on it, the NIC's counters before and after one perftest run (the client retries until the
    server listens)."""
    ns = "ip netns exec pod " if placement == "pod" else ""
    address = SERVER if role == "server" else CLIENT
    lines = ["modprobe rdma_rxe", "modprobe rdma_ucm"]
    if placement == "pod":
        lines += ["ip netns add pod", f"ip link set {NIC} netns pod", "ip -n pod link set lo up"]
    lines += [
        f"{ns}ip link set {NIC} up",
        f"{ns}ip addr add {address}/24 dev {NIC}",
        f"{ns}rdma link add rxe0 type rxe netdev {NIC}",
        "sleep 1",
        f"echo RDMA: $({ns}rdma link show rxe0/1)",
        f"echo BEFORE $({ns}cat {STATS})",
    ]
    size = "-s 65536 --report_gbits" if test == "ib_write_bw" else "-s 64"
    run = f"{ns}timeout 60 {test} -R -d rxe0 -D {seconds} {size}"
    if role == "server":
        lines.append(run)
    else:
        lines.append(f"for i in $(seq 15); do {run} {SERVER} && break; sleep 2; done")
    lines.append(
        f"echo AFTER $({ns}cat /sys/class/net/{NIC}/statistics/tx_bytes /sys/class/net/{NIC}/statistics/rx_bytes)"
    )
    return "; ".join(lines)


def _counters(output: str) -> dict[str, int]:
    before = re.search(r"^BEFORE (\d+) (\d+)$", output, re.M)
    after = re.search(r"^AFTER (\d+) (\d+)$", output, re.M)
    if not before or not after:
        return {}
    return {
        "tx_bytes": int(after.group(1)) - int(before.group(1)),
        "rx_bytes": int(after.group(2)) - int(before.group(2)),
    }


def _result(test: str, output: str) -> dict[str, Any]:
    """perftest's result table as {column: value}: the header line (``#bytes #iterations ...``) and
    the numbers under it (bandwidth: ``BW average[Gb/sec]``; latency: ``t_avg[usec]`` or, without
    ``-D``, ``t_typical[usec]``)."""
    lines = output.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip().startswith("#bytes"):
            names = re.split(r"\s{2,}", line.strip())
            values = lines[i + 1].split()
            if len(values) >= len(names) and values[0].isdigit():
                return {name: float(value) for name, value in zip(names, values, strict=False)}
    return {}


def pair(placement: str, test: str, seconds: int, kernel: Any) -> dict[str, Any]:
    """One perftest run between the two guests; each side's result, counters and RDMA link."""
    port_a, port_b = PORTS[placement]
    runs: dict[str, guest.GuestRun] = {}
    errors: list[BaseException] = []
    work = Path(tempfile.mkdtemp(prefix="dranet-roce-"))

    def boot(role: str, port: int, peer: int, mac: str) -> None:
        try:
            runs[role] = guest.run(
                _script(role, placement, test, seconds),
                work / role,
                cwd="/",
                timeout=600,
                cpus=1,
                memory_mb=1024,
                kernel=kernel,
                qemu_args=guest.wired_nic(mac, port, peer),
            )
        except BaseException as exc:  # noqa: BLE001 - reported with the other side's result
            errors.append(exc)

    try:
        threads = [
            threading.Thread(target=boot, args=("server", port_a, port_b, "52:54:00:ce:00:01")),
            threading.Thread(target=boot, args=("client", port_b, port_a, "52:54:00:ce:00:02")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        out: dict[str, Any] = {"release": runs["server"].release}
        for role, run in runs.items():
            link = re.search(r"^RDMA: (.*)$", run.output, re.M)
            out[role] = {
                "result": _result(test, run.output),
                "nic": _counters(run.output),
                "rdma_link": link.group(1) if link else "",
                "boot_s": run.boot_s,
                "error": "" if _result(test, run.output) else _last_error(run.output),
            }
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if "Unable" in line or "event" in line.lower()]
    return lines[-1] if lines else output.strip().splitlines()[-1] if output.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="perftest duration of each run")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    from devcluster.builders.stock_kernel import ensure

    kernel = ensure()
    report = {
        "emulated": "QEMU TCG on this machine: the figures measure emulation, not a NIC",
        "host network": {t: pair("host", t, args.seconds, kernel) for t in ("ib_write_bw", "ib_write_lat")},
        "pod": {"ib_write_bw": pair("pod", "ib_write_bw", args.seconds, kernel)},
    }
    for placement in ("host network", "pod"):
        for test, run in report[placement].items():
            server, client = run["server"], run["client"]
            sent, received = client["nic"].get("tx_bytes", "?"), server["nic"].get("rx_bytes", "?")
            moved = f"client NIC tx {sent} B, server NIC rx {received} B"
            print(
                f"{run['release']} {placement:12} {test:12} client {client['result'] or client['error']!s:60} {moved}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
