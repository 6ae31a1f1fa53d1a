"""The admission handler: which objects are judged, the verdict, and the HTTP handler that answers a review.

:func:`verdict` judges one AdmissionReview: a ResourceClaim or ResourceClaimTemplate being created
whose ``dra.net`` configs do not decode is refused with every ``path: reason`` (code 422);
anything else of those two resources is allowed. :class:`AdmissionHandler` is the aiohttp handler
the server routes every POST path to: the body is read within :data:`READ_TIMEOUT`, parsed
bounded (:func:`driver.webhook.admission.parse_review`: its size first, then its nesting in linear
time) and judged within :data:`REQUEST_TIMEOUT`. A body that is not an AdmissionReview gets HTTP
400 with the reason, a review that cannot be judged (no object, nested too deep, a resource this
webhook does not judge, a failure while judging, no verdict in time) a clear answer: never a
500 page, never a stack trace in a response, no request holds the server.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp.web

from driver.api.v1alpha1.validation import validate_claim_spec
from driver.webhook.admission import Malformed, Review, denial, parse_review

log = logging.getLogger(__name__)

GROUP, VERSION = "resource.k8s.io", "v1"
HANDLER_ID = "validate"  # the URL path of the managed configuration (every path is served alike)
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


def judged_resource(resource: dict[str, Any]) -> str | None:
    """The plural of a resource this webhook judges (``request.resource`` of a review), else None."""
    plural = resource.get("resource")
    ours = resource.get("group") == GROUP and resource.get("version") == VERSION and plural in SPEC_PATHS
    return str(plural) if ours else None


def verdict(parsed: Review, driver_name: str) -> dict[str, Any]:
    """The AdmissionReview response to a well-formed review of a resource this webhook judges.

    Only CREATE is judged: the spec of a claim and of a template is immutable, so an UPDATE (the
    scheduler's finalizer, labels, the finalizer removal that lets a claim be deleted) can never
    change a config, and is allowed even when a configuration (an older chart's) sends it.
    """
    request = parsed.body["request"]
    response: dict[str, Any] = {"uid": parsed.uid, "allowed": True}
    plural = judged_resource(request["resource"])
    if request["operation"] == "CREATE" and plural is not None:
        problems = review(plural, request["object"], driver_name)
        if problems:
            meta = request["object"].get("metadata") or {}
            log.info(
                "rejected",
                extra={
                    "kv": {
                        "resource": plural,
                        "namespace": meta.get("namespace"),
                        "name": meta.get("name"),
                        "operation": request["operation"],
                        "problems": problems,
                    }
                },
            )
            response["allowed"] = False
            response["status"] = {"message": rejection_prefix(driver_name) + "; ".join(problems), "code": 422}
    return {"apiVersion": parsed.body["apiVersion"], "kind": parsed.body["kind"], "response": response}


class AdmissionHandler:
    """The aiohttp handler of every POST path: read, parse, judge, answer (see the module doc)."""

    def __init__(self, driver_name: str) -> None:
        self.driver_name = driver_name

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        """Answer one POSTed review."""
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
        resource = parsed.body["request"]["resource"]
        if judged_resource(resource) is None:
            what = f"{resource['group']}/{resource['version']} {resource['resource']}"
            return aiohttp.web.Response(
                status=400, text=f"this webhook judges {GROUP}/{VERSION} {', '.join(SPEC_PATHS)}, not {what}\n"
            )
        try:
            # In a thread: a large claim is judged while the loop keeps serving /healthz and others.
            answer = await asyncio.wait_for(asyncio.to_thread(verdict, parsed, self.driver_name), REQUEST_TIMEOUT)
        except TimeoutError:
            log.warning("admission request not judged in time", extra={"kv": {"uid": parsed.uid}})
            return aiohttp.web.json_response(denial(parsed, f"not judged within {REQUEST_TIMEOUT} s", code=504))
        except Exception as exc:
            log.exception("admission request failed", extra={"kv": {"uid": parsed.uid}})
            return aiohttp.web.json_response(denial(parsed, f"admission webhook internal error: {exc}", code=500))
        return aiohttp.web.json_response(answer)
