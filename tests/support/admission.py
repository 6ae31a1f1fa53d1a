"""The webhook's HTTP application in-process (every path, the real handler) on an aiohttp test
server: plain HTTP, so tests can post any bytes at it quickly; TLS and the real process are tested
end to end in tests/e2e/test_webhook_apiserver.py and tests/e2e/test_webhook_hostile.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from driver.webhook.options import WebhookOptions
from driver.webhook.server import admission_app

KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}


@asynccontextmanager
async def webhook_client(options: WebhookOptions | None = None) -> AsyncIterator[TestClient]:
    """An HTTP client of the webhook's application, serving every path like the real server."""
    app = admission_app((options or WebhookOptions()).driver_name)
    async with TestClient(TestServer(app)) as client:
        yield client


def review_of(obj: Any, operation: str = "CREATE", plural: str = "resourceclaims", **request: Any) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for ``obj``."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": KINDS[plural]},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": plural},
            "operation": operation,
            "userInfo": {"username": "test"},
            "object": obj,
            **request,
        },
    }
