"""The webhook's HTTP handler in-process: our AnyPathWebhookServer._serve in front of kopf's real
admission function, on an aiohttp test server (plain HTTP; TLS is kopf's and tested end to end in
tests/e2e/test_webhook_apiserver.py).

kopf builds its admission function inside ``kopf.run`` (with an API server); this builds the same
``functools.partial`` of ``serve_admission_request`` from kopf's internals, with our registry and
the two resources the webhook serves, so tests can post any bytes at it quickly.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
from aiohttp.test_utils import TestClient, TestServer
from kopf._cogs.structs.references import Insights, Resource
from kopf._core.engines import admission as kopf_admission
from kopf._core.engines.indexing import OperatorIndexers
from kopf._core.reactor.inventory import ResourceMemories

from driver.webhook.certificates import self_signed
from driver.webhook.handler import AnyPathWebhookServer
from driver.webhook.options import WebhookOptions
from driver.webhook.server import build_registry

KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}


def kopf_webhook_fn(tmp_path: Path, options: WebhookOptions | None = None) -> Any:
    """kopf's admission function over the registry ``dranet webhook`` builds."""
    registry = build_registry(options or WebhookOptions(), self_signed(tmp_path, ["127.0.0.1"]))
    insights = Insights()
    insights.webhook_resources.update(
        Resource("resource.k8s.io", "v1", plural, kind=kind, namespaced=True) for plural, kind in KINDS.items()
    )
    return functools.partial(
        kopf_admission.serve_admission_request,
        settings=kopf.OperatorSettings(),
        registry=registry,
        insights=insights,
        memories=ResourceMemories(),
        memobase=kopf.Memo(),
        indices=OperatorIndexers().indices,
    )


@asynccontextmanager
async def webhook_client(tmp_path: Path, options: WebhookOptions | None = None) -> AsyncIterator[TestClient]:
    """An HTTP client of the handler, serving every path like the real server."""
    fn = kopf_webhook_fn(tmp_path, options)

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return await AnyPathWebhookServer._serve(fn, request)

    app = aiohttp.web.Application()
    app.add_routes([aiohttp.web.post("/{id:.*}", handle)])
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
