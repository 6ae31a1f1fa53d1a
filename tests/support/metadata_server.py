"""A local stand-in for the cloud instance metadata services, serving recorded responses.

:class:`MetadataServer` listens on 127.0.0.1 and answers the real request paths of one provider
(``tests/fixtures/cloud/<provider>/``) like the real service: wrong or missing headers get the
status the service gives (GCE 403, Azure 400, AWS 401, OCI 401, Alibaba 403), unknown paths 404,
and GCE answers carry ``Metadata-Flavor: Google``. ``mode`` simulates failures: ``down`` (500 on
everything), ``slow`` (answers after ``delay`` s), ``garbage`` (200 with an HTML page).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "cloud"
AWS_TOKEN = (FIXTURES / "aws" / "token.txt").read_text()
ALIBABA_TOKEN = (FIXTURES / "alibaba" / "token.txt").read_text()


@dataclass(frozen=True)
class Route:
    """One recorded endpoint: the body file and the header the real service insists on."""

    file: str
    header: tuple[str, str] | None = None  # (name, value); value "*" = any non-empty
    refusal: int = 403


def _routes(provider: str) -> dict[tuple[str, str], Route]:
    gce = ("Metadata-Flavor", "Google")
    azure = ("Metadata", "true")
    oci = ("Authorization", "Bearer Oracle")
    query = "?api-version=2025-11-11&format=json"
    table = {
        "gce": {
            ("GET", "/"): Route("", gce),
            ("GET", "/computeMetadata/v1/instance/machine-type"): Route("machine-type.txt", gce),
            ("GET", "/computeMetadata/v1/instance/network-interfaces/?recursive=true&alt=json"): Route(
                "network-interfaces.json", gce
            ),
            ("GET", "/computeMetadata/v1/instance/attributes/physical_host"): Route("physical_host.txt", gce),
        },
        "azure": {
            ("GET", "/metadata/instance?api-version=2025-11-11&format=text"): Route("", azure, 400),
            ("GET", f"/metadata/instance/compute{query}"): Route("compute.json", azure, 400),
            ("GET", f"/metadata/instance/network{query}"): Route("network.json", azure, 400),
        },
        "aws": {
            ("PUT", "/latest/api/token"): Route("token.txt", ("X-aws-ec2-metadata-token-ttl-seconds", "*"), 400),
            ("GET", "/latest/dynamic/instance-identity/document"): Route(
                "instance-identity-document.json", ("X-aws-ec2-metadata-token", AWS_TOKEN), 401
            ),
        },
        "oke": {
            ("GET", "/opc/v2/instance/"): Route("instance.json", oci, 401),
            ("GET", "/opc/v2/host/"): Route("host.json", oci, 401),
        },
        "alibaba": {
            ("PUT", "/latest/api/token"): Route("token.txt", ("X-aliyun-ecs-metadata-token-ttl-seconds", "*")),
            ("GET", "/latest/meta-data/instance-id"): Route(
                "instance-id.txt", ("X-aliyun-ecs-metadata-token", ALIBABA_TOKEN)
            ),
            ("GET", "/latest/meta-data/instance/instance-type"): Route(
                "instance-type.txt", ("X-aliyun-ecs-metadata-token", ALIBABA_TOKEN)
            ),
        },
    }
    return table[provider]


@dataclass
class MetadataServer:
    """One provider's metadata service on 127.0.0.1; use as a context manager; ``url`` is its base URL."""

    provider: str
    mode: str = "ok"  # ok | down | slow | garbage
    delay: float = 5.0
    overrides: dict[str, bytes] = field(default_factory=dict)  # file name -> body
    requests: list[tuple[str, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def body(self, name: str) -> bytes:
        if name in self.overrides:
            return self.overrides[name]
        return (FIXTURES / self.provider / name).read_bytes() if name else b"computeMetadata/\n"

    def __enter__(self) -> MetadataServer:
        routes = _routes(self.provider)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, method: str) -> None:
                outer.requests.append((method, self.path))
                if outer.mode == "slow":
                    time.sleep(outer.delay)
                if outer.mode == "down":
                    return self._send(500, b"internal error")
                if outer.mode == "garbage":
                    return self._send(200, b"<html><body>captive portal</body></html>", "text/html")
                route = routes.get((method, self.path))
                if route is None:
                    return self._send(404, b"not found")
                if route.header is not None:
                    name, want = route.header
                    got = self.headers.get(name)
                    if not got or (want != "*" and got != want):
                        return self._send(route.refusal, b"missing or wrong " + name.encode())
                body = outer.body(route.file)
                ctype = "application/json" if route.file.endswith(".json") else "text/plain"
                self._send(200, body, ctype)

            def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                if outer.provider == "gce":
                    self.send_header("Metadata-Flavor", "Google")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_PUT(self) -> None:
                self._answer("PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
