"""A tiny in-memory kube-apiserver stand-in on 127.0.0.1 for node-plugin tests and benchmarks.

It serves what the node driver calls, as plain JSON over HTTP:

* ``GET  /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>`` (configurable delay,
  and an event per GET so a test can act while a call is in flight);
  or, from ``raw_claims``, bytes written by the test (JSON that ``json.dumps`` cannot produce);
* ``PATCH .../resourceclaims/<name>/status`` (recorded, merged into ``status``);
* ``GET /apis/resource.k8s.io/v1/resourceclaims`` (all claims, one page);
* ``GET /api/v1/nodes/<name>``;
* ``POST /api/v1/namespaces/<ns>/events`` (recorded in :attr:`FakeAPIServer.posted_events`);
* ResourceSlices: list (``fieldSelector`` ``spec.nodeName=``/``spec.driver=``), get, create
  (``generateName``), replace, delete.

:meth:`FakeAPIServer.write_kubeconfig` writes a kubeconfig for it, so
``KubeClient.from_kubeconfig`` works unchanged. The real apiserver is exercised elsewhere.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

CLAIM_RE = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)(/status)?$")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"  # the list in all namespaces
NODE_RE = re.compile(r"^/api/v1/nodes/([^/]+)$")
EVENTS_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/events$")


@dataclass
class FakeAPIServer:
    """In-memory objects behind a threaded HTTP server; use as a context manager."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Claims served byte for byte (what json.dumps cannot write: duplicate keys, 5000-digit integers).
    raw_claims: dict[tuple[str, str], bytes] = field(default_factory=dict)
    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    claim_delay: float = 0.0  # seconds each claim GET sleeps before answering
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) log
    claim_get_started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []  # ResourceSlice watch events, in order
        self.posted_events: list[tuple[str, dict[str, Any]]] = []  # (namespace, Event) as POSTed
        self._changed = threading.Condition(self._lock)
        self._stopping = False
        self._halt = threading.Event()  # interrupts claim delays on stop: no handler outlives the test
        self._rv = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeAPIServer:
        """Listen on an ephemeral 127.0.0.1 port in a daemon thread."""
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._halt.set()
        with self._lock:
            self._stopping = True
            self._changed.notify_all()  # end open watches
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig (token auth, plain HTTP) pointing at this server."""
        path = Path(path)
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fake",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                }
            )
        )
        return path

    # -- objects -----------------------------------------------------------------------------

    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a ResourceClaim (metadata.namespace/name/uid required)."""
        meta = claim["metadata"]
        with self._lock:
            meta.setdefault("resourceVersion", str(next(self._rv)))
            self.claims[(meta["namespace"], meta["name"])] = claim
        return claim

    def count(self, method: str, prefix: str) -> int:
        """How many requests with ``method`` had a path starting with ``prefix``."""
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and p.startswith(prefix))

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        """Record a watch event (caller holds the lock)."""
        self._events.append({"type": kind, "object": json.loads(json.dumps(obj))})
        self._changed.notify_all()


def make_claim(
    namespace: str,
    name: str,
    uid: str,
    results: list[dict[str, Any]],
    configs: list[dict[str, Any]] | None = None,
    pods: list[str] | None = None,
) -> dict[str, Any]:
    """An allocated v1 ResourceClaim with the given allocation results and configs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": results, "config": configs or []}},
            "reservedFor": [{"resource": "pods", "name": f"pod-{p}", "uid": p} for p in (pods or [])],
        },
    }


def result(device: str, pool: str, request: str = "nic", driver: str = "dra.net") -> dict[str, Any]:
    """One ``status.allocation.devices.results[]`` entry."""
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class _Handler(BaseHTTPRequestHandler):
    api: FakeAPIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # like Go servers: no 40 ms Nagle/delayed-ACK stalls
    _raw_body: bytes = b""  # the current request's body, read up front by _route

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests print their own
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_raw(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _claim_list(self) -> bytes:
        """Every claim in one ResourceClaimList, the raw ones byte for byte."""
        with self.api._lock:
            items = [json.dumps(c).encode() for c in self.api.claims.values()] + list(self.api.raw_claims.values())
        head = b'{"kind": "ResourceClaimList", "apiVersion": "resource.k8s.io/v1", "metadata": {}, "items": ['
        return head + b",".join(items) + b"]}"

    def _body(self) -> dict[str, Any]:
        return json.loads(self._raw_body or b"{}")

    def _route(self, method: str) -> None:
        # Read the body of every request, routed or not: bytes left unread on a keep-alive
        # connection would be parsed as the next request (a 400 for an unrelated GET).
        length = int(self.headers.get("Content-Length") or 0)
        self._raw_body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        api = self.api
        with api._lock:
            api.requests.append((method, url.path))
        if method == "GET" and url.path == SLICES and query.get("watch") in ("true", "1"):
            self._watch(query)
            return
        if method == "GET" and url.path == CLAIMS:
            self._send_raw(self._claim_list())
            return
        raw = CLAIM_RE.match(url.path)
        if method == "GET" and raw and not raw.group(3) and (raw.group(1), raw.group(2)) in api.raw_claims:
            self._send_raw(api.raw_claims[(raw.group(1), raw.group(2))])
            return
        try:
            code, body = self._dispatch(method, url.path, query)
        except Exception as exc:  # noqa: BLE001 - report as a 500 so the client sees a real API error
            code, body = 500, _status(500, "InternalError", repr(exc))
        self._send(code, body)

    def _watch(self, query: dict[str, str]) -> None:
        """Stream slice events as JSON lines; the body ends when the watch does (Connection: close)."""
        api = self.api
        wanted = dict(s.split("=", 1) for s in query.get("fieldSelector", "").split(",") if "=" in s)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 300)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with api._lock:
            seen = len(api._events)
        try:
            while True:
                with api._lock:
                    while len(api._events) == seen and not api._stopping and time.monotonic() < deadline:
                        api._changed.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                    if api._stopping or time.monotonic() >= deadline:
                        return
                    batch, seen = api._events[seen:], len(api._events)
                for event in batch:
                    if all(_field(event["object"], k) == v for k, v in wanted.items()):
                        self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return

    def _dispatch(self, method: str, path: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        api = self.api
        if m := CLAIM_RE.match(path):
            ns, name, sub = m.group(1), m.group(2), m.group(3)
            if method == "GET" and not sub:
                api.claim_get_started.set()
                if api.claim_delay:
                    api._halt.wait(api.claim_delay)
            with api._lock:
                claim = api.claims.get((ns, name))
                if claim is None:
                    return 404, _status(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
                if method == "GET":
                    return 200, claim
                if method == "PATCH" and sub:
                    claim.setdefault("status", {}).update(self._body().get("status", {}))
                    return 200, claim
            return 405, _status(405, "MethodNotAllowed", method)
        if m := NODE_RE.match(path):
            node = api.nodes.get(m.group(1))
            if node is None:
                node = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": m.group(1), "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, m.group(1)))},
                }
            return 200, node
        if method == "POST" and (m := EVENTS_RE.match(path)):
            event = self._body()
            with api._lock:
                api.posted_events.append((m.group(1), event))
            return 201, event
        if path == SLICES or path.startswith(SLICES + "/"):
            return self._slices(method, path[len(SLICES) + 1 :], query)
        return 404, _status(404, "NotFound", f"no route for {method} {path}")

    def _slices(self, method: str, name: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        api = self.api
        with api._lock:
            if not name and method == "GET":
                wanted = dict(s.split("=", 1) for s in query.get("fieldSelector", "").split(",") if "=" in s)
                items = [s for s in api.slices.values() if all(_field(s, k) == v for k, v in wanted.items())]
                return 200, {
                    "kind": "ResourceSliceList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": api._next_rv()},
                    "items": items,
                }
            if not name and method == "POST":
                obj = self._body()
                meta = obj.setdefault("metadata", {})
                if not meta.get("name"):
                    meta["name"] = meta.get("generateName", "slice-") + uuid.uuid4().hex[:5]
                if meta["name"] in api.slices:
                    return 409, _status(409, "AlreadyExists", meta["name"])
                meta.update(uid=str(uuid.uuid4()), resourceVersion=api._next_rv())
                api.slices[meta["name"]] = obj
                api._emit("ADDED", obj)
                return 201, obj
            current = api.slices.get(name)
            if current is None:
                return 404, _status(404, "NotFound", f'resourceslices.resource.k8s.io "{name}" not found')
            if method == "GET":
                return 200, current
            if method == "PUT":
                obj = self._body()
                obj.setdefault("metadata", {}).update(uid=current["metadata"]["uid"], resourceVersion=api._next_rv())
                api.slices[name] = obj
                api._emit("MODIFIED", obj)
                return 200, obj
            if method == "DELETE":
                del api.slices[name]
                api._emit("DELETED", current)
                return 200, current
        return 405, _status(405, "MethodNotAllowed", method)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_DELETE(self) -> None:
        self._route("DELETE")


def _field(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj.get(part, {}) if isinstance(obj, dict) else {}
    return obj


def main(argv: list[str] | None = None) -> int:
    """Run the stub as its own process: ``python -m harness.fake_apiserver --kubeconfig F``.

    Claims are read from ``--claims`` (a JSON list) at start; prints ``ready <url>`` on stdout
    and serves until SIGTERM/SIGINT. Benchmarks use this so the stub does not share a GIL
    with the process being measured.
    """
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--claims", default=None, help="JSON file with a list of ResourceClaims")
    parser.add_argument("--claim-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    server = FakeAPIServer(claim_delay=args.claim_delay)
    if args.claims:
        for claim in json.loads(Path(args.claims).read_text()):
            server.add_claim(claim)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with server:
        server.write_kubeconfig(args.kubeconfig)
        print(f"ready {server.url}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
