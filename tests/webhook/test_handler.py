"""The admission webhook's HTTP application with hostile bodies (tests/support/admission.py); the TLS
server and the API server's side are in tests/e2e/test_webhook_apiserver.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from driver.webhook.configuration import match_conditions, webhook_configuration
from driver.webhook.options import WebhookOptions
from tests.support.admission import review_of, webhook_client

P = "spec.devices.config[0].opaque.parameters"


def claim(params: Any, name: str = "c", driver: str = "dra.net") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": "dranet.net"}}],
                "config": [{"opaque": {"driver": driver, "parameters": params}}],
            }
        },
    }


def _no_review() -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode()


def _deep() -> bytes:
    return json.dumps(review_of(claim({"interface": {"name": "@@"}}))).replace('"@@"', "[" * 800 + "]" * 800).encode()


MALFORMED = {
    "not-json": (b"{not json", 400, "not valid JSON"),
    "empty": (b"", 400, "not valid JSON"),
    "not-an-object": (b"[1, 2]", 400, "not a JSON object"),
    "no-request": (_no_review(), 400, "no request"),
    "request-not-object": (
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": 7}).encode(),
        400,
        "no request",
    ),
    "no-resource": (
        json.dumps({**review_of(claim({})), "request": {"uid": "u", "operation": "CREATE"}}).encode(),
        400,
        "no resource",
    ),
    "no-object": (json.dumps(review_of(None)).encode(), 200, "no object"),
    "object-not-object": (json.dumps(review_of(["x"])).encode(), 200, "no object"),
    "deep-800": (_deep(), 200, "nested more than 64 levels deep"),
    "deep-5000": (
        json.dumps(review_of(claim({"x": "@@"}))).replace('"@@"', "[" * 5000 + "]" * 5000).encode(),
        400,
        "nested more than 64 levels deep",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_reviews_get_400_or_a_clear_denial_never_500(case: str, caplog) -> None:
    body, status, reason = MALFORMED[case]
    async with webhook_client() as client:
        resp = await client.post("/validate-resourceclaims", data=body)
        text = await resp.text()
    assert resp.status == status, text
    assert reason in text and "Traceback" not in text and len(text) < 1000
    if status == 200:
        answer = json.loads(text)["response"]
        assert answer["allowed"] is False and reason in answer["status"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_rejection_is_logged_at_info_with_the_claims_name(caplog) -> None:
    async with webhook_client() as client:
        with caplog.at_level(logging.DEBUG):
            resp = await client.post("/", json=review_of(claim({"interface": {"mtu": 10}}, name="bad-mtu")))
            answer = (await resp.json())["response"]
    assert (
        answer["allowed"] is False and f"{P}.interface.mtu: must be between 68 and 65536" in answer["status"]["message"]
    )
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "a user error is not a driver error"
    (info,) = [r for r in caplog.records if r.getMessage() == "rejected"]
    assert info.levelno == logging.INFO and (info.kv["namespace"], info.kv["name"]) == ("team-a", "bad-mtu")


async def test_valid_and_other_drivers_claims_are_allowed() -> None:
    other = claim({"anything": 1})
    other["spec"]["devices"]["config"][0]["opaque"]["driver"] = "gpu.example.com"
    async with webhook_client() as client:
        for obj in (claim({"interface": {"name": "net1"}}), other):
            resp = await client.post("/validate", json=review_of(obj))
            assert resp.status == 200 and (await resp.json())["response"]["allowed"] is True


async def test_hostile_values_in_a_review_name_their_field() -> None:
    body = json.dumps(review_of(claim({"interface": {"mtu": "@@", "name": "net1"}})))
    body = body.replace('"@@"', "9" * 5000).replace('"name": "net1"', '"name": "net1", "name": "net2"')
    async with webhook_client() as client:
        resp = await client.post("/", data=body.encode())
        message = (await resp.json())["response"]["status"]["message"]
    assert f"{P}.interface.mtu: must be between 68 and 65536, got an integer of 5000 digits" in message
    assert f"{P}.interface.name: is given more than once in the same object" in message


@pytest.mark.parametrize("plural", ["resourceclaims", "resourceclaimtemplates"])
def test_match_conditions_select_objects_with_a_dra_net_config(plural: str) -> None:
    """The CEL the managed configuration installs, evaluated with the cel package the driver uses
    for its device filter (the real API server evaluates it in tests/e2e/test_webhook_apiserver.py)."""
    import cel

    program = cel.compile(match_conditions()[plural])

    def wrap(spec: dict[str, Any]) -> dict[str, Any]:
        return {"spec": spec} if plural == "resourceclaims" else {"spec": {"spec": spec}}

    ours, other = claim({"interface": {"name": "net1"}})["spec"], claim({})["spec"]
    other["devices"]["config"][0]["opaque"]["driver"] = "gpu.example.com"
    mixed = {"devices": {"config": other["devices"]["config"] + ours["devices"]["config"]}}
    assert program.execute({"object": wrap(ours)}) is True
    assert program.execute({"object": wrap(mixed)}) is True
    assert program.execute({"object": wrap(other)}) is False
    assert program.execute({"object": wrap({"devices": {"requests": []}})}) is False
    assert program.execute({"object": wrap({"devices": {"config": [{"requests": ["x"]}]}})}) is False


async def test_a_non_default_driver_name_judges_its_own_configs_only() -> None:
    """``dranet webhook --driver-name`` (the chart passes its driverName): that driver's configs
    are judged and named in the rejection; ``dra.net``'s are then another driver's."""
    bad = {"interface": {"mtu": 10}}
    async with webhook_client(WebhookOptions(driver_name="rdma.example.com")) as client:
        ours = await (await client.post("/", json=review_of(claim(bad, driver="rdma.example.com")))).json()
        other = await (await client.post("/", json=review_of(claim(bad)))).json()
    assert ours["response"]["allowed"] is False
    assert ours["response"]["status"]["message"].startswith("invalid rdma.example.com config: ")
    assert other["response"]["allowed"] is True


async def test_updates_are_not_judged() -> None:
    """A claim's spec is immutable: an UPDATE (a finalizer added by the scheduler, or removed at
    deletion) is allowed even for a config this webhook would refuse at CREATE."""
    bad = claim({"interface": {"mtu": 10}})
    async with webhook_client() as client:
        created = await (await client.post("/", json=review_of(bad))).json()
        updated = await (await client.post("/", json=review_of(bad, operation="UPDATE", oldObject=bad))).json()
    assert created["response"]["allowed"] is False
    assert updated["response"]["allowed"] is True


def test_managed_configuration_follows_the_driver_name_and_judges_creates_only() -> None:
    body = webhook_configuration(WebhookOptions(driver_name="rdma.example.com"), None)
    assert body["metadata"]["name"] == "rdma.example.com-webhook"
    for hook in body["webhooks"]:
        assert hook["name"].endswith(".rdma.example.com")
        assert [r["operations"] for r in hook["rules"]] == [["CREATE"]]
        (condition,) = hook["matchConditions"]
        assert "'rdma.example.com'" in condition["expression"] and "dra.net" not in condition["expression"]
