"""``/healthz``, ``/readyz`` and ``/metrics`` over HTTP (aiohttp), on the daemon's ``--bind-address``.

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
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Sequence

from aiohttp import web

from driver.metrics import Metrics

log = logging.getLogger(__name__)

BUSY_RETRY = 0.2
BUSY_TIMEOUT = 30.0


def parse_bind_address(address: str) -> tuple[str, int]:
    """``":9177"`` -> ``("0.0.0.0", 9177)``; ``"127.0.0.1:0"`` -> ephemeral port; ``"[::1]:80"`` works."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--bind-address {address!r}: expected [host]:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class ProbeServer:
    """Serves the readiness probe /healthz and /metrics until :meth:`stop`."""

    def __init__(
        self,
        bind_address: str,
        metrics: Metrics,
        ready: Callable[[], bool],
        problems: Callable[[], Sequence[str]] = tuple,
        *,
        serving: Callable[[], bool] | None = None,
        claim_port: Callable[[int], None] | None = None,
    ) -> None:
        self.host, self.port = parse_bind_address(bind_address)
        self.metrics = metrics
        self.ready = ready
        self.problems = problems
        self.serving = serving or ready
        self.claim_port = claim_port
        self._runner: web.AppRunner | None = None

    def _answer(self, ok: Callable[[], bool]) -> web.Response:
        """503 with the reasons while there are problems, else 200 when ``ok()``, else 503."""
        problems = self.problems()
        if problems:
            return web.Response(status=503, text="".join(f"{p}\n" for p in problems))
        if ok():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready\n")

    async def _healthz(self, request: web.Request) -> web.Response:
        return self._answer(self.ready)

    async def _readyz(self, request: web.Request) -> web.Response:
        return self._answer(self.serving)

    async def _livez(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        # In a worker thread: collectors read the state files (a lock a checkpoint write may hold).
        body = await asyncio.to_thread(self.metrics.render)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def start(self) -> None:
        """Bind and serve; :attr:`port` is the real port afterwards (useful with port 0)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/livez", self._livez)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        deadline = time.monotonic() + BUSY_TIMEOUT
        asked = False
        while True:
            # A new runner per attempt: a site that failed to bind stays registered in its runner.
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
            try:
                await site.start()
                break
            except OSError as exc:
                await runner.cleanup()
                if exc.errno != errno.EADDRINUSE or self.claim_port is None or time.monotonic() > deadline:
                    raise
                if not asked:
                    log.info(
                        "probe port busy: asking the driver instance holding it", extra={"kv": {"port": self.port}}
                    )
                asked = True
                self.claim_port(self.port)  # the instance holding it lets go (driver.node_lease)
                await asyncio.sleep(BUSY_RETRY)
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []  # aiohttp exposes no public accessor
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("probe server listening", extra={"kv": {"host": self.host, "port": self.port}})

    async def stop(self) -> None:
        """Close the listener and connections."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
