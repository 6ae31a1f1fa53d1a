"""dranet's webhook profile provider API against a local HTTP server: requests, answers, failures."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.profiles.provider_client import Capabilities, DeviceIdentifiers, ProviderClient, ProviderError
from tests.support.profile_webhook import ProfileWebhook

DEVICE = DeviceIdentifiers(name="eth1", mac_address="02:00:00:00:00:01", pci_address="0000:8a:00.0")
CLAIM = {"metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"}, "status": {"reservedFor": [{"name": "p"}]}}


@pytest.fixture
def hook() -> Iterator[ProfileWebhook]:
    server = ProfileWebhook(profiles={"acme/ipam": {"interface": {"addresses": ["10.9.0.5/24"]}}}).start()
    try:
        yield server
    finally:
        server.stop()


def test_capabilities_and_a_profile_round_trip_with_dranets_bodies(hook: ProfileWebhook) -> None:
    client = ProviderClient(hook.url, timeout=2)
    assert client.capabilities() == Capabilities(profile_provider=True)
    answer = client.get_profile_config(DEVICE, CLAIM, {"profile": "acme/ipam"})
    assert answer == {"interface": {"addresses": ["10.9.0.5/24"]}}
    assert hook.calls("/GetProfileConfig") == [
        {
            "device": {"name": "eth1", "mac_address": "02:00:00:00:00:01", "pci_address": "0000:8a:00.0"},
            "claim": CLAIM,
            "config": {"profile": "acme/ipam"},
        }
    ]
    client.release_profile_config(DEVICE, "uid-1", {"profile": "acme/ipam"})
    assert hook.calls("/ReleaseProfileConfig") == [
        {"device": DEVICE.to_json(), "claim_uid": "uid-1", "config": {"profile": "acme/ipam"}}
    ]


def test_a_refusal_carries_the_status_and_the_providers_message(hook: ProfileWebhook) -> None:
    client = ProviderClient(hook.url, timeout=2)
    with pytest.raises(ProviderError, match=r"/GetProfileConfig returned HTTP 404: profile 'nope' not found") as e:
        client.get_profile_config(DEVICE, CLAIM, {"profile": "nope"})
    assert e.value.status == 404
    hook.status["/GetProfileConfig"] = (200, "{not json")
    with pytest.raises(ProviderError, match="answer is not JSON"):
        client.get_profile_config(DEVICE, CLAIM, {"profile": "acme/ipam"})


def test_endpoint_down_and_endpoint_slow_are_one_line_errors(hook: ProfileWebhook) -> None:
    hook.delay = 1.0
    with pytest.raises(ProviderError, match=r"/GetProfileConfig: no answer within 0.2s"):
        ProviderClient(hook.url, timeout=0.2).get_profile_config(DEVICE, CLAIM, {"profile": "acme/ipam"})
    url = hook.url
    hook.stop()
    with pytest.raises(ProviderError, match=r"/health: Connection refused"):
        ProviderClient(url, timeout=1).capabilities()


def test_capabilities_must_be_booleans(hook: ProfileWebhook) -> None:
    hook.status["/health"] = (200, json.dumps({"profileProvider": "yes"}))
    with pytest.raises(ProviderError, match="not an object of booleans"):
        ProviderClient(hook.url, timeout=1).capabilities()


def test_unix_socket_urls_as_dranet(tmp_path: Path) -> None:
    path = str(tmp_path / "provider.sock")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"profileProvider": true, "runtimeHook": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class UnixServer(http.server.HTTPServer):
        address_family = socket.AF_UNIX

        def server_bind(self) -> None:
            self.socket.bind(self.server_address)
            self.server_name, self.server_port = "localhost", 0

    server = UnixServer(path, Handler)  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        caps = ProviderClient(f"unix://{path}", timeout=2).capabilities()
        assert caps == Capabilities(profile_provider=True, runtime_hook=True)
    finally:
        server.shutdown()
        server.server_close()
        os.unlink(path)


@pytest.mark.parametrize("url", ["ftp://x", "unix://", "http://", "localhost:8080"])
def test_bad_urls_are_refused_naming_the_flag(url: str) -> None:
    with pytest.raises(ValueError, match="--webhook-url"):
        ProviderClient(url, timeout=1)
