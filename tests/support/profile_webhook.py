"""A profile provider for tests: dranet's webhook API served on 127.0.0.1 (or a unix socket) by a thread.

It records every request (method, path, JSON body) and answers from ``profiles`` (profile name
-> the NetworkConfig JSON to return), ``status`` overrides (path -> (status, body)) and
``capabilities``; ``delay`` makes every answer late.
"""

from __future__ import annotations

import json
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ProfileWebhook:
    """The provider's behaviour and what it was asked."""

    profiles: dict[str, Any] = field(default_factory=dict)
    capabilities: dict[str, bool] = field(default_factory=lambda: {"cloudProvider": False, "profileProvider": True})
    status: dict[str, tuple[int, str]] = field(default_factory=dict)
    delay: float = 0.0
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""
    _server: socketserver.BaseServer | None = None

    def calls(self, path: str) -> list[Any]:
        """The JSON bodies of the requests to ``path``, in order."""
        return [body for _, p, body in self.requests if p == path]

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, str]:
        self.requests.append((method, path, body))
        if self.delay:
            time.sleep(self.delay)
        if path in self.status:
            return self.status[path]
        if path == "/health" and method == "GET":
            return 200, json.dumps(self.capabilities)
        if path == "/GetProfileConfig" and method == "POST":
            name = ((body or {}).get("config") or {}).get("profile")
            if name not in self.profiles:
                return 404, f"profile {name!r} not found"
            return 200, json.dumps(self.profiles[name])
        if path == "/ReleaseProfileConfig" and method == "POST":
            return 200, ""
        return 404, "no such endpoint"

    def start(self) -> ProfileWebhook:
        """Serve on 127.0.0.1 (a free port) in a daemon thread; :attr:`url` is set."""
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b""
                status, text = hook._answer(method, self.path, json.loads(raw) if raw else None)
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the slow-provider tests)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent): the port then refuses connections."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
