"""`dranet validate FILE...` through the real CLI entry point (a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*files: str, preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``dranet validate FILE...`` in a child process (``preexec_fn``: run in the child first)."""
    return subprocess.run(
        [sys.executable, "-m", "driver.cli", "validate", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=preexec_fn,
    )


def test_documented_examples_are_valid():
    examples = sorted(str(p) for p in (ROOT / "examples/claim-config").glob("*.yaml"))
    assert examples
    result = run(*examples)
    assert result.returncode == 0, result.stdout + result.stderr
    # Four templates in the examples, seven dra.net configs among them.
    assert result.stdout == "ok: 4 claims, 7 configs\n"


def test_errors_name_file_document_and_field(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""\
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t}
spec:
  spec:
    devices:
      requests: [{name: nic, exactly: {deviceClassName: dranet.net}}]
      config:
      - opaque: {driver: gpu.nvidia.com, parameters: {whatever: 1}}
      - opaque:
          driver: dra.net
          parameters:
            interface:
              name: averyveryverylongname
              adresses: ["10.0.0.1/24"]
""")
    result = run(str(bad))
    assert result.returncode == 1
    # The line of the field itself, the document by number and name, the field path, and for a
    # misspelt field the closest real one.
    assert result.stdout.splitlines() == [
        f"{bad}:19: document 2 (ResourceClaimTemplate t): spec.spec.devices.config[1].opaque.parameters.interface."
        'adresses: unknown field (did you mean "addresses"? allowed: name, addresses, dhcp, mtu, hardwareAddr, '
        "gsoMaxSize, groMaxSize, gsoIPv4MaxSize, groIPv4MaxSize, disableEbpfPrograms, forwarding, arpIgnore, "
        "arpAnnounce, vrf, type)",
        f"{bad}:18: document 2 (ResourceClaimTemplate t): spec.spec.devices.config[1].opaque.parameters.interface."
        "name: 'averyveryverylongname' is 21 characters; Linux allows at most 15",
    ]


def test_a_key_with_dots_and_a_list_index_find_their_line(tmp_path: Path):
    import yaml

    from driver.api.validate_cli import field_line

    doc = yaml.compose("spec:\n  sysctls:\n    net.ipv4.ip_forward: 1\n  list:\n  - a\n  - b: 2\n")
    assert field_line(doc, "spec.sysctls.net.ipv4.ip_forward") == 3
    assert field_line(doc, "spec.list[1].b") == 6
    assert field_line(doc, "spec.list[1].missing") == 6  # the deepest part that exists
    assert field_line(doc, "spec.nothing") == 1


def test_unreadable_and_invalid_yaml_are_errors(tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: ResourceClaim\nspec: [unclosed\n")
    good = ROOT / "examples/claim-config/rdma-nic-static-ip.yaml"
    result = run(str(good), str(broken), str(tmp_path / "missing.yaml"))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{broken}: invalid YAML")
    assert lines[1] == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"


BOMB = """\
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
          a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
          b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
          c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
          d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
          e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
          f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
          g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
          h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
          apiVersion: *h
          interface: {addresses: *h, name: *h}
"""


def test_an_alias_bomb_is_one_line_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """Under 1 KB of YAML whose aliases stand for 43 million strings: refused as one line, without
    expanding it (the child may use 512 MiB of address space)."""
    import resource

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 1024

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))

    out = run(str(bomb), preexec_fn=limit)
    assert out.returncode == 1 and out.stderr == "", out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        f"{bomb}: a document expands to more than 100000 values (aliases repeat what they name)"
    ]
