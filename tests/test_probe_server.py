"""The HTTP probe server: /healthz answers 503 until the daemon is ready, /metrics serves Prometheus text."""

from __future__ import annotations

import aiohttp
import pytest

from driver.metrics import Metrics
from driver.probe_server import ProbeServer, parse_bind_address


async def test_probe_server_ready_gate_and_metrics() -> None:
    ready = {"value": False}
    metrics = Metrics()
    metrics.set_devices(5, 2)
    server = ProbeServer("127.0.0.1:0", metrics, lambda: ready["value"])
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.port}"
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 503
            ready["value"] = True
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 200
            async with http.get(base + "/metrics") as resp:
                text = await resp.text()
                assert (
                    'dranet_driver_published_devices_total{feature="total"} 5.0' in text
                    and 'dranet_driver_published_devices_total{feature="rdma"} 2.0' in text
                )
    finally:
        await server.stop()


async def test_problems_turn_healthz_503_with_the_reason_and_livez_stays_200() -> None:
    problems: list[str] = []
    server = ProbeServer("127.0.0.1:0", Metrics(), lambda: True, lambda: problems)
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{server.port}"
            problems.append("cannot save state to /x/checkpoint.json: No space left on device (ENOSPC)")
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 503 and "checkpoint.json" in await resp.text()
            async with http.get(base + "/livez") as resp:
                assert resp.status == 200
            problems.clear()
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 200
    finally:
        await server.stop()


def test_bind_address_errors() -> None:
    assert parse_bind_address(":9177") == ("0.0.0.0", 9177)
    assert parse_bind_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="--bind-address"):
        parse_bind_address("localhost")


async def test_readyz_waits_for_serving_and_a_busy_port_is_asked_for() -> None:
    """Rolling update on a host network: the new instance asks for the port; once the old one
    lets go it binds, and its /readyz turns 200 only when it is serving (registered)."""
    import asyncio

    old = ProbeServer("127.0.0.1:0", Metrics(), lambda: True)
    await old.start()
    asked: list[int] = []

    def claim_port(port: int) -> None:  # what the old daemon does when it sees the request
        asked.append(port)
        if len(asked) == 3:
            asyncio.get_running_loop().create_task(old.stop())

    serving = {"value": False}
    new = ProbeServer(
        f"127.0.0.1:{old.port}", Metrics(), lambda: True, serving=lambda: serving["value"], claim_port=claim_port
    )
    await new.start()
    try:
        assert asked and set(asked) == {old.port} and new.port == old.port
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{new.port}"
            async with http.get(base + "/healthz") as resp:
                assert resp.status == 200
            async with http.get(base + "/readyz") as resp:
                assert resp.status == 503
            serving["value"] = True
            async with http.get(base + "/readyz") as resp:
                assert resp.status == 200
    finally:
        await new.stop()
        await old.stop()
