"""The kubelet's side of the device health stream, in its own process (for benchmarks).

``python -m bench.health_watch REGISTRATION_SOCKET DRA_SOCKET`` registers like the kubelet's
plugin watcher, opens ``NodeWatchResources`` and prints ``{"watching": true}`` once the first
message arrived; on SIGTERM it prints how many messages came.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

from harness.kubelet_client import KubeletClient


async def _watch(registration: str, dra: str) -> int:
    messages = 0
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with KubeletClient(registration, dra, timeout=30) as kubelet:
        await kubelet.register()

        async def consume() -> None:
            nonlocal messages
            async for _ in kubelet.watch_health():
                messages += 1
                if messages == 1:
                    print(json.dumps({"watching": True}), flush=True)

        task = asyncio.create_task(consume())
        await stop.wait()
        task.cancel()
    return messages


def start(registration_socket: str, dra_socket: str) -> subprocess.Popen[str]:
    """This watcher as a process beside the bench, once its health stream is open (the kubelet's
    side: registered, watching)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.health_watch", registration_socket, dra_socket], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()).get("watching"), "health stream did not start"
    return proc


def main(argv: list[str]) -> int:
    messages = asyncio.run(_watch(argv[0], argv[1]))
    print(json.dumps({"messages": messages}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
