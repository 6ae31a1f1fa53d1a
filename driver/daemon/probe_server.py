"""``/healthz``, ``/readyz``, ``/livez`` and ``/metrics`` over HTTP, on the daemon's ``--bind-address``.

``/healthz`` (startup) answers 200 only once ``ready()`` is true (the daemon: kubelet plugin
serving and the first discovery done), 503 before. ``/readyz`` (readiness) also needs
``serving()``: the daemon registered with the kubelet and the container runtime, so a rolling
update with surge removes the old driver pod only once the new one can take over. Both answer
503, with the reasons in the body, while ``problems()`` reports a condition that needs a human
(state that cannot be saved). ``/livez`` answers 200 while the event loop runs: the liveness
probe, so such a condition makes the pod unready, visibly, without the kubelet restarting a
driver that a restart cannot fix. (The kubelet's per-device health stream is another thing:
:mod:`driver.dra.health`.)

A busy port (another instance of the driver on this host network: a rolling update with surge)
is asked for with ``claim_port(port)`` and retried every :data:`BUSY_RETRY` seconds for up to
:data:`BUSY_TIMEOUT` seconds (see :mod:`driver.node_lease`).

The server is asyncio's own streams with a small HTTP/1.1 responder: probes and Prometheus send
a GET and read one answer, so each connection gets one response and is closed (``Connection:
close``). A request head larger than :data:`MAX_HEAD` or slower than :data:`READ_TIMEOUT` is
dropped. An HTTP framework would cost the daemon ~11 MiB of memory for four fixed paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus

from driver.metrics import Metrics

log = logging.getLogger(__name__)

BUSY_RETRY = 0.2
BUSY_TIMEOUT = 30.0
MAX_HEAD = 8192
"""Largest request line plus headers read (a probe's is ~100 bytes)."""
READ_TIMEOUT = 10.0
"""Seconds a client has to send its request head."""
TEXT = "text/plain; charset=utf-8"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Answer = tuple[int, bytes, str]
"""A response: status, body, content type."""


def parse_bind_address(address: str) -> tuple[str, int]:
    """``":9177"`` -> ``("", 9177)``: every address of both families (an IPv6-only node's kubelet
    probes its IPv6 address); ``"127.0.0.1:0"`` -> ephemeral port; ``"[::1]:80"`` works."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--bind-address {address!r}: expected [host]:port")
    return host.strip("[]"), int(port)


def response(status: int, body: bytes, content_type: str, head_only: bool = False) -> bytes:
    """One HTTP/1.1 response, the connection closed after it."""
    reason = HTTPStatus(status).phrase
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else body)


class ProbeServer:
    """Serves the probes and /metrics until :meth:`stop`."""

    def __init__(
        self,
        bind_address: str,
        metrics: Metrics,
        ready: Callable[[], bool],
        problems: Callable[[], Sequence[str]] = tuple,
        *,
        serving: Callable[[], bool] | None = None,
        claim_port: Callable[[int], None] | None = None,
        port_file: str = "",
    ) -> None:
        self.host, self.port = parse_bind_address(bind_address)
        self.port_file = port_file
        self.metrics = metrics
        self.ready = ready
        self.problems = problems
        self.serving = serving or ready
        self.claim_port = claim_port
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._routes: dict[bytes, Callable[[], Awaitable[Answer]]] = {
            b"/healthz": lambda: self._answer(self.ready),
            b"/readyz": lambda: self._answer(self.serving),
            b"/livez": self._livez,
            b"/metrics": self._metrics,
        }

    async def _answer(self, ok: Callable[[], bool]) -> Answer:
        """503 with the reasons while there are problems, else 200 when ``ok()``, else 503."""
        problems = self.problems()
        if problems:
            return 503, "".join(f"{p}\n" for p in problems).encode(), TEXT
        if ok():
            return 200, b"ok\n", TEXT
        return 503, b"not ready\n", TEXT

    async def _livez(self) -> Answer:
        return 200, b"ok\n", TEXT

    async def _metrics(self) -> Answer:
        # In a worker thread: collectors read the state files (a lock a checkpoint write may hold).
        return 200, await asyncio.to_thread(self.metrics.render), METRICS_TYPE

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                return  # closed, too large or too slow: nobody to answer
            method, _, rest = head.partition(b"\r\n")[0].partition(b" ")
            target = rest.rpartition(b" ")[0] or rest
            route = self._routes.get(target.partition(b"?")[0])
            if method not in (b"GET", b"HEAD"):
                status, body, kind = 405, b"method not allowed\n", TEXT
            elif route is None:
                status, body, kind = 404, b"not found\n", TEXT
            else:
                try:
                    status, body, kind = await route()
                except Exception as exc:  # one request's failure is its answer, never the server's end
                    log.exception("probe request failed", extra={"kv": {"path": target.decode(errors="replace")}})
                    status, body, kind = 500, f"{type(exc).__name__}: {exc}\n".encode(), TEXT
            writer.write(response(status, body, kind, head_only=method == b"HEAD"))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        finally:
            writer.close()
            if task is not None:
                self._clients.discard(task)

    async def start(self) -> None:
        """Bind and serve; :attr:`port` is the real port afterwards (useful with port 0)."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        asked = False
        while True:
            try:
                self._server = await asyncio.start_server(
                    self._serve, self.host or None, self.port, reuse_address=True, limit=MAX_HEAD
                )
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or self.claim_port is None or time.monotonic() > deadline:
                    raise
                if not asked:
                    log.info(
                        "probe port busy: asking the driver instance holding it", extra={"kv": {"port": self.port}}
                    )
                asked = True
                self.claim_port(self.port)  # the instance holding it lets go (driver.node_lease)
                await asyncio.sleep(BUSY_RETRY)
        if self._server.sockets:
            self.port = self._server.sockets[0].getsockname()[1]
        if self.port_file:
            with open(self.port_file, "w") as f:
                f.write(f"{self.port}\n")
        log.info("probe server listening", extra={"kv": {"host": self.host, "port": self.port}})

    async def stop(self) -> None:
        """Close the listener and connections."""
        server, self._server = self._server, None
        if server is None:
            return
        if self.port_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.port_file)
        server.close()
        for task in list(self._clients):
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        await server.wait_closed()
