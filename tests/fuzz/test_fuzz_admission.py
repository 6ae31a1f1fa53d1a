"""AdmissionReview bodies as untrusted bytes: random bytes, random JSON, and real reviews with parts
removed, retyped or corrupted, through the webhook's HTTP application.
Property: HTTP 400 with a short reason, or a 200 review (allowed or denied with a message);
never a 500, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from hypothesis import given
from hypothesis import strategies as st

from driver.webhook.admission import Malformed, Review, parse_review
from tests.fuzz import FUZZ, LoopThread
from tests.fuzz.test_fuzz_claim_config import json_texts
from tests.support.admission import review_of, webhook_client


@pytest.fixture(scope="module")
def post() -> Iterator[Any]:
    """``post(body) -> (status, text)`` against one handler for the whole module."""
    loop = LoopThread()
    context = webhook_client()
    client: TestClient = loop.run(context.__aenter__())

    async def send(body: bytes) -> tuple[int, str]:
        resp = await client.post("/validate", data=body)
        return resp.status, await resp.text()

    try:
        yield lambda body: loop.run(send(body))
    finally:
        loop.run(context.__aexit__(None, None, None))
        loop.close()


def _check(status: int, text: str) -> None:
    assert status in (200, 400), (status, text)
    assert "Traceback" not in text and len(text) < 5000
    if status == 200:
        answer = json.loads(text)["response"]
        assert isinstance(answer["allowed"], bool) and answer["uid"]
        if not answer["allowed"]:
            assert answer["status"]["message"]


BASE = review_of(
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"config": [{"opaque": {"driver": "dra.net", "parameters": {}}}]}},
    }
)
PATHS = [
    ("request",),
    ("request", "uid"),
    ("request", "resource"),
    ("request", "resource", "resource"),
    ("request", "operation"),
    ("request", "userInfo"),
    ("request", "object"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "devices"),
    ("request", "object", "spec", "devices", "config"),
    ("request", "object", "metadata"),
    ("apiVersion",),
    ("kind",),
]


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(post: Any, data: bytes) -> None:
    _check(*post(data))
    assert isinstance(parse_review(data), Malformed | Review)


@FUZZ
@given(
    st.lists(st.tuples(st.sampled_from(PATHS), st.sampled_from(["drop", "value"])), max_size=4),
    json_texts,
    st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", 7]),
)
def test_reviews_with_parts_removed_or_retyped(post: Any, edits: list, value: str, operation: Any) -> None:
    review = json.loads(json.dumps(BASE))
    review["request"]["operation"] = operation
    marker = "@@VALUE@@"
    for path, how in edits:
        node: Any = review
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if how == "drop":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = marker
    body = json.dumps(review).replace(json.dumps(marker), value)
    _check(*post(body.encode()))


LINEAR_BOUND = 0.5
"""Seconds a body of at most 1 MiB may take to be parsed: the webhook has one event loop."""


@FUZZ
@given(
    st.lists(st.sampled_from([b'"', b"\\", b'\\"', b"[", b"]", b"{", b"}", b":", b",", b"a"]), min_size=1, max_size=8),
    st.integers(1, 1 << 17),
    st.binary(max_size=16),
)
def test_review_parsing_is_linear_in_the_body(pattern: list[bytes], repeat: int, prefix: bytes) -> None:
    """Any body up to the size limit, however its quotes, escapes and brackets repeat, is parsed
    within a fixed bound (the depth pre-scan cannot go back over what it read)."""
    import time

    body = (prefix + b"".join(pattern) * repeat)[: 1 << 20]
    started = time.perf_counter()
    parsed = parse_review(body)
    assert isinstance(parsed, (Malformed, Review))
    assert time.perf_counter() - started < LINEAR_BOUND, (pattern, repeat, len(body))
