"""The client of dranet's webhook profile provider, spoken over HTTP, HTTPS or a unix socket.

The wire format is dranet's (``pkg/cloudprovider/webhook``):

* ``GET /health`` answers the capabilities, ``{"cloudProvider": bool, "profileProvider": bool,
  "runtimeHook": bool}``; a provider without ``profileProvider`` is refused at start.
* ``POST /GetProfileConfig`` with ``{"device": {"mac_address", "pci_address", "name"}, "claim":
  <the whole ResourceClaim>, "config": <the claim's merged NetworkConfig>}`` answers the
  profile's NetworkConfig (200), or refuses it with any other status and a message body.
* ``POST /ReleaseProfileConfig`` with ``{"device": ..., "claim_uid": "<uid>", "config": ...}``
  (NodeUnprepareResources has no ResourceClaim) frees what GetProfileConfig allocated; 200.

Every failure is a :class:`ProviderError` with a one-line reason (the endpoint, the status and
the start of the body, or the connection error): it becomes the claim's error, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from driver.model.untrusted import InputError, load_json

PATH_HEALTH = "/health"
PATH_GET_PROFILE_CONFIG = "/GetProfileConfig"
PATH_RELEASE_PROFILE_CONFIG = "/ReleaseProfileConfig"
MAX_RESPONSE_BYTES = 1 << 20
"""A profile's config is a few hundred bytes; anything past 1 MiB is not one."""


class ProviderError(Exception):
    """The endpoint could not be asked, or refused: ``reason`` names the endpoint and why."""

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Capabilities:
    """What ``GET /health`` says the provider implements."""

    cloud_provider: bool = False
    profile_provider: bool = False
    runtime_hook: bool = False


@dataclass(frozen=True)
class DeviceIdentifiers:
    """dranet's ``DeviceIdentifiers``: how the provider recognises the NIC."""

    name: str = ""
    mac_address: str = ""
    pci_address: str = ""

    def to_json(self) -> dict[str, str]:
        """dranet's JSON form (``mac_address`` and ``pci_address`` left out when empty)."""
        out = {"name": self.name}
        if self.mac_address:
            out["mac_address"] = self.mac_address
        if self.pci_address:
            out["pci_address"] = self.pci_address
        return out


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (``unix:///run/provider.sock``), as dranet's client dials it."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class ProviderClient:
    """One provider endpoint (``--webhook-url``); each call opens its own connection (thread-safe).

    ``timeout`` bounds each call (connect, send, and every read): prepare must answer the kubelet.
    """

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "unix"):
            raise ValueError(f"--webhook-url {url!r}: the scheme must be http, https or unix")
        if parts.scheme == "unix" and not parts.path:
            raise ValueError(f"--webhook-url {url!r}: a unix URL needs a socket path (unix:///run/x.sock)")
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError(f"--webhook-url {url!r}: no host")
        self.url, self.timeout = url.rstrip("/"), timeout
        self._parts = parts
        self._base = "" if parts.scheme == "unix" else parts.path.rstrip("/")

    def _connection(self) -> http.client.HTTPConnection:
        p = self._parts
        if p.scheme == "unix":
            return _UnixConnection(p.path, self.timeout)
        if p.scheme == "https":
            return http.client.HTTPSConnection(
                p.hostname or "", p.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(p.hostname or "", p.port, timeout=self.timeout)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """Send one request; the decoded JSON answer (None for an empty one) or :class:`ProviderError`."""
        where = f"{self.url}{path}"
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn = self._connection()
        try:
            conn.request(method, self._base + path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read(MAX_RESPONSE_BYTES + 1)
        except TimeoutError:
            raise ProviderError(f"{where}: no answer within {self.timeout:g}s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise ProviderError(f"{where}: {getattr(exc, 'strerror', None) or exc or type(exc).__name__}") from None
        finally:
            conn.close()
        if response.status != 200:
            text = raw[:300].decode("utf-8", "replace").strip().replace("\n", " ")
            raise ProviderError(f"{where} returned HTTP {response.status}: {text or response.reason}", response.status)
        if len(raw) > MAX_RESPONSE_BYTES:
            raise ProviderError(f"{where}: answer larger than {MAX_RESPONSE_BYTES} bytes")
        if not raw.strip():
            return None
        try:
            return load_json(raw)
        except InputError as exc:
            raise ProviderError(f"{where}: answer is not JSON: {exc}") from None

    def capabilities(self) -> Capabilities:
        """``GET /health``: what the provider implements (a non-object or wrong types: :class:`ProviderError`)."""
        answer = self._call("GET", PATH_HEALTH, None)
        if not isinstance(answer, dict) or any(not isinstance(v, bool) for v in answer.values()):
            raise ProviderError(f"{self.url}{PATH_HEALTH}: capabilities are not an object of booleans: {answer!r}")
        return Capabilities(
            cloud_provider=answer.get("cloudProvider", False),
            profile_provider=answer.get("profileProvider", False),
            runtime_hook=answer.get("runtimeHook", False),
        )

    def get_profile_config(self, device: DeviceIdentifiers, claim: dict[str, Any], config: dict[str, Any]) -> Any:
        """``POST /GetProfileConfig``: the profile's config as the provider answered it (JSON, not yet checked)."""
        body = {"device": device.to_json(), "claim": claim, "config": config}
        return self._call("POST", PATH_GET_PROFILE_CONFIG, body)

    def release_profile_config(self, device: DeviceIdentifiers, claim_uid: str, config: dict[str, Any]) -> None:
        """``POST /ReleaseProfileConfig``: free what the profile allocated for ``claim_uid`` on ``device``."""
        body = {"device": device.to_json(), "claim_uid": claim_uid, "config": config}
        self._call("POST", PATH_RELEASE_PROFILE_CONFIG, body)
