"""How the API client reaches the API server, without the kubernetes package: a kubeconfig's server,
CA, client certificate and token (or token file) read into a urllib3 transport, the pod's service
account, what needs the package's machinery instead, every error with its field's name, and the
requests as a local server receives them (plain HTTP, and TLS against the kubeconfig's CA)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.kube import transport
from driver.kube.errors import KubeConfigError, NotFound, Unavailable
from driver.kube.transport import (
    ApiRequest,
    needs_full_client,
    transport_from_kubeconfig,
    transport_in_cluster,
)
from driver.webhook.certificates import TLSFiles, self_signed


def _kubeconfig(tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str = "ctx") -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


class _Handler(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str | None, bytes]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        if self.path.endswith("/missing"):
            status, payload = 404, {"kind": "Status", "message": 'nodes "missing" not found'}
        else:
            status, payload = 200, {"kind": "Node"}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer  # noqa: N815 - http.server's naming

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    _Handler.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return self_signed(tmp_path_factory.mktemp("tls"), ["127.0.0.1"])


def _url(httpd: http.server.HTTPServer, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{httpd.server_address[1]}"


def test_a_token_kubeconfig_sends_the_token_the_query_and_the_body(
    tmp_path: Path, server: http.server.HTTPServer
) -> None:
    path = _kubeconfig(tmp_path, {"server": _url(server) + "/prefix/"}, {"token": "abc"})
    t = transport_from_kubeconfig(path)
    query = [("watch", True), ("labelSelector", "a=b")]
    resp = t.send(ApiRequest("POST", "/api/v1/nodes", query=query, body={"kind": "Node"}))
    assert json.loads(resp.read()) == {"kind": "Node"}
    resp.release_conn()
    (method, url, auth, body) = _Handler.seen[0]
    assert (method, url, auth) == ("POST", "/prefix/api/v1/nodes?watch=true&labelSelector=a%3Db", "Bearer abc")
    assert json.loads(body) == {"kind": "Node"}
    assert t.send(ApiRequest("POST", "/raw", body=b"as is")).status == 200 and _Handler.seen[1][3] == b"as is"


def test_a_token_file_is_relative_to_the_kubeconfig_and_read_again_once_it_may_have_rotated(
    tmp_path: Path, server: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "token").write_text("first\n")
    t = transport_from_kubeconfig(_kubeconfig(tmp_path, {"server": _url(server)}, {"tokenFile": "token"}))
    clock = [1000.0]
    monkeypatch.setattr(transport.time, "monotonic", lambda: clock[0])
    assert t.token.get() == "first"
    (tmp_path / "token").write_text("second\n")
    assert t.token.get() == "first"  # not re-read before the refresh interval
    clock[0] += transport.TOKEN_REFRESH_SECONDS + 1
    assert t.token.get() == "second"
    t.send(ApiRequest("GET", "/api")).release_conn()
    assert _Handler.seen[-1][2] == "Bearer second"


def test_a_token_in_the_kubeconfig_wins_over_its_token_file(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, {"server": "http://127.0.0.1:1"}, {"token": "abc", "tokenFile": "absent"})
    assert transport_from_kubeconfig(path).token.get() == "abc"


def test_an_error_answer_is_typed_and_no_answer_is_unavailable(tmp_path: Path, server: http.server.HTTPServer) -> None:
    t = transport_from_kubeconfig(_kubeconfig(tmp_path, {"server": _url(server)}, {}))
    with pytest.raises(NotFound) as found:
        t.send(ApiRequest("GET", "/api/v1/nodes/missing"))
    assert found.value.status == 404 and 'nodes "missing" not found' in str(found.value)
    assert _Handler.seen[-1][2] is None  # no credentials: no Authorization header
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    gone = transport_from_kubeconfig(_kubeconfig(tmp_path, {"server": f"http://127.0.0.1:{port}"}, {}))
    with pytest.raises(Unavailable) as refused:
        gone.send(ApiRequest("GET", "/api", timeout=2.0))
    assert refused.value.status == 0


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # insecure-skip-tls-verify
def test_https_with_the_kubeconfig_ca_and_a_client_certificate(tmp_path: Path, tls: TLSFiles) -> None:
    assert tls.cadata is not None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tls.certfile, tls.keyfile)
    httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _Handler.seen = []
    try:
        cluster = {"server": _url(httpd, "https"), "certificate-authority-data": base64.b64encode(tls.cadata).decode()}
        user = {"client-certificate": tls.certfile, "client-key-data": base64.b64encode(Path(tls.keyfile).read_bytes())}
        user["client-key-data"] = user["client-key-data"].decode()
        t = transport_from_kubeconfig(_kubeconfig(tmp_path, cluster, user))
        t.send(ApiRequest("GET", "/version")).release_conn()
        assert _Handler.seen[-1][:2] == ("GET", "/version")
        # Without the CA the server's certificate is not trusted; with insecure-skip-tls-verify it is not checked.
        untrusted = transport_from_kubeconfig(_kubeconfig(tmp_path, {"server": _url(httpd, "https")}, {}))
        with pytest.raises(Unavailable):
            untrusted.send(ApiRequest("GET", "/version", timeout=5.0))
        skip = {"server": _url(httpd, "https"), "insecure-skip-tls-verify": True}
        transport_from_kubeconfig(_kubeconfig(tmp_path, skip, {})).send(ApiRequest("GET", "/version")).release_conn()
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_tls_server_name_is_the_name_the_certificate_is_checked_against(tmp_path: Path, tls: TLSFiles) -> None:
    cluster = {"server": "https://10.0.0.1:6443", "tls-server-name": "kubernetes.default", "certificate-authority": ""}
    t = transport_from_kubeconfig(_kubeconfig(tmp_path, cluster, {}))
    kw = t.pool.connection_pool_kw
    assert kw["server_hostname"] == kw["assert_hostname"] == "kubernetes.default"
    assert isinstance(kw["ssl_context"], ssl.SSLContext)
    assert (
        transport_from_kubeconfig(_kubeconfig(tmp_path, {"server": "http://h:80"}, {})).pool.connection_pool_kw.get(
            "ssl_context"
        )
        is None
    )  # plain HTTP: no TLS context at all


@pytest.mark.parametrize(
    ("cluster", "user", "context", "message"),
    [
        ({"server": "https://h"}, {}, "other", "current-context 'other' is not in contexts"),
        ({}, {}, "ctx", "clusters['c'].server is empty"),
        (
            {"server": "https://h", "certificate-authority-data": "abc"},
            {},
            "ctx",
            "certificate-authority-data: not base64",
        ),
        (
            {"server": "https://h", "certificate-authority": "absent.crt"},
            {},
            "ctx",
            "certificate-authority: cannot read",
        ),
        (
            {"server": "https://h"},
            {"client-certificate": "absent.crt"},
            "ctx",
            "users['u'].client-certificate: cannot read",
        ),
    ],
)
def test_a_broken_kubeconfig_names_its_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str, message: str
) -> None:
    with pytest.raises(KubeConfigError, match=re.escape(message)):
        transport_from_kubeconfig(_kubeconfig(tmp_path, cluster, user, context))


def test_a_kubeconfig_that_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot read"):
        transport_from_kubeconfig(str(tmp_path / "absent"))
    (tmp_path / "bad").write_text("a: [")
    with pytest.raises(KubeConfigError, match="not YAML"):
        transport_from_kubeconfig(str(tmp_path / "bad"))
    (tmp_path / "list").write_text("- a\n- b\n")
    with pytest.raises(KubeConfigError, match="not a mapping"):
        transport_from_kubeconfig(str(tmp_path / "list"))


@pytest.mark.parametrize(
    ("user", "full"),
    [
        ({"token": "abc"}, False),
        ({"client-certificate": "c.crt", "client-key": "c.key"}, False),
        ({"exec": {"command": "aws"}}, True),
        ({"auth-provider": {"name": "oidc"}}, True),
        ({"username": "admin", "password": "secret"}, True),
    ],
)
def test_only_plugins_and_basic_auth_need_the_kubernetes_package(
    tmp_path: Path, user: dict[str, Any], full: bool
) -> None:
    assert needs_full_client(_kubeconfig(tmp_path, {"server": "https://h"}, user)) is full


def test_a_multi_file_kubeconfig_needs_the_package_and_an_unreadable_one_does_not(tmp_path: Path) -> None:
    assert needs_full_client(f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    assert not needs_full_client(str(tmp_path / "absent"))  # the light loader reports it by name


def test_in_cluster_the_service_account_and_the_service_address(
    tmp_path: Path, tls: TLSFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls.cadata is not None
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_HOST"):
        transport_in_cluster(str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(KubeConfigError, match="ca.crt"):
        transport_in_cluster(str(tmp_path))
    (tmp_path / "ca.crt").write_bytes(tls.cadata)
    (tmp_path / "token").write_text("sa-token\n")
    t = transport_in_cluster(str(tmp_path))
    assert t.server == "https://[fd00::1]:443" and t.token.get() == "sa-token"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert transport_in_cluster(str(tmp_path)).server == "https://10.96.0.1:443"
