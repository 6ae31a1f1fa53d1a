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
    assert result.stdout == ""


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
            interface: {name: averyveryverylongname, mtu: 9000}
""")
    result = run(str(bad))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{bad}:2: spec.spec.devices.config[1].opaque.parameters.interface.name: "
        "'averyveryverylongname' is 21 characters; Linux allows at most 15",
    ]


def test_unreadable_and_invalid_yaml_are_errors(tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: ResourceClaim\nspec: [unclosed\n")
    good = ROOT / "examples/claim-config/rdma-nic-static-ip.yaml"
    result = run(str(good), str(broken), str(tmp_path / "missing.yaml"))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{broken}:0: (file): invalid YAML")
    assert lines[1].startswith(f"{tmp_path / 'missing.yaml'}:0: (file): cannot read")


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
        f"{bomb}:0: (file): a document expands to more than 100000 values (aliases repeat what they name)"
    ]
