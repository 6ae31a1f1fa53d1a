"""`dranet webhook`'s server in-process: TLS, /healthz and a review, under a uid with no passwd entry;
and a renewed certificate served without a restart.

The image runs the webhook as uid 65532, which has no passwd entry (OpenShift: any uid): nothing on
the way to serving may look the user up (a library's ``getpass.getuser()`` raised KeyError there and
the webhook pod crash-looped on the real node, tests/e2e/node).
"""

from __future__ import annotations

import asyncio
import json
import pwd
import ssl
from pathlib import Path

import aiohttp
import pytest

from devcluster.cluster.controlplane import free_port
from driver.webhook.certificates import self_signed
from driver.webhook.options import WebhookOptions
from driver.webhook.server import ServingCertificate, serve
from tests.support.admission import review_of


async def _until_healthy(session: aiohttp.ClientSession, port: int) -> None:
    for _ in range(200):
        try:
            async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    pytest.fail("the webhook's /healthz never answered")


async def test_serves_over_tls_without_a_passwd_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_user(uid: int) -> None:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_user)
    tls = self_signed(tmp_path, ["127.0.0.1"])
    options = WebhookOptions(port=free_port(), health_port=free_port(), listen="127.0.0.1")
    stop = asyncio.Event()
    server = asyncio.create_task(serve(options, tls, stop))
    trusted = ssl.create_default_context(cadata=tls.cadata.decode())
    bad = {"interface": {"mtu": 10}}
    config = {"opaque": {"driver": "dra.net", "parameters": bad}}
    claim = {"metadata": {"name": "c"}, "spec": {"devices": {"config": [config]}}}
    try:
        async with aiohttp.ClientSession() as session:
            await _until_healthy(session, options.health_port)
            url = f"https://127.0.0.1:{options.port}/any/path"
            async with session.post(url, data=json.dumps(review_of(claim)), ssl=trusted) as resp:
                answer = (await resp.json())["response"]
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert "spec.devices.config[0].opaque.parameters.interface.mtu" in answer["status"]["message"]


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first = self_signed(tmp_path, ["127.0.0.1"])
    certificate = ServingCertificate(first)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=certificate.context)
    port = server.sockets[0].getsockname()[1]

    async def served_ca_trusts(cadata: bytes) -> bool:
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ssl.create_default_context(cadata=cadata.decode())
            )
        except ssl.SSLCertVerificationError:
            return False
        writer.close()
        return True

    try:
        assert await served_ca_trusts(first.cadata) and not certificate.reload_if_changed()
        renewed = self_signed(tmp_path, ["127.0.0.1"])  # the same files, a new CA and key
        assert certificate.reload_if_changed()
        assert await served_ca_trusts(renewed.cadata) and not await served_ca_trusts(first.cadata)
    finally:
        server.close()
        await server.wait_closed()
