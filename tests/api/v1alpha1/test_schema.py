"""The JSON Schema generated from the typed config: the committed file is what the generator writes,
it agrees with the decoder (never refuses what the decoder accepts, names the same fields) and with
Kubernetes' own schema around the config, and `dranet validate` refuses what strict field validation
refuses on the way to the config."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.api.v1alpha1.decode import decode_config
from driver.api.v1alpha1.fields import ConfigError
from driver.api.v1alpha1.schema import claim_schema, network_config_schema
from driver.api.v1alpha1.validation import validate_object
from driver.api.validate_cli import validate_file
from driver.model.untrusted import load_yaml_documents
from tests.api.v1alpha1.test_dranet_examples import dranet_parameters
from tests.support.hack_scripts import load

ROOT = Path(__file__).resolve().parents[3]
P = "spec.devices.config[0].opaque.parameters"
DEFS = claim_schema()["$defs"]
CONFIG = jsonschema.Draft202012Validator({"$ref": "#/$defs/NetworkConfig", "$defs": DEFS})
EXAMPLES = [
    *sorted((ROOT / "examples").rglob("*.yaml")),
    *sorted((ROOT / "tests/fixtures/dranet_examples").glob("*.yaml")),
]


def _generator() -> Any:
    return load("gen_schema.py", "gen_schema")


def test_the_committed_schema_is_what_the_generator_writes() -> None:
    gen = _generator()
    assert gen.SCHEMA_FILE.read_text() == gen.render(), "run `make schema` and commit the file"
    jsonschema.Draft202012Validator.check_schema(json.loads(gen.SCHEMA_FILE.read_text()))


def _accepts(params: Any) -> bool:
    return CONFIG.is_valid(params)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_config_of_the_examples_is_accepted(path: Path) -> None:
    for params in dranet_parameters(load_yaml_documents(path.read_text())):
        decode_config(params, P)
        assert _accepts(params), list(CONFIG.iter_errors(params))


def test_a_full_config_is_accepted_and_refusals_name_the_field() -> None:
    (doc,) = load_yaml_documents((ROOT / "docs/configuration.md").read_text().split("```yaml\n")[1].split("```")[0])
    (params,) = dranet_parameters({"x": doc})
    decode_config(params, P)
    assert _accepts(params)
    bad = {"interface": {"mtu": 9000, "nmae": "net1"}, "routes": [{"gateway": "10.0.0.1"}]}
    assert _leaves(CONFIG.iter_errors(bad)) == {("interface", "additionalProperties"), ("routes/0", "required")}


def _leaves(errors: Iterable[jsonschema.ValidationError]) -> set[tuple[str, str]]:
    """(path, validator) of the errors an editor shows: inside "X or null", those of X."""
    out: set[tuple[str, str]] = set()
    for e in errors:
        if e.context:
            out |= _leaves(c for c in e.context if c.validator_value != "null")
        else:
            out.add(("/".join(map(str, e.absolute_path)), str(e.validator)))
    return out


def _decoder_fields(where: list[str]) -> list[str]:
    """The fields the decoder allows at ``where``, from its own "unknown field" message."""
    value: dict[str, Any] = {"zz-unknown": 1}
    for key in reversed(where):
        value = {key: [value] if key in ("routes", "rules", "neighbors") else value}
    with pytest.raises(ConfigError) as err:
        decode_config(value, "p")
    (message,) = [e.reason for e in err.value.errors if e.path.endswith("zz-unknown")]
    match = re.fullmatch(r"unknown field \(allowed: (.*)\)", message)
    assert match, message
    return match.group(1).split(", ")


@pytest.mark.parametrize(
    ("definition", "where"),
    [
        ("NetworkConfig", []),
        ("InterfaceConfig", ["interface"]),
        ("VrfConfig", ["interface", "vrf"]),
        ("RouteConfig", ["routes"]),
        ("RuleConfig", ["rules"]),
        ("NeighborConfig", ["neighbors"]),
        ("EthtoolConfig", ["ethtool"]),
        ("RdmaConfig", ["rdma"]),
        ("NumaConfig", ["numa"]),
    ],
)
def test_the_schema_names_the_fields_the_decoder_reads(definition: str, where: list[str]) -> None:
    assert list(network_config_schema()[definition]["properties"]) == _decoder_fields(where)


def _k8s_properties(name: str) -> list[str]:
    versions = sorted((Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema").glob("v1.3*-strict"))
    schema = json.loads((versions[-1] / f"{name}-resource-v1.json").read_text())
    return sorted(schema["properties"])


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        ("ResourceClaim", "resourceclaim"),
        ("ResourceClaimTemplate", "resourceclaimtemplate"),
        ("ResourceClaimSpec", "resourceclaimspec"),
        ("DeviceClaim", "deviceclaim"),
        ("DeviceClaimConfiguration", "deviceclaimconfiguration"),
        ("OpaqueConfig", "opaquedeviceconfiguration"),
    ],
)
def test_the_structure_around_the_config_is_kubernetes_own(ours: str, theirs: str) -> None:
    """Field for field what resource.k8s.io/v1 has (offline schemas of kubernetes-validate), so what
    `dranet validate` calls unknown is what the apiserver's strict field validation refuses."""
    assert sorted(DEFS[ours]["properties"]) == _k8s_properties(theirs)
    assert DEFS[ours]["additionalProperties"] is False
    template_spec = DEFS["ResourceClaimTemplate"]["properties"]["spec"]["properties"]
    assert sorted(template_spec) == _k8s_properties("resourceclaimtemplatespec")


# Values shaped like configs, at the edges of what the decoder accepts: whatever it accepts, the
# schema must accept. Each field draws mostly values the decoder takes (its bounds among them),
# sometimes one it refuses or anything at all, so that many whole configs are accepted.
anything = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([1.5, 2**32, "", "x", "a b"])


def one_of(good: Sequence[Any], bad: Sequence[Any] = ()) -> st.SearchStrategy[Any]:
    valid = st.sampled_from(list(good))
    return st.one_of(valid, valid, valid, valid, valid, st.sampled_from([*bad, None]) | anything)


def obj(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with up to three of ``fields`` (more would rarely all be valid together)."""
    keys = st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: fields[k] for k in ks}))


def some(item: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    lists = st.lists(item, max_size=2)
    return st.one_of(lists, lists, lists, anything)


ifnames = one_of(["net1", "a.b-c_d", "x" * 15, "N"], ["x" * 16, "lo", "all", "net 1", "net1\n"])
ips = one_of(["192.0.2.1", "10.0.0.1", "2001:db8::1"], ["fe80::1%eth0", "192.0.2.1/24"])
cidrs = one_of(["192.0.2.5/24", "10.0.0.0/8", "10.0.0.1/8", "2001:db8::/64", "::/0"], ["10.0.0.1", "10.0.0.0/33"])
tables = one_of([0, 1, 100, 252, 256, 2**32 - 1, 100.0], [253, 255, 2**32])
bools = one_of([True, False])
sizes = one_of([1, 65536, 2**31 - 1], [2**31, 0])
macs = one_of(["02:00:00:00:00:01", "02:00:00:00:00:0A", "0A:00:00:00:00:01"], ["01:00:00:00:00:00", "02-00-00-00-01"])
lladdrs = one_of(["02:00:00:00:00:01", "02-00-00-00-00-01", "00:11:22:33:44:55:66:77", ":".join(["0a"] * 20)], ["0a"])
scopes = one_of(["universe", "link", 0, 253, 253.0], ["host", 254])
priorities = one_of([0, 100, 32767], [32768])
flags = st.dictionaries(one_of(["rx-gro-hw", "tso"], ["a b", ""]), one_of([True, False]), max_size=3)
configs = obj(
    apiVersion=one_of(["dra.net/v1alpha1"], ["dra.net/v1"]),
    kind=one_of(["NetworkConfig"], ["Config"]),
    interface=obj(
        name=ifnames,
        addresses=some(cidrs),
        dhcp=bools,
        mtu=one_of([68, 1500, 9000, 65536, 9000.0], [67, 65537]),
        hardwareAddr=macs,
        gsoMaxSize=sizes,
        groMaxSize=sizes,
        gsoIPv4MaxSize=sizes,
        groIPv4MaxSize=sizes,
        disableEbpfPrograms=bools,
        forwarding=bools,
        arpIgnore=one_of([0, 1, 2, 3, 8, 8.0], [4, 9]),
        arpAnnounce=one_of([0, 1, 2], [3]),
        vrf=obj(name=ifnames, table=tables) | anything,
    )
    | anything,
    routes=some(obj(destination=cidrs, gateway=ips, source=ips, scope=scopes, table=tables)),
    rules=some(obj(priority=priorities, source=cidrs, destination=cidrs, table=tables)),
    neighbors=some(obj(destination=ips, ipAddress=ips, hardwareAddr=lladdrs)),
    ethtool=obj(features=flags, privateFlags=flags) | anything,
    profile=one_of(["gold", "x" * 253], ["x" * 254, "a b", "tab\t"]),
    rdma=obj(injectEnv=bools) | anything,
    numa=obj(pin=bools) | anything,
)


@settings(max_examples=1500, deadline=None, database=None)
@given(configs)
def test_the_schema_never_refuses_what_the_decoder_accepts(params: dict[str, Any]) -> None:
    try:
        decode_config(params, P)
    except ConfigError:
        return
    assert _accepts(params), [e.message for e in CONFIG.iter_errors(params)]


# Field by field, the values at the edges of what the decoder takes (the first list of each field:
# all accepted) and just past them (the second): the schema must accept every one the decoder accepts.
EDGES: dict[str, tuple[list[Any], list[Any]]] = {
    "interface.name": (["net1", "a.b-c_d", "x" * 15, "N", None], ["x" * 16, "lo", "all", "net 1", "", 1]),
    "interface.addresses": ([["192.0.2.5/24", "2001:db8::5/64"], [], None], [["192.0.2.5"], "192.0.2.5/24", [None]]),
    "interface.dhcp": ([True, False, None], [1, "true"]),
    "interface.mtu": ([68, 1500, 65536, 9000.0, None], [67, 65537, "9000", True, 9000.5]),
    "interface.hardwareAddr": (
        ["02:00:00:00:00:01", "0A:BB:00:00:00:01", None],
        ["01:00:00:00:00:00", "02-00-00-00-00-01"],
    ),
    "interface.gsoMaxSize": ([1, 65536, 2**31 - 1, None], [0, 2**31]),
    "interface.groIPv4MaxSize": ([1, 2**31 - 1], [0, 2**31]),
    "interface.disableEbpfPrograms": ([True, False], [0]),
    "interface.forwarding": ([True, False], ["yes"]),
    "interface.arpIgnore": ([0, 1, 2, 3, 8, 8.0, None], [4, 9, -1]),
    "interface.arpAnnounce": ([0, 1, 2, None], [3, -1]),
    "interface.vrf.name": (["vrf-blue", "x" * 15], ["x" * 16, None, 1]),
    "interface.vrf.table": ([1, 100, 252, 256, 2**32 - 1, None], [0, 253, 254, 255, 2**32]),
    "routes.destination": (["10.0.0.0/8", "0.0.0.0/0", "10.0.0.1"], ["10.0.0.1/8", "::/0", None, 10]),
    "routes.scope": (["universe", "link", 0, 253, 253.0, None], ["host", 254, 1]),
    "routes.table": ([0, 1, 253, 2**32 - 1, None], [-1, 2**32]),
    "rules.priority": ([0, 100, 32767, None], [-1, 32768]),
    "rules.source": (["192.0.2.0/24", "192.0.2.5/32", "10.1.2.3/16", None], ["192.0.2.5", 1]),
    "rules.table": ([0, 100, 2**32 - 1, None], [-1, 2**32]),
    "neighbors.destination": (["192.0.2.1", "2001:db8::1"], ["192.0.2.1/32", None]),
    "neighbors.hardwareAddr": (["02:00:00:00:00:01", "02-00-00-00-00-01", ":".join(["0a"] * 20)], ["0a", None]),
    "ethtool.features": ([{"rx-gro-hw": True, "tso": False}, {}, None], [{"a b": True}, {"tso": 1}, []]),
    "profile": (["gold", "x" * 253, None], ["x" * 254, "a b", ""]),
    "rdma.injectEnv": ([True, False, None], [1]),
    "numa.pin": ([True, False, None], ["no"]),
    "apiVersion": (["dra.net/v1alpha1", None], ["dra.net/v1", "v1"]),
    "kind": (["NetworkConfig", None], ["Config"]),
}
NEEDS: dict[str, dict[str, Any]] = {
    "routes": {"destination": "10.0.0.0/8", "gateway": "10.0.0.1"},
    "neighbors": {"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:01"},
    "vrf": {"name": "vrf-blue"},
}
"""What an object needs besides the field under test to be accepted."""


def _config(path: str, value: Any) -> dict[str, Any]:
    *parents, leaf = path.split(".")
    node: dict[str, Any] = {leaf: value}
    for key in reversed(parents):
        node = {**NEEDS.get(key, {}), **node}
        node = {key: [node] if key in ("routes", "rules", "neighbors") else node}
    return node


@pytest.mark.parametrize("path", sorted(EDGES))
def test_at_the_edges_the_schema_accepts_what_the_decoder_accepts(path: str) -> None:
    good, bad = EDGES[path]
    for value in good:
        params = _config(path, value)
        decode_config(params, P)  # the table is right: the decoder takes it
        assert _accepts(params), (params, [e.message for e in CONFIG.iter_errors(params)])
    for value in bad:
        params = _config(path, value)
        with pytest.raises(ConfigError):
            decode_config(params, P)


def _lines(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "claim.yaml"
    path.write_text(text)
    return [line.split(": ", 2)[2] for line in validate_file(str(path)).problems]


TEMPLATE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t}
spec:
  spec:
    devices:
      requests: [{name: nic, exactly: {deviceClassName: dranet.net}}]
"""


def test_a_config_beside_devices_is_refused(tmp_path: Path) -> None:
    """What dranet's mpi-operator page publishes: an apiserver without strict field validation drops
    the list, and the NIC is never named dranet0."""
    text = TEMPLATE + "    config:\n    - opaque: {driver: dra.net, parameters: {interface: {name: dranet0}}}\n"
    assert _lines(tmp_path, text) == ["spec.spec.config: unknown field (allowed: devices)"]


C0 = "spec.spec.devices.config[0]"


@pytest.mark.parametrize(
    ("config", "lines"),
    [
        (
            "- opaque: {driver: dra.net, parameter: {}}",
            [
                f"{C0}.opaque.parameter: unknown field (allowed: driver, parameters)",
                f"{C0}.opaque.parameters: is required",
            ],
        ),
        (
            "- {driver: dra.net, opaque: {driver: dra.net, parameters: {}}}",
            [f"{C0}.driver: unknown field (allowed: requests, opaque)"],
        ),
        ("- opaque: {parameters: {}}", [f"{C0}.opaque.driver: is required"]),
        (
            "- requests: nic\n        opaque: {driver: x, parameters: {}}",
            [f"{C0}.requests: must be an array, got string"],
        ),
        ("  opaque: {driver: dra.net, parameters: {}}", ["spec.spec.devices.config: must be an array, got object"]),
    ],
)
def test_mistakes_around_the_config_are_refused(tmp_path: Path, config: str, lines: list[str]) -> None:
    assert _lines(tmp_path, TEMPLATE + "      config:\n      " + config + "\n") == lines


def test_mistakes_inside_the_config_are_the_decoders_to_name() -> None:
    (doc,) = load_yaml_documents(TEMPLATE + "      config:\n      - opaque: {driver: dra.net, parameters: {mtu: 1}}\n")
    (problem,) = validate_object(doc)
    assert [str(e) for e in problem.errors] == [
        "spec.spec.devices.config[0].opaque.parameters.mtu: unknown field "
        "(allowed: apiVersion, kind, interface, routes, rules, neighbors, ethtool, profile, rdma, numa, sriov)"
    ]
