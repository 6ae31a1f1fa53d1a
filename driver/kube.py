"""A thin Kubernetes REST client that speaks plain JSON dicts.

It uses the ``kubernetes`` package only for configuration (kubeconfig or
in-cluster service account) and its pooled HTTP transport, never its generated
models: dicts keep us independent of the client's model generations (v37
switched to pydantic) and let us send server-side apply patches directly.
Calls are blocking; async callers wrap them in ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

RESOURCE_API = "/apis/resource.k8s.io/v1"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"


@dataclass
class KubeError(Exception):
    """An API call failed: HTTP status, reason and the server's message."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class KubeClient:
    """JSON-in, JSON-out access to the API server."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self.api = api_client

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> "KubeClient":
        """Load ``kubeconfig`` (a path), or the in-cluster config when it is None."""
        configuration = k8s_client.Configuration()
        if kubeconfig:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)
        return cls(k8s_client.ApiClient(configuration))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Send one request; return the decoded JSON body (``{}`` when empty)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            resp = self.api.call_api(
                path, method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout,
            )
        except ApiException as exc:
            raise _kube_error(exc) from None
        raw = resp[0].data if isinstance(resp, tuple) else resp.data
        return json.loads(raw) if raw else {}

    # -- typed helpers used by more than one module -------------------------------------------

    def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a ``resource.k8s.io/v1`` ResourceClaim."""
        return self.request("GET", f"{RESOURCE_API}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}")

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply on ``resourceclaims/status`` with our field manager (forced)."""
        return self.request(
            "PATCH",
            f"{RESOURCE_API}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}/status",
            body,
            query={"fieldManager": field_manager, "force": "true"},
            content_type=APPLY_PATCH,
        )

    def get_node(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/nodes/{quote(name)}")


def _kube_error(exc: ApiException) -> KubeError:
    message = exc.body if isinstance(exc.body, str) else str(exc.body or "")
    try:
        message = json.loads(message).get("message", message)
    except (ValueError, AttributeError):
        pass
    return KubeError(status=int(exc.status or 0), reason=str(exc.reason or ""), message=message)
