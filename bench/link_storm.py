"""A link-flap storm: interfaces set down and up in turn at a fixed rate, in its own process.

``python -m bench.link_storm --rate 100 IFNAME...`` flips one interface per tick (round robin:
down on one pass, up on the next) with raw RTM_NEWLINK requests until SIGTERM/SIGINT, then
leaves every interface up and prints one JSON line: the changes made and the host link events
(RTM_NEWLINK/RTM_DELLINK multicast) seen meanwhile. A separate process, so the storm takes no
interpreter lock from the benchmark that times the floor.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import sys
import time

from driver.netlink.rtnl import Rtnl, newlink

RTMGRP_LINK = 1
LINK_EVENTS = (16, 17)  # RTM_NEWLINK, RTM_DELLINK


def _indexes(rtnl: Rtnl, names: list[str]) -> list[int]:
    out = []
    for name in names:
        link = rtnl.link(name)
        if link is None:
            raise SystemExit(f"link {name} not found")
        out.append(link.index)
    return out


def _drain(mon: socket.socket) -> int:
    """Link events waiting on the monitor socket."""
    seen = 0
    while True:
        try:
            data = mon.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return seen
        except OSError:  # ENOBUFS: the storm outran us; count what we can
            continue
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, off)
            seen += kind in LINK_EVENTS
            off += (length + 3) & ~3


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="link changes per second")
    parser.add_argument("ifnames", nargs="+")
    args = parser.parse_args(argv)
    rtnl = Rtnl(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE))
    rtnl.sock.bind((0, 0))
    mon = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    mon.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    mon.bind((0, RTMGRP_LINK))
    indexes = _indexes(rtnl, args.ifnames)
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(json.dumps({"ready": True}), flush=True)
    period = 1.0 / args.rate
    changes = events = 0
    start = next_tick = time.monotonic()
    i = 0
    while not stop:
        idx = indexes[i % len(indexes)]
        up = (i // len(indexes)) % 2 == 1  # first pass down, second up, ...
        rtnl.run([newlink("storm", idx, up=up)])
        changes += 1
        i += 1
        events += _drain(mon)
        next_tick += period
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_tick = time.monotonic()  # fell behind (loaded machine): do not burst to catch up
    seconds = time.monotonic() - start
    rtnl.run([newlink("storm", idx, up=True) for idx in indexes])
    time.sleep(0.05)
    events += _drain(mon)
    print(json.dumps({"changes": changes, "events": events, "seconds": round(seconds, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
