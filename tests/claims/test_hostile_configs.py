"""Bad claim configs get a clear error naming the field, never a traceback, never silent acceptance,
and the same error from ``dranet validate``, the webhook and NodePrepareResources."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.validation import validate_claim_spec
from driver.checkpoint.store import CheckpointStore
from driver.claims.claim_build import ClaimBuilder
from driver.claims.prepare import Preparer
from driver.dra.protocol import ClaimRef
from driver.kube.client import KubeClient
from driver.model.untrusted import InputError
from harness.fake_apiserver import FakeAPIServer, make_claim, result
from tests.claims.conftest import NODE, inventory
from tests.support.admission import review_of, webhook_client

ROOT = Path(__file__).resolve().parents[2]
P = "p"


@pytest.mark.parametrize(
    ("params", "path", "reason"),
    [
        ({"interface": {"name": "all"}}, "interface.name", "'all' is reserved"),
        ({"interface": {"name": "default"}}, "interface.name", "'default' is reserved"),
        ({"interface": {"name": "net1\n"}}, "interface.name", "may contain only"),
        ({"interface": {"name": "net1\r\n"}}, "interface.name", "may contain only"),
        ({"interface": {"hardwareAddr": "02:00:00:00:00:01\n"}}, "interface.hardwareAddr", "is not a MAC address"),
        (
            {"routes": [{"destination": "::/0", "gateway": "fe80::1%eth0"}]},
            "routes[0].gateway",
            "has a zone",
        ),
        ({"routes": [{"destination": "fe80::%eth0/64", "scope": "link"}]}, "routes[0].destination", "has a zone"),
        ({"interface": {"addresses": ["fe80::5%net1/64"]}}, "interface.addresses[0]", "has a zone"),
    ],
)
def test_refused_values_name_their_field(params: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        decode_config(params, P)
    assert [(e.path, reason in e.reason) for e in info.value.errors] == [(f"{P}.{path}", True)]


def _spec(*configs: tuple[list[str] | None, dict[str, Any]], requests: tuple[str, ...] = ("a", "b")) -> dict:
    return {
        "devices": {
            "requests": [{"name": r, "exactly": {"deviceClassName": "dranet.net"}} for r in requests],
            "config": [
                {**({"requests": reqs} if reqs is not None else {}), "opaque": {"driver": "dra.net", "parameters": p}}
                for reqs, p in configs
            ],
        }
    }


@pytest.mark.parametrize(
    ("field", "a", "b", "what"),
    [
        ("name", {"name": "net1"}, {"name": "net1"}, "interface name 'net1'"),
        ("addresses", {"addresses": ["10.0.0.5/24"]}, {"addresses": ["10.0.0.5/16"]}, "address '10.0.0.5'"),
        ("hardwareAddr", {"hardwareAddr": "02:00:00:00:00:0A"}, {"hardwareAddr": "02:00:00:00:00:0a"}, "MAC"),
    ],
)
def test_two_requests_of_one_claim_cannot_ask_for_the_same_setting(field: str, a: dict, b: dict, what: str) -> None:
    spec = _spec((["a"], {"interface": a}), (["b"], {"interface": b}))
    (error,) = validate_claim_spec(spec, "spec")
    assert error.path == f"spec.devices.config[1].opaque.parameters.interface.{field}"
    assert "request 'a' and request 'b'" in error.reason and what in error.reason
    # One config for every request sets it for both: refused at that config.
    (error,) = validate_claim_spec(_spec((None, {"interface": a})), "spec")
    assert error.path == f"spec.devices.config[0].opaque.parameters.interface.{field}"
    # Different values, or alternatives of one request (firstAvailable), are fine.
    assert validate_claim_spec(_spec((["a"], {"interface": a})), "spec") == []
    alternatives = {
        "devices": {
            "requests": [{"name": "nic", "firstAvailable": [{"name": "x"}, {"name": "y"}]}],
            "config": [{"opaque": {"driver": "dra.net", "parameters": {"interface": a}}}],
        }
    }
    assert validate_claim_spec(alternatives, "spec") == []


def test_two_vfs_of_one_claim_cannot_get_the_same_mac_through_their_pfs() -> None:
    """``sriov.mac`` is the VF netdev's MAC in the pod: the same one for two NICs is refused at the
    field that set it, as ``interface.hardwareAddr`` is."""
    spec = _spec(
        (["a"], {"interface": {"hardwareAddr": "02:00:00:00:00:0a"}}), (["b"], {"sriov": {"mac": "02:00:00:00:00:0A"}})
    )
    (error,) = validate_claim_spec(spec, "spec")
    assert error.path == "spec.devices.config[1].opaque.parameters.sriov.mac"
    assert "request 'a' and request 'b' would both get MAC address '02:00:00:00:00:0a'" in error.reason


DOC = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c, namespace: ns}
spec:
  devices:
    requests: [{name: nic, exactly: {deviceClassName: dranet.net}}]
    config:
    - opaque:
        driver: dra.net
        parameters:
          interface:
            PARAMS
"""
AFTER_LINE = DOC.splitlines().index("            PARAMS") + 1  # where `dranet validate` points
HOSTILE = {
    "deep": ("name: " + "[" * 800 + "]" * 800, "nested more than 64 levels deep"),
    "bigint": ("mtu: " + "9" * 5000, "interface.mtu: must be between 68 and 65536, got an integer of 5000 digits"),
    "dupkey": ("mtu: 1500\n            mtu: 9000", "interface.mtu: is given more than once in the same object"),
}


def test_dranet_validate_reports_each_hostile_file_once_and_goes_on(tmp_path: Path) -> None:
    files = []
    for name, (params, _) in HOSTILE.items():
        files.append(tmp_path / f"{name}.yaml")
        files[-1].write_text(DOC.replace("PARAMS", params))
    after = tmp_path / "after.yaml"
    after.write_text(DOC.replace("PARAMS", "name: all"))
    good = ROOT / "examples/claim-config/rdma-nic-static-ip.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "driver.cli", "validate", *map(str, files), str(good), str(after)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    for path, (_, reason) in zip(files, HOSTILE.values(), strict=True):
        mine = [line for line in lines if line.startswith(f"{path}:")]
        assert len(mine) == 1 and reason in mine[0], (path, lines)
    assert [line for line in lines if line.startswith(f"{after}:")] == [
        f"{after}:{AFTER_LINE}: document 1 (ResourceClaim c): spec.devices.config[0].opaque.parameters.interface.name: "
        "'all' is reserved (the kernel's per-interface settings use 'all' and 'default')"
    ]
    assert not [line for line in lines if line.startswith(str(good))]


def _as_json(params: str) -> str:
    """The hostile parameters of ``HOSTILE`` as the raw JSON a user's client would send."""
    return {
        "deep": '{"interface": {"name": ' + "[" * 800 + "]" * 800 + "}}",
        "bigint": '{"interface": {"mtu": ' + "9" * 5000 + "}}",
        "dupkey": '{"interface": {"mtu": 1500, "mtu": 9000}}',
    }[params]


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_the_webhook_and_prepare_give_the_same_error(case: str, tmp_path: Path) -> None:
    reason = HOSTILE[case][1]
    spec = yaml.safe_load(DOC.replace("PARAMS", "mtu: 1500"))
    body = json.dumps(review_of(spec)).replace('{"interface": {"mtu": 1500}}', _as_json(case))
    async with webhook_client() as client:
        resp = await client.post("/", data=body.encode())
        answer = (await resp.json())["response"]
    assert answer["allowed"] is False and reason in answer["status"]["message"]

    with FakeAPIServer() as api:
        claim = make_claim("ns", "c", "uid-c", [result("pci-0000-8a-00-0", NODE)], configs=[{"opaque": "@@"}])
        raw = json.dumps(claim).replace('"@@"', '{"driver": "dra.net", "parameters": ' + _as_json(case) + "}")
        api.raw_claims[("ns", "c")] = raw.encode()
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE))
        out = await preparer.prepare([ClaimRef("ns", "c", "uid-c")])
    assert reason in out["uid-c"].error and "Traceback" not in out["uid-c"].error


@pytest.mark.parametrize(("depth", "refused"), [(64, False), (65, True)])
async def test_the_nesting_limit_is_the_same_everywhere(depth: int, refused: bool, tmp_path: Path) -> None:
    """A claim nested exactly 64 levels (counted from the claim object, however it is wrapped: a
    YAML file, an AdmissionReview, a GET) passes the limit everywhere; 65 is refused everywhere."""
    inner = depth - 9  # claim, status, allocation, devices, config list, entry, opaque, parameters, interface
    params = '{"interface": {"name": ' + "[" * inner + "]" * inner + "}}"
    claim = make_claim("ns", "c", "uid-c", [result("pci-0000-8a-00-0", NODE)], configs=[{"opaque": "@@"}])
    claim["spec"]["devices"]["config"] = [{"opaque": "@@"}]  # the same config in the spec (webhook, validate)
    text = json.dumps(claim).replace('"@@"', '{"driver": "dra.net", "parameters": ' + params + "}")
    message = "nested more than 64 levels deep"

    path = tmp_path / "claim.yaml"
    path.write_text(text)  # JSON is YAML
    out = subprocess.run(
        [sys.executable, "-m", "driver.cli", "validate", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert (message in out.stdout) is refused, out.stdout
    assert refused or "interface.name: must be a string, got array" in out.stdout, out.stdout

    review = json.dumps(review_of({"@": 1})).replace('{"@": 1}', text)
    async with webhook_client() as client:
        answer = (await (await client.post("/", data=review.encode())).json())["response"]
    assert (message in answer["status"]["message"]) is refused

    with FakeAPIServer() as api:
        api.raw_claims[("ns", "c")] = text.encode()
        kube = KubeClient.from_kubeconfig(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        preparer = Preparer(kube, CheckpointStore(tmp_path / "state"), ClaimBuilder(inventory, "dra.net", NODE))
        error = (await preparer.prepare([ClaimRef("ns", "c", "uid-c")]))["uid-c"].error
        try:  # the same claim inside a LIST, as the rebuild after a corrupt checkpoint reads it
            listed = len(kube.list_resource_claim_for_all_namespaces()["items"])
        except InputError as exc:
            listed = str(exc)
    assert (message in error) is refused, error
    assert refused or "interface.name: must be a string, got array" in error, error
    assert listed == (message if refused else 1)
