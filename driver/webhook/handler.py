"""The admission handler: which objects are judged, the verdict, and the HTTP front that runs it.

:func:`validator` makes the one kopf validating handler (both resources, CREATE), which rejects a claim or template
whose ``dra.net`` configs do not decode, listing every ``path: reason`` (HTTP 422).
:class:`AnyPathWebhookServer` is kopf's TLS server, answering on every URL path and parsing the
body (bounded) before kopf sees it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp.web
import kopf
from kopf._core.engines.admission import WebhookError  # not exported; _serve is kopf-internal too

from driver.admission import Malformed, denial, parse_review
from driver.api.v1alpha1.validation import validate_claim_spec

log = logging.getLogger(__name__)

GROUP, VERSION = "resource.k8s.io", "v1"
HANDLER_ID = "validate"  # also the URL path of the managed configuration
MALFORMED_PREFIX = "invalid admission review: "
READ_TIMEOUT = 10.0
"""Seconds a request body may take to arrive (the API server sends it at once; it waits 30 s at most)."""
REQUEST_TIMEOUT = 10.0
"""Seconds a review may take to be judged once read."""
# plural -> where the claim spec sits in the object (the path used in error messages)
SPEC_PATHS = {"resourceclaims": ("spec",), "resourceclaimtemplates": ("spec", "spec")}


def rejection_prefix(driver_name: str) -> str:
    """How a rejection's message starts: ``invalid dra.net config: ``."""
    return f"invalid {driver_name} config: "


def review(plural: str, body: dict[str, Any], driver_name: str) -> list[str]:
    """``path: reason`` for every problem in the ``driver_name`` configs of a claim or template
    object (empty when valid)."""
    keys = SPEC_PATHS[plural]
    spec: Any = body
    for key in keys:
        spec = spec.get(key) if isinstance(spec, dict) else None
    if spec is None:
        return []
    return [
        f"{e.path}: {e.reason}" for err in validate_claim_spec(spec, ".".join(keys), driver_name) for e in err.errors
    ]


def is_claim_resource(resource: Any) -> bool:
    """kopf resource selector: ResourceClaims and ResourceClaimTemplates of resource.k8s.io/v1."""
    return resource.group == GROUP and resource.version == VERSION and resource.plural in SPEC_PATHS


def validator(driver_name: str) -> Callable[..., None]:
    """The kopf handler for ``driver_name``'s configs: reject with every ``path: reason`` found
    (HTTP 422).

    Registered for CREATE only: the spec of a claim and of a template is immutable, so an
    UPDATE (the scheduler's finalizer, labels, the finalizer removal that lets a claim be
    deleted) can never change a config, and must not wait for this webhook to be up.
    """

    def validate(body: kopf.Body, resource: Any, operation: str | None = None, **_: Any) -> None:
        # kopf uses a handler's ``operations`` only for the configuration it would manage, not
        # when serving: a configuration that also sends UPDATEs (an older chart's) gets them.
        if operation in (None, "CREATE"):
            _judge(body, resource, operation, driver_name)

    return validate


def _judge(body: kopf.Body, resource: Any, operation: str | None, driver_name: str) -> None:
    problems = review(resource.plural, dict(body), driver_name)
    if problems:
        meta = body.get("metadata") or {}
        log.info(
            "rejected",
            extra={
                "kv": {
                    "resource": resource.plural,
                    "namespace": meta.get("namespace"),
                    "name": meta.get("name"),
                    "operation": operation,
                    "problems": problems,
                }
            },
        )
        raise kopf.AdmissionError(rejection_prefix(driver_name) + "; ".join(problems), code=422)


class AnyPathWebhookServer(kopf.WebhookServer):
    """kopf's TLS webhook server, answering on every URL path with every matching handler.

    Stock kopf runs only the handlers whose id equals the URL path and *allows* a request on
    any other path (no handler, no objection): a configuration with a different path (the
    chart's ``/validate-resourceclaims``) would silently validate nothing. Dropping the path
    hint makes kopf pick handlers by resource alone. Relies on kopf's ``_serve`` (kopf 1.x).

    The body is parsed here, bounded (:func:`driver.admission.parse_review`: its size first, then
    its nesting in linear time), before kopf sees it: a body that is not an AdmissionReview gets
    HTTP 400 with the reason, a review that cannot be judged (no object, nested too deep) a 200
    ``allowed: false``; a failure inside kopf is denied the same way. Never a 500, never a stack
    trace in a response. A body that does not arrive within :data:`READ_TIMEOUT` gets 408, a
    review not judged within :data:`REQUEST_TIMEOUT` a denial: no request holds the server.
    """

    @staticmethod
    async def _serve(fn: kopf.WebhookFn, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            data = await asyncio.wait_for(request.read(), READ_TIMEOUT)
        except TimeoutError:
            log.info("admission request body too slow", extra={"kv": {"timeout_s": READ_TIMEOUT}})
            return aiohttp.web.Response(status=408, text=f"request body not received within {READ_TIMEOUT} s\n")
        parsed = parse_review(data)
        if isinstance(parsed, Malformed):
            log.info("malformed admission request", extra={"kv": {"reason": parsed.message}})
            return aiohttp.web.Response(status=400, text=parsed.message + "\n")
        if parsed.denial:
            log.info("rejected", extra={"kv": {"uid": parsed.uid, "problems": [parsed.denial]}})
            return aiohttp.web.json_response(denial(parsed, f"{MALFORMED_PREFIX}{parsed.denial}"))
        headers = dict(request.headers)
        sslpeer = request.transport.get_extra_info("peercert") if request.transport else None
        try:
            # webhook=None: handlers are picked by resource, whatever the URL path.
            response = await asyncio.wait_for(
                fn(parsed.body, webhook=None, headers=headers, sslpeer=sslpeer or {}),  # type: ignore[arg-type]
                REQUEST_TIMEOUT,
            )
        except WebhookError as exc:  # no handler for this resource: kopf's own 400, as stock kopf
            return aiohttp.web.Response(status=400, text=f"{exc}\n")
        except TimeoutError:
            log.warning("admission request not judged in time", extra={"kv": {"uid": parsed.uid}})
            return aiohttp.web.json_response(denial(parsed, f"not judged within {REQUEST_TIMEOUT} s", code=504))
        except Exception as exc:
            log.exception("admission request failed", extra={"kv": {"uid": parsed.uid}})
            return aiohttp.web.json_response(denial(parsed, f"admission webhook internal error: {exc}", code=500))
        return aiohttp.web.json_response(response)


class _QuietRejections(logging.Filter):
    """kopf logs every handler exception at ERROR, our rejections too ("Handler 'validate' failed
    permanently: invalid dra.net config: ..."). A rejection is a user error, already logged at
    INFO with the claim's namespace/name by :func:`validator`'s handler: drop kopf's copy."""

    def __init__(self, driver_name: str) -> None:
        super().__init__()
        self.marker = f"failed permanently: {rejection_prefix(driver_name)}"

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and self.marker in record.getMessage())


def quiet_kopf_rejections(driver_name: str) -> None:
    """Keep kopf's ERROR copy of each rejection out of the log (once, however often called)."""
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, _QuietRejections) for f in kopf_objects.filters):
        kopf_objects.addFilter(_QuietRejections(driver_name))
