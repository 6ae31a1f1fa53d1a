"""Every claim example of kubernetes-sigs/dranet's documentation and examples (tests/fixtures/dranet_examples,
sources in its README) is accepted here; those using fields dranet added later are refused by name, and
the one whose config list is misplaced is refused where the apiserver's strict field validation would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from driver.api.v1alpha1.decode import decode_config
from driver.api.validate_cli import validate_file
from driver.model.untrusted import load_yaml_documents

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dranet_examples"
ACCEPTED = sorted(FIXTURES.glob("*.yaml"))
LATER = sorted((FIXTURES / "later-fields").glob("*.yaml"))


def dranet_parameters(node: Any) -> list[Any]:
    """Every ``opaque.parameters`` of ``driver: dra.net`` anywhere in ``node`` (also where dranet's
    docs misplace the ``config`` list)."""
    out: list[Any] = []
    if isinstance(node, dict):
        opaque = node.get("opaque")
        if isinstance(opaque, dict) and opaque.get("driver") == "dra.net" and "parameters" in opaque:
            out.append(opaque["parameters"])
        for value in node.values():
            out += dranet_parameters(value)
    elif isinstance(node, list):
        for value in node:
            out += dranet_parameters(value)
    return out


def params_of(name: str) -> list[Any]:
    """The ``dra.net`` parameters of one fixture file."""
    return dranet_parameters(load_yaml_documents((FIXTURES / name).read_text()))


def test_there_are_examples() -> None:
    assert len(ACCEPTED) >= 10 and len(LATER) == 1


MISPLACED = {"mpi-operator.yaml": (2, "spec.spec.config")}
"""Examples whose ``config`` sits beside ``devices`` (a field ResourceClaimSpec does not have): an
apiserver without strict field validation drops it, and the NIC would get no config at all."""


@pytest.mark.parametrize("path", ACCEPTED, ids=lambda p: p.name)
def test_each_example_validates(path: Path) -> None:
    problems = validate_file(str(path)).problems
    if path.name in MISPLACED:
        document, field = MISPLACED[path.name]
        assert len(problems) == 1, problems
        assert problems[0].startswith(f"{path}:") and f": document {document} " in problems[0]
        assert problems[0].endswith(f": {field}: unknown field (allowed: devices)")
    else:
        assert problems == []
    for params in dranet_parameters(load_yaml_documents(path.read_text())):
        config = decode_config(params, path.name)
        assert decode_config(config.to_parameters(), path.name) == config


def test_the_configured_examples_decode_to_what_they_say() -> None:
    (advanced,) = dranet_parameters(
        load_yaml_documents((FIXTURES / "interface-configuration-advanced.yaml").read_text())
    )
    config = decode_config(advanced, "advanced")
    assert config.interface is not None and config.interface.name == "dranet0" and config.interface.mtu == 4321
    assert config.neighbors is not None and config.neighbors[0].destination == "192.168.1.1"
    (tpu,) = params_of("gke-tpu-performance.yaml")
    iface = decode_config(tpu, "tpu").interface
    assert (
        iface is not None
        and iface.disable_ebpf_programs
        and iface.offload_sizes
        == {
            "gsoMaxSize": 65536,
            "groMaxSize": 65536,
            "gsoIPv4MaxSize": 65536,
            "groIPv4MaxSize": 65536,
        }
    )
    (mpi,) = params_of("mpi-operator.yaml")
    assert decode_config(mpi, "mpi").interface.name == "dranet0"  # type: ignore[union-attr]


LATER_FIELDS = list(zip(LATER, ["addressing"], strict=True))  # slaac


@pytest.mark.parametrize("path, field", LATER_FIELDS, ids=lambda p: str(p)[-30:])
def test_examples_with_later_fields_are_refused_by_name(path: Path, field: str) -> None:
    (line,) = validate_file(str(path)).problems
    assert f"opaque.parameters.interface.{field}: unknown field" in line
