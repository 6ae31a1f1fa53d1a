"""Claim configs as the untrusted bytes they arrive as: JSON text (API server, webhook) and YAML text
(`dranet validate`), through the bounded parser and the strict decoder."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.network_config import NetworkConfig
from driver.api.v1alpha1.validation import validate_claim_spec, validate_object
from driver.model.untrusted import InputError, load_json, load_yaml_documents
from tests.fuzz import FUZZ

P = "spec.devices.config[0].opaque.parameters"
KEYS = [
    "apiVersion",
    "kind",
    "interface",
    "name",
    "mtu",
    "addresses",
    "hardwareAddr",
    "routes",
    "destination",
    "gateway",
    "source",
    "scope",
    "table",
    "ethtool",
    "features",
    "privateFlags",
    "rdma",
    "injectEnv",
    "numa",
    "pin",
    # dranet's remaining NetworkConfig fields
    "dhcp",
    "gsoMaxSize",
    "groIPv4MaxSize",
    "disableEbpfPrograms",
    "forwarding",
    "arpIgnore",
    "arpAnnounce",
    "vrf",
    "rules",
    "priority",
    "neighbors",
    "ipAddress",
    "profile",
]
SCALAR_TEXT = [
    "net1",
    "all",
    "net1\n",
    "02:00:00:00:00:01",
    "02:00:00:00:00:01\n",
    "fe80::1%eth0",
    "10.0.0.0/8",
    "192.0.2.5/24",
    "::/0",
    "link",
    "dra.net/v1alpha1",
    "vrf-blue",
    "02-00-00-00-00-01",
]

scalars = st.one_of(
    st.just("null"),
    st.sampled_from(["true", "false"]),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(20, 6000).map(lambda n: "9" * n),  # past int64, past Python's 4300-digit limit
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.sampled_from(["1e400", "-1e400", "1.5e3"]),
    st.sampled_from(SCALAR_TEXT).map(json.dumps),
    st.text(max_size=12).map(json.dumps),
)


def _obj(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"


json_texts = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=6), kids), max_size=5).map(_obj),
    ),
    max_leaves=30,
)
deep = st.integers(0, 3000).map(lambda n: "[" * n + "1" + "]" * n)


def _check_decode(text: str | bytes) -> None:
    try:
        value = load_json(text)
    except InputError as exc:
        assert str(exc)
        return
    try:
        config = decode_config(value, P)
    except ConfigError as exc:
        assert exc.errors and all(e.path.startswith(P) and e.reason for e in exc.errors)
        return
    assert isinstance(config, NetworkConfig)
    assert decode_config(config.to_parameters(), P) == config
    assert NetworkConfig.from_parameters(config.to_parameters()) == config  # the checkpoint's reading


@FUZZ
@given(json_texts | deep)
def test_json_text_of_a_config(text: str) -> None:
    _check_decode(text)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_as_a_config(data: bytes) -> None:
    _check_decode(data)


@FUZZ
@given(json_texts, st.integers(0, 400), st.binary(min_size=1, max_size=8))
def test_corrupted_claim_json(params: str, where: int, junk: bytes) -> None:
    """A whole claim spec with our parameters, then a few bytes of it overwritten."""
    text = json.dumps(
        {
            "devices": {
                "requests": [{"name": "a", "exactly": {"count": 2}}, {"name": "b"}],
                "config": [{"requests": ["a"], "opaque": {"driver": "dra.net", "parameters": "@@"}}],
            }
        }
    ).replace('"@@"', params)
    raw = text.encode()
    where %= len(raw)
    raw = raw[:where] + junk + raw[where + len(junk) :]
    try:
        spec = load_json(raw)
    except InputError:
        return
    for problem in validate_claim_spec(spec, "spec"):
        assert problem.errors and all(e.path.startswith("spec") and e.reason for e in problem.errors)


YAML_DOC = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests: [{name: a, exactly: {deviceClassName: x}}, {name: b, exactly: {deviceClassName: x}}]
    config:
    - opaque:
        driver: dra.net
        parameters: PARAMS
"""


YAML_JUNK = [
    "!!float x",
    "2001-02-30",
    "&x [*x]",
    "&y {k: *y}",
    "!!binary zz",
    "? [a]\n: 1",
    "0x" + "f" * 50,
    "*undefined",
    "!!python/object:os.system x",
    "{a: 1, a: 2}",
    "190:20:30",
    "\t",
]


@FUZZ
@given(json_texts | deep, st.text(max_size=20) | st.sampled_from(YAML_JUNK), st.integers(0, 600))
def test_yaml_text_of_a_claim(params: str, junk: str, where: int) -> None:
    """JSON is YAML: any of the texts above as the parameters of a YAML claim, then text spliced in."""
    text = YAML_DOC.replace("PARAMS", params)
    where %= len(text)
    text = text[:where] + junk + text[where:]
    try:
        docs = load_yaml_documents(text)
    except InputError as exc:
        assert str(exc)
        return
    for doc in docs:
        for problem in validate_object(doc):
            assert problem.errors and all(e.reason for e in problem.errors)
