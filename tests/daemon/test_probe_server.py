"""The HTTP probe server: /healthz answers 503 until the daemon is ready, /metrics serves Prometheus text;
what a client that is not a probe sends (other paths and methods, slow or oversized heads) is answered or dropped."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from driver.daemon.probe_server import MAX_HEAD, ProbeServer, parse_bind_address
from driver.metrics import Metrics


def _get(url: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


async def get(url: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of one request, from the standard library's client in a thread."""
    return await asyncio.to_thread(_get, url, method)


async def test_probe_server_ready_gate_and_metrics() -> None:
    ready = {"value": False}
    metrics = Metrics()
    metrics.set_devices(5, 2)
    server = ProbeServer("127.0.0.1:0", metrics, lambda: ready["value"])
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert (await get(base + "/healthz"))[:2] == (503, "not ready\n")
        ready["value"] = True
        assert (await get(base + "/healthz"))[:2] == (200, "ok\n")
        status, text, headers = await get(base + "/metrics?debug=1")
        assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert 'dranet_driver_published_devices_total{feature="total"} 5.0' in text
        assert 'dranet_driver_published_devices_total{feature="rdma"} 2.0' in text
        assert int(headers["Content-Length"]) == len(text.encode())
    finally:
        await server.stop()


async def test_problems_turn_healthz_503_with_the_reason_and_livez_stays_200() -> None:
    problems: list[str] = []
    server = ProbeServer("127.0.0.1:0", Metrics(), lambda: True, lambda: problems)
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        problems.append("cannot save state to /x/checkpoint.json: No space left on device (ENOSPC)")
        status, text, _ = await get(base + "/healthz")
        assert status == 503 and "checkpoint.json" in text
        assert (await get(base + "/livez"))[0] == 200
        problems.clear()
        assert (await get(base + "/healthz"))[0] == 200
    finally:
        await server.stop()


async def test_other_paths_methods_and_bad_clients() -> None:
    server = ProbeServer("127.0.0.1:0", Metrics(), lambda: True)
    await server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert (await get(base + "/nope"))[0] == 404
        assert (await get(base + "/healthz", "POST"))[0] == 405
        status, text, headers = await get(base + "/healthz", "HEAD")
        assert (status, text, headers["Content-Length"]) == (200, "", "3")
        # A head larger than the limit, and a client that sends half a head and closes: dropped,
        # and the server still answers the next client.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD * 2) + b"\r\n\r\n")
        try:
            await writer.drain()
            answer = await reader.read()
        except ConnectionError:  # reset: the server closed with our bytes unread
            answer = b""
        assert answer == b""  # closed without an answer
        writer.close()
        with socket.create_connection(("127.0.0.1", server.port)) as half:
            half.sendall(b"GET /heal")
        assert (await get(base + "/livez"))[0] == 200
    finally:
        await server.stop()


async def test_the_default_address_answers_on_ipv4_and_ipv6() -> None:
    """``:PORT`` (the chart's) listens on both families: an IPv6-only node's kubelet probes over IPv6."""
    with socket.socket(socket.AF_INET6) as probe:  # a port free on both families
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        probe.bind(("::", 0))
        port = probe.getsockname()[1]
    server = ProbeServer(f":{port}", Metrics(), lambda: True)
    await server.start()
    try:
        assert (await get(f"http://127.0.0.1:{port}/healthz"))[0] == 200
        assert (await get(f"http://[::1]:{port}/healthz"))[0] == 200
    finally:
        await server.stop()


def test_bind_address_errors() -> None:
    assert parse_bind_address(":9177") == ("", 9177)  # every address, IPv4 and IPv6
    assert parse_bind_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="--bind-address"):
        parse_bind_address("localhost")


async def test_readyz_waits_for_serving_and_a_busy_port_is_asked_for(tmp_path: Path) -> None:
    """Rolling update on a host network: the new instance asks for the port; once the old one
    lets go it binds, and its /readyz turns 200 only when it is serving (registered). Each one's
    port file (its pod's startup probe) exists exactly while it serves the port."""
    old_file, new_file = tmp_path / "old", tmp_path / "new"
    old = ProbeServer("127.0.0.1:0", Metrics(), lambda: True, port_file=str(old_file))
    await old.start()
    assert old_file.read_text() == f"{old.port}\n"
    asked: list[int] = []

    def claim_port(port: int) -> None:  # what the old daemon does when it sees the request
        asked.append(port)
        assert not new_file.exists(), "the new pod is not started while the old instance has the port"
        if len(asked) == 3:
            asyncio.get_running_loop().create_task(old.stop())

    serving = {"value": False}
    new = ProbeServer(
        f"127.0.0.1:{old.port}",
        Metrics(),
        lambda: True,
        serving=lambda: serving["value"],
        claim_port=claim_port,
        port_file=str(new_file),
    )
    await new.start()
    try:
        assert not old_file.exists() and new_file.read_text() == f"{new.port}\n"
        assert asked and set(asked) == {old.port} and new.port == old.port
        base = f"http://127.0.0.1:{new.port}"
        assert (await get(base + "/healthz"))[0] == 200
        assert (await get(base + "/readyz"))[0] == 503
        serving["value"] = True
        assert (await get(base + "/readyz"))[0] == 200
    finally:
        await new.stop()
        await old.stop()
    assert not new_file.exists()
