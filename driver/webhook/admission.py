"""Reading an AdmissionReview request body without trusting it.

The webhook's HTTP handler (:class:`driver.webhook.handler.AdmissionHandler`) parses the body here
before anything judges it, so a body that is not an AdmissionReview is answered with HTTP 400 and a
one-line reason, and a review whose object cannot be judged with a 200 ``allowed: false`` and a
clear message; never a 500 or a stack trace. Parsing is bounded like every other untrusted
input (:mod:`driver.model.untrusted`): the same too-deep object gets the same message from the
webhook, ``dranet validate`` and NodePrepareResources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from driver.model.untrusted import MAX_DEPTH, WRAPPED, InputError, load_json, nesting_error

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_BODY = 1 << 20
"""Largest review body judged (aiohttp's own request limit, which the webhook server keeps): an
object the API server stores is at most 1.5 MB, a claim a few kilobytes."""
LENIENT_DEPTH = 2000
"""Depth up to which a too-deep review is still parsed (as deep as the interpreter allows), only to
answer its uid with a denial instead of a 400."""


@dataclass(frozen=True)
class Malformed:
    """Not an AdmissionReview: answer HTTP 400 with ``message``."""

    message: str


@dataclass(frozen=True)
class Review:
    """A well-formed AdmissionReview (``body``) to judge, or, with ``denial``, one to deny at once."""

    body: dict[str, Any]
    denial: str = ""

    @property
    def uid(self) -> str:
        """The request's uid (the response must echo it)."""
        return str(self.body["request"]["uid"])


def parse_review(data: bytes) -> Review | Malformed:
    """The review in ``data``, checked for every field the webhook relies on; its size is checked
    before anything is parsed."""
    if len(data) > MAX_BODY:
        return Malformed(f"request body is {len(data)} bytes; at most {MAX_BODY} are accepted")
    try:
        body = load_json(data, wrapping=WRAPPED)  # the limit is the object's, as for a claim on its own
    except InputError as exc:
        if str(exc) != nesting_error(MAX_DEPTH):
            return Malformed(f"request body is not an AdmissionReview: {exc}")
        try:  # too deep to judge, maybe not too deep to answer: deny it by its uid
            body = load_json(data, max_depth=LENIENT_DEPTH)
        except InputError:
            return Malformed(f"request body is not an AdmissionReview: {exc}")
        checked = _check(body)
        if isinstance(checked, Malformed):
            return checked
        return Review(body, denial=f"the object is {exc}")
    return _check(body)


def _check(body: Any) -> Review | Malformed:
    if not isinstance(body, dict):
        return Malformed("request body is not an AdmissionReview: not a JSON object")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        return Malformed(f"request body is not an {API_VERSION} {KIND} (apiVersion/kind)")
    request = body.get("request")
    if not isinstance(request, dict):
        return Malformed("AdmissionReview has no request object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        return Malformed("AdmissionReview request has no uid")
    resource = request.get("resource")
    if not isinstance(resource, dict) or not all(isinstance(resource.get(k), str) for k in ("group", "version")):
        return Malformed("AdmissionReview request has no resource (group, version, resource)")
    if not isinstance(resource.get("resource"), str) or not isinstance(request.get("userInfo"), dict):
        return Malformed("AdmissionReview request has no resource or userInfo")
    if not isinstance(request.get("operation"), str):
        return Malformed("AdmissionReview request has no operation")
    review = Review(body)
    if request["operation"] in ("CREATE", "UPDATE") and not isinstance(request.get("object"), dict):
        return Review(body, denial="the AdmissionReview request has no object to validate")
    old = request.get("oldObject")
    if old is not None and not isinstance(old, dict):
        return Review(body, denial="the AdmissionReview request's oldObject is not an object")
    return review


def denial(review: Review, message: str, code: int = 400) -> dict[str, Any]:
    """The AdmissionReview response that refuses ``review`` with ``message``."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "response": {"uid": review.uid, "allowed": False, "status": {"message": message, "code": code}},
    }
