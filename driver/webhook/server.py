"""``dranet webhook``: the TLS server that answers admission reviews, its ``/healthz``, and the entry point.

One aiohttp application answers a POST on every URL path with :class:`AdmissionHandler` (a
configuration may use any path: the chart's ``/validate-resourceclaims``, the managed one's
``/validate``), over TLS with the given or self-signed certificate, reloaded when its files change
(a renewed secret). ``--health-port`` serves ``GET /healthz`` over plain HTTP from the same event
loop, so a probe fails when that loop is stuck, where a TCP probe (the kernel accepts the
connection) would not. The configuration is applied by :mod:`driver.webhook.configuration` when
asked. Validation needs no API access: without ``--manage-configuration`` the webhook makes no API
call at all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
import tempfile
from pathlib import Path

import aiohttp.web

from driver.webhook.certificates import TLSFiles, given, self_signed
from driver.webhook.configuration import ConfigurationManager
from driver.webhook.handler import AdmissionHandler
from driver.webhook.options import WebhookOptions, options_from_args

log = logging.getLogger(__name__)

CERT_CHECK_INTERVAL = 60.0
"""Seconds between checks of the certificate files for a renewal (a mounted secret's update)."""


class ServingCertificate:
    """The server's TLS context, loaded again when the certificate or key file changes.

    New connections get the renewed certificate; connections already open keep theirs.
    """

    def __init__(self, tls: TLSFiles) -> None:
        self.tls = tls
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._stamp = self._files_stamp()
        self.context.load_cert_chain(tls.certfile, tls.keyfile)

    def _files_stamp(self) -> tuple[int, ...]:
        out: tuple[int, ...] = ()
        for path in (self.tls.certfile, self.tls.keyfile):
            st = os.stat(path)
            out += (st.st_ino, st.st_mtime_ns, st.st_size)
        return out

    def reload_if_changed(self) -> bool:
        """Load the files again when they changed since the last load; whether they were loaded."""
        try:
            stamp = self._files_stamp()
            if stamp == self._stamp:
                return False
            self.context.load_cert_chain(self.tls.certfile, self.tls.keyfile)
        except (OSError, ssl.SSLError) as exc:  # a half-written renewal: keep serving the old one
            log.warning("cannot load the renewed webhook certificate", extra={"kv": {"error": str(exc)}})
            return False
        self._stamp = stamp
        log.info("webhook certificate reloaded", extra={"kv": {"certfile": self.tls.certfile}})
        return True

    async def watch(self, interval: float = CERT_CHECK_INTERVAL) -> None:
        """Check the files every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()


def admission_app(driver_name: str) -> aiohttp.web.Application:
    """The application that answers a review POSTed to any URL path."""
    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.post("/{path:.*}", AdmissionHandler(driver_name).handle)])
    return app


async def healthz(_request: aiohttp.web.Request) -> aiohttp.web.Response:
    """``GET /healthz``: answered by the event loop that serves the reviews."""
    return aiohttp.web.json_response({})


async def serve(options: WebhookOptions, tls: TLSFiles, stop: asyncio.Event) -> None:
    """Serve reviews (and ``/healthz``) until ``stop`` is set; then stop, emptying a managed configuration."""
    runners = [aiohttp.web.AppRunner(admission_app(options.driver_name), handle_signals=False)]
    certificate = ServingCertificate(tls)
    watcher = asyncio.create_task(certificate.watch())
    manager = ConfigurationManager(options, tls) if options.manage_configuration else None
    try:
        await runners[0].setup()
        site = aiohttp.web.TCPSite(runners[0], options.listen or None, options.port, ssl_context=certificate.context)
        await site.start()
        if options.health_port:
            health = aiohttp.web.Application()
            health.add_routes([aiohttp.web.get("/healthz", healthz)])
            runners.append(aiohttp.web.AppRunner(health, handle_signals=False))
            await runners[1].setup()
            await aiohttp.web.TCPSite(runners[1], options.listen or None, options.health_port).start()
        log.info("serving admission reviews", extra={"kv": {"port": options.port, "healthPort": options.health_port}})
        if manager is not None:
            await manager.start()  # the TLS port accepts connections: failurePolicy Fail never meets a dead one
        await stop.wait()
    finally:
        watcher.cancel()
        if manager is not None:
            await manager.stop()
        for runner in reversed(runners):
            await runner.cleanup()


async def _run(options: WebhookOptions, tls: TLSFiles) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(options, tls, stop)


def cli_webhook(args: argparse.Namespace) -> int:
    """``dranet webhook``: serve until SIGTERM/SIGINT."""
    options = options_from_args(args)
    if bool(options.tls_cert) != bool(options.tls_key):
        log.error("--tls-cert and --tls-key must be given together")
        return 2
    # A temp dir only for a generated certificate: with --tls-cert/--tls-key the webhook writes
    # nothing, so it runs on a read-only root filesystem (as the chart deploys it).
    with contextlib.ExitStack() as stack:
        if options.tls_cert and options.tls_key:
            tls = given(options.tls_cert, options.tls_key)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="dranet-webhook-"))
            hosts = [h for h in (options.host, "127.0.0.1", "localhost") if h]
            tls = self_signed(Path(tmp), list(dict.fromkeys(hosts)))
            log.info("generated a self-signed webhook certificate", extra={"kv": {"sans": hosts, "dir": tmp}})
        log.info(
            "starting webhook",
            extra={
                "kv": {
                    "port": options.port,
                    "host": options.host,
                    "managed": options.manage_configuration,
                    "failurePolicy": options.failure_policy,
                    "driverName": options.driver_name,
                    "healthPort": options.health_port,
                }
            },
        )
        asyncio.run(_run(options, tls))
    return 0
