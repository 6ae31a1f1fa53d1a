"""The HTTP client of the instance metadata services, and the one place their URLs are built.

Every provider asks its own well-known host (``http://169.254.169.254``, ``http://metadata.google.internal``,
``http://100.100.100.200``); ``--cloud-metadata-url`` replaces that host (scheme, host, port and an
optional path prefix) for all of them while the paths and headers stay the real ones, so tests and
proxies see exactly what the real service would. Environment proxies are ignored on purpose: the
services answer only link-local requests from the VM itself (every provider documents this).

Each request has a short timeout and a size cap: a service that hangs or streams garbage costs a
bounded amount of time and memory, and every failure is one exception type, :class:`MetadataError`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT = 2.0
"""Seconds per request: the real services answer in milliseconds from inside the VM."""
MAX_RESPONSE_BYTES = 1 << 20
"""No metadata document we read is near 1 MiB; more is garbage (or not a metadata service)."""


class MetadataError(Exception):
    """A metadata request failed: unreachable, an HTTP error, too large, or not the expected format."""


@dataclass(frozen=True)
class Response:
    """A successful answer: body and the headers that identify a service (lower-case names)."""

    body: bytes
    headers: dict[str, str]

    def text(self) -> str:
        """The body as stripped text (plain-text endpoints)."""
        try:
            return self.body.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise MetadataError(f"response is not UTF-8 text: {exc}") from None

    def json(self) -> Any:
        """The body as JSON; :class:`MetadataError` when it is not."""
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise MetadataError(f"response is not JSON: {exc}") from None


@dataclass(frozen=True)
class MetadataClient:
    """Requests to the metadata services; ``base_url`` (``--cloud-metadata-url``) replaces their hosts."""

    base_url: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    def url(self, host: str, path: str) -> str:
        """The URL of ``path`` on the provider's ``host`` (``http://169.254.169.254``), or under ``base_url``."""
        return (self.base_url or host).rstrip("/") + path

    def request(self, method: str, host: str, path: str, headers: dict[str, str] | None = None) -> Response:
        """One request; a non-2xx status, a network error or an oversized body raise :class:`MetadataError`."""
        url = self.url(host, path)
        req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "PUT" else None)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=self.timeout) as resp:
                body = resp.read(MAX_RESPONSE_BYTES + 1)
                found = {k.lower(): v for k, v in resp.headers.items()}
        except urllib.error.HTTPError as exc:
            raise MetadataError(f"{method} {url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, malformed URLs
            raise MetadataError(f"{method} {url}: {getattr(exc, 'reason', exc)}") from None
        if len(body) > MAX_RESPONSE_BYTES:
            raise MetadataError(f"{method} {url}: response larger than {MAX_RESPONSE_BYTES} bytes")
        return Response(body, found)

    def get(self, host: str, path: str, headers: dict[str, str] | None = None) -> Response:
        """GET ``path``."""
        return self.request("GET", host, path, headers)

    def put(self, host: str, path: str, headers: dict[str, str] | None = None) -> Response:
        """PUT ``path`` with an empty body (IMDSv2 session tokens)."""
        return self.request("PUT", host, path, headers)
