"""The driver's Kubernetes API client: plain JSON dicts in and out, one method per call it makes.

Every REST path the driver uses is built here and nowhere else. The methods carry the names of
the kubernetes package's typed APIs (``ResourceV1Api.read_namespaced_resource_claim``,
``CoreV1Api.read_node``, ...) without importing it: the package costs the node daemon ~47 MB
(see :mod:`driver.kube.transport`). Dicts keep us independent of the client's model generations
(v37 switched to pydantic) and let us send server-side apply patches directly. Calls are
blocking; async callers wrap them in ``asyncio.to_thread``. Failures are typed
(:mod:`driver.kube.errors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any
from urllib.parse import quote

from driver.kube.transport import (
    ApiRequest,
    KubernetesPackageTransport,
    Transport,
    needs_full_client,
    transport_from_kubeconfig,
    transport_in_cluster,
)
from driver.model.untrusted import WRAPPED, load_json

RESOURCE_API = "/apis/resource.k8s.io/v1"
ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
APPLY_PATCH = "application/apply-patch+yaml"


def segment(value: str) -> str:
    """``value`` as one path segment, quoted with nothing left unescaped but unreserved characters.

    A name the API server would never give an object (the rule of its path segment names: not
    ``.`` or ``..``, no ``/`` or ``%``; nor empty) raises ``ValueError``: such a name (``../x``, from a
    caller's request) could otherwise steer the request to another path.
    """
    if value in ("", ".", "..") or "/" in value or "%" in value:
        raise ValueError(f"{value[:100]!r} is not an object name")
    return quote(value, safe="")


def watch_events(resp: Any) -> Generator[dict[str, Any], None, None]:
    """The events of a WATCH response, one JSON object per line, until the server ends it; the
    connection goes back to its pool then (or when the iterator is closed)."""
    buf = b""
    try:
        for chunk in resp.stream(4096, decode_content=True):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    yield load_json(line)
    finally:
        if hasattr(resp, "release_conn"):
            resp.release_conn()


def close_watch(resp: Any) -> None:
    """End a WATCH from another thread than its reader's: its read returns (urllib3 >= 2.3)."""
    with contextlib.suppress(Exception):  # best effort: the reader ends at the watch's timeout anyway
        resp.shutdown()


class KubeClient:
    """JSON-in, JSON-out access to the API server: one method per call the driver makes."""

    def __init__(self, transport: Transport) -> None:
        self.api = transport

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> KubeClient:
        """Load ``kubeconfig`` (a path), or the in-cluster config when it is None."""
        if not kubeconfig:
            return cls(transport_in_cluster())
        if needs_full_client(kubeconfig):
            return cls(KubernetesPackageTransport(kubeconfig))
        return cls(transport_from_kubeconfig(kubeconfig))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
        wrapping: int = 0,
    ) -> dict[str, Any]:
        """Send one request to ``path``; return the decoded JSON body (``{}`` when empty).

        The typed methods below are what the driver uses; tests and tools reach other objects here.
        """
        resp = self.api.send(ApiRequest(method, path, list((query or {}).items()), content_type, body, timeout))
        raw = resp.data
        if hasattr(resp, "release_conn"):
            resp.release_conn()
        # Bounded: a claim's opaque parameters are kept as the user sent them (any depth, any
        # integer); parsed like the webhook and `dranet validate` parse them (model/untrusted.py).
        return load_json(raw, wrapping=wrapping) if raw else {}

    # -- resource.k8s.io/v1 ResourceClaims ----------------------------------------------------------

    @staticmethod
    def _claim_path(namespace: str, name: str) -> str:
        return f"{RESOURCE_API}/namespaces/{segment(namespace)}/resourceclaims/{segment(name)}"

    def read_namespaced_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a ResourceClaim."""
        return self.request("GET", self._claim_path(namespace, name))

    def list_resource_claim_for_all_namespaces(self, limit: int = 500, cont: str | None = None) -> dict[str, Any]:
        """LIST ResourceClaims in every namespace, one page (``metadata.continue`` for the next)."""
        query: dict[str, Any] = {"limit": limit}
        if cont:
            query["continue"] = cont
        return self.request("GET", f"{RESOURCE_API}/resourceclaims", query=query, timeout=30.0, wrapping=WRAPPED)

    def patch_namespaced_resource_claim_status(
        self, namespace: str, name: str, body: dict[str, Any], field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply on ``resourceclaims/status`` with our field manager (forced)."""
        return self._apply(f"{self._claim_path(namespace, name)}/status", body, field_manager)

    def replace_namespaced_resource_claim_status(
        self, namespace: str, name: str, body: bytes, field_manager: str
    ) -> dict[str, Any]:
        """PUT ``resourceclaims/status`` with a pre-encoded object (its resourceVersion guards it)."""
        return self.request(
            "PUT", f"{self._claim_path(namespace, name)}/status", body, query={"fieldManager": field_manager}
        )

    # -- resource.k8s.io/v1 ResourceSlices ----------------------------------------------------------

    def list_resource_slice(self, field_selector: str, limit: int | None = None) -> dict[str, Any]:
        """LIST ResourceSlices matching ``field_selector`` (the whole list object)."""
        query: dict[str, Any] = {"fieldSelector": field_selector}
        if limit is not None:
            query["limit"] = limit
        return self.request("GET", f"{RESOURCE_API}/resourceslices", query=query)

    def watch_resource_slice(self, field_selector: str, resource_version: str, timeout_seconds: int = 300) -> Any:
        """Open a WATCH on ResourceSlices; the streaming response (``stream()``, ``release_conn()``)."""
        query = [
            ("watch", "true"),
            ("fieldSelector", field_selector),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        return self.api.send(
            ApiRequest("GET", f"{RESOURCE_API}/resourceslices", query, timeout=(10, timeout_seconds + 30))
        )

    def create_resource_slice(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST a ResourceSlice (``dry_run``: validated and admitted, not stored; the stored form is returned)."""
        query = {"dryRun": "All"} if dry_run else None
        return self.request("POST", f"{RESOURCE_API}/resourceslices", body, query=query)

    def replace_resource_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT a ResourceSlice (its resourceVersion guards against races)."""
        return self.request("PUT", f"{RESOURCE_API}/resourceslices/{segment(name)}", body)

    def delete_resource_slice(self, name: str, uid: str, resource_version: str) -> dict[str, Any]:
        """DELETE a ResourceSlice, only if it is still the object (UID, resourceVersion) we listed."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        return self.request("DELETE", f"{RESOURCE_API}/resourceslices/{segment(name)}", body)

    def list_namespaced_resource_claim(self, namespace: str) -> dict[str, Any]:
        """LIST the ResourceClaims of one namespace."""
        return self.request("GET", f"{RESOURCE_API}/namespaces/{quote(namespace)}/resourceclaims", wrapping=WRAPPED)

    def create_namespaced_resource_claim(
        self, namespace: str, body: dict[str, Any], dry_run: bool = False
    ) -> dict[str, Any]:
        """POST a ResourceClaim (``dry_run``: validated and admitted, webhooks included, not stored)."""
        query = {"dryRun": "All"} if dry_run else None
        return self.request("POST", f"{RESOURCE_API}/namespaces/{quote(namespace)}/resourceclaims", body, query=query)

    def list_device_class(self) -> dict[str, Any]:
        """LIST DeviceClasses."""
        return self.request("GET", f"{RESOURCE_API}/deviceclasses")

    # -- core/v1 and admissionregistration/v1 -------------------------------------------------------

    def read_namespaced_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a Pod."""
        return self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")

    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> dict[str, Any]:
        """LIST the Pods of one namespace matching ``label_selector``."""
        query = {"labelSelector": label_selector} if label_selector else None
        return self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods", query=query, timeout=30.0)

    def list_node(self) -> dict[str, Any]:
        """LIST Nodes."""
        return self.request("GET", "/api/v1/nodes", timeout=30.0)

    def get_api_resources(self, group_version: str) -> dict[str, Any]:
        """The APIResourceList of ``group/version`` (``resource.k8s.io/v1``): what the server serves."""
        return self.request("GET", f"/apis/{group_version}")

    def get_code(self) -> dict[str, Any]:
        """The server's version (``/version``: major, minor, gitVersion)."""
        return self.request("GET", "/version")

    def read_node(self, name: str) -> dict[str, Any]:
        """GET a Node."""
        return self.request("GET", f"/api/v1/nodes/{segment(name)}")

    def watch_node(self, name: str, resource_version: str, timeout_seconds: int = 300) -> Any:
        """Open a WATCH on the one Node ``name`` (field selector on its name) from ``resource_version``;
        the streaming response (:func:`watch_events` reads it, :func:`close_watch` ends it)."""
        query = [
            ("watch", "true"),
            ("fieldSelector", f"metadata.name={segment(name)}"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        return self.api.send(ApiRequest("GET", "/api/v1/nodes", query, timeout=(10, timeout_seconds + 30)))

    def create_namespaced_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a core/v1 Event."""
        return self.request("POST", f"/api/v1/namespaces/{segment(namespace)}/events", body)

    def list_namespaced_event(self, namespace: str, field_selector: str) -> dict[str, Any]:
        """LIST the core/v1 Events of one namespace matching ``field_selector``."""
        path = f"/api/v1/namespaces/{segment(namespace)}/events"
        return self.request("GET", path, query={"fieldSelector": field_selector}, timeout=30.0)

    def apply_validating_webhook_configuration(
        self, name: str, body: dict[str, Any], field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply of a ValidatingWebhookConfiguration (forced)."""
        return self._apply(f"{ADMISSION_API}/validatingwebhookconfigurations/{segment(name)}", body, field_manager)

    def _apply(self, path: str, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply: the fields in ``body`` become ``field_manager``'s, taken over if needed."""
        return self.request(
            "PATCH", path, body, query={"fieldManager": field_manager, "force": "true"}, content_type=APPLY_PATCH
        )
