"""How :class:`driver.kube.client.KubeClient` reaches the API server: urllib3 with the kubeconfig's or
the pod's credentials, or the kubernetes package's ApiClient for what only it implements.

The connection settings are read straight from the kubeconfig (server, CA, token/tokenFile,
client certificate) or the in-cluster service account, so the node daemon does not import the
``kubernetes`` package: importing it loads ~770 generated model modules and costs ~47 MB of
resident memory per process (measured with kubernetes 36.0.3), more than half of the daemon's
budget. Kubeconfigs that need the package's machinery (``exec`` and ``auth-provider``
credential plugins, basic auth, a multi-file ``KUBECONFIG``) fall back to it lazily
(:class:`KubernetesPackageTransport`). Every failure is a typed :mod:`driver.kube.errors` error.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

import urllib3
import yaml

from driver.kube.errors import KubeConfigError, Unavailable, error_for

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REFRESH_SECONDS = 60.0  # bound service-account tokens rotate; re-read the file this often


@dataclass
class ApiRequest:
    """One HTTP request to the API server, as :class:`~driver.kube.client.KubeClient` builds it."""

    method: str
    path: str
    query: list[tuple[str, Any]] = field(default_factory=list)
    content_type: str = "application/json"
    body: Any = None  # bytes/str sent as is, anything else as JSON
    timeout: float | tuple[float, float] = 10.0  # total, or (connect, read) for watches


class Transport(Protocol):
    """What :class:`~driver.kube.client.KubeClient` needs: send a request, get the unread response.

    The response has ``data`` or ``stream()`` and ``release_conn()`` (urllib3's); a non-2xx answer
    raises a :mod:`driver.kube.errors` error.
    """

    def send(self, request: ApiRequest) -> Any: ...


class _TokenSource:
    """A bearer token, fixed or read from a file that is re-read periodically (rotation)."""

    def __init__(self, token: str | None = None, token_file: str | None = None) -> None:
        self._token = token
        self._file = token_file
        self._read_at = 0.0
        self._lock = threading.Lock()

    def get(self) -> str | None:
        """The current token (re-read from the file when it may have rotated)."""
        if self._file is None:
            return self._token
        with self._lock:
            if self._token is None or time.monotonic() - self._read_at > TOKEN_REFRESH_SECONDS:
                self._token = Path(self._file).read_text().strip()
                self._read_at = time.monotonic()
            return self._token


class Urllib3Transport:
    """HTTP(S) to one API server over a pooled urllib3 connection manager."""

    def __init__(
        self,
        server: str,
        ssl_context: ssl.SSLContext | None,
        token: _TokenSource,
        maxsize: int = 16,
        server_name: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self._prefix = urllib3.util.parse_url(self.server).path or ""  # a server URL may carry a path
        self.token = token
        # maxsize matches prepare.CLAIM_LOOKUP_THREADS: one kept-alive connection per lookup thread.
        kwargs: dict[str, Any] = {"maxsize": maxsize, "retries": False}
        if ssl_context is not None:
            kwargs["ssl_context"] = ssl_context
        if server_name:  # kubeconfig tls-server-name: SNI and certificate name differ from the URL host
            kwargs.update(server_hostname=server_name, assert_hostname=server_name)
        self.pool = urllib3.PoolManager(**kwargs)
        # The one server's connection pool, looked up once: PoolManager.request would parse the
        # URL and build the pool key again for every request.
        self._connections = self.pool.connection_from_url(self.server)

    def send(self, request: ApiRequest) -> urllib3.BaseHTTPResponse:
        """Send one request; the response body is left unread (watches stream it)."""
        headers = {"Accept": "application/json", "Content-Type": request.content_type}
        token = self.token.get()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = request.path
        if request.query:
            url += "?" + urlencode([(k, str(v).lower() if isinstance(v, bool) else v) for k, v in request.query])
        body = request.body
        data = body if body is None or isinstance(body, (bytes, str)) else json.dumps(body)
        timeout: Any = request.timeout
        if isinstance(timeout, tuple):
            timeout = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        try:
            resp = self._connections.urlopen(
                request.method,
                self._prefix + url,
                body=data,
                headers=headers,
                timeout=timeout,
                preload_content=False,
                redirect=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:  # no answer at all: refused, reset, timed out
            raise Unavailable(
                status=0, reason="Unavailable", message=f"{request.method} {request.path}: {exc}"
            ) from exc
        if resp.status >= 300:
            raw = resp.read()
            resp.release_conn()
            raise error_for(resp.status, resp.reason or "", raw)
        return resp


def _file_or_data(entry: dict[str, Any], key: str, base: Path, where: str) -> bytes | None:
    """``key`` (a path, relative to the kubeconfig) or ``key-data`` (base64) of a kubeconfig entry."""
    if entry.get(f"{key}-data"):
        try:
            return base64.b64decode(entry[f"{key}-data"])
        except ValueError as exc:
            raise KubeConfigError(f"{where}.{key}-data: not base64: {exc}") from None
    if entry.get(key):
        path = base / os.path.expanduser(entry[key])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise KubeConfigError(f"{where}.{key}: cannot read {path}: {exc}") from None
    return None


def _ssl_context(ca: bytes | None, cert: bytes | None, key: bytes | None, insecure: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        # ssl loads certificates from files only; use private temp files, removed at once.
        with tempfile.TemporaryDirectory(prefix="dranet-kube-") as tmp:
            cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            for path, content in ((cert_path, cert), (key_path, key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(content)
            ctx.load_cert_chain(str(cert_path), str(key_path))
    return ctx


def needs_full_client(kubeconfig: str) -> bool:
    """True when the kubeconfig uses features only the kubernetes package implements."""
    if os.pathsep in kubeconfig:
        return True
    try:
        config = yaml.safe_load(Path(kubeconfig).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return False  # let the light loader report the error with its field name
    user = _named(config, "users", "user", _context(config).get("user"))
    return any(user.get(k) for k in ("exec", "auth-provider", "username", "password"))


def _context(config: dict[str, Any]) -> dict[str, Any]:
    return _named(config, "contexts", "context", config.get("current-context"))


def _named(config: dict[str, Any], section: str, inner: str, name: Any) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry.get(inner) or {}
    return {}


def transport_from_kubeconfig(kubeconfig: str) -> Urllib3Transport:
    """A transport from a kubeconfig file (token, tokenFile, client cert, CA; no plugins)."""
    path = Path(kubeconfig)
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not YAML: {exc}") from None
    if not isinstance(config, dict):
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not a mapping")
    current = config.get("current-context")
    context = _context(config)
    if not context:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: current-context {current!r} is not in contexts")
    cluster = _named(config, "clusters", "cluster", context.get("cluster"))
    user = _named(config, "users", "user", context.get("user"))
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: clusters[{context.get('cluster')!r}].server is empty")
    base = path.parent
    where_c, where_u = f"clusters[{context.get('cluster')!r}]", f"users[{context.get('user')!r}]"
    ctx = None
    if server.startswith("https://"):
        ctx = _ssl_context(
            _file_or_data(cluster, "certificate-authority", base, where_c),
            _file_or_data(user, "client-certificate", base, where_u),
            _file_or_data(user, "client-key", base, where_u),
            bool(cluster.get("insecure-skip-tls-verify")),
        )
    token_file = user.get("tokenFile")
    token = _TokenSource(user.get("token"), str(base / token_file) if token_file and not user.get("token") else None)
    return Urllib3Transport(server, ctx, token, server_name=cluster.get("tls-server-name"))


def transport_in_cluster(sa_dir: str = SERVICE_ACCOUNT_DIR) -> Urllib3Transport:
    """A transport from the pod's service account (token re-read for rotation)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            "in-cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (pass --kubeconfig outside a pod)"
        )
    if ":" in host:
        host = f"[{host}]"
    try:
        ca = Path(sa_dir, "ca.crt").read_bytes()
    except OSError as exc:
        raise KubeConfigError(f"in-cluster: cannot read {sa_dir}/ca.crt: {exc}") from None
    token = _TokenSource(token_file=str(Path(sa_dir, "token")))
    return Urllib3Transport(f"https://{host}:{port}", _ssl_context(ca, None, None, False), token)


class KubernetesPackageTransport:
    """The kubernetes package's ApiClient (for exec/auth-provider kubeconfigs), errors typed as ours."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.api_client = k8s_client.ApiClient(configuration)

    def send(self, request: ApiRequest) -> Any:
        """Send one request through ``ApiClient.call_api``; the response body is left unread."""
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "Content-Type": request.content_type}
        try:
            resp = self.api_client.call_api(
                request.path,
                request.method,
                query_params=request.query,
                header_params=headers,
                body=request.body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=request.timeout,
            )
        except ApiException as exc:
            body = exc.body if isinstance(exc.body, (bytes, str)) else str(exc.body or "")
            raise error_for(int(exc.status or 0), str(exc.reason or ""), body) from None
        return resp[0] if isinstance(resp, tuple) else resp
