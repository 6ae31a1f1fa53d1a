"""`dranet` behaves like the tools around it: --version, global flags after the subcommand, every
flag with help, its default and a DRANET_* variable, text logs on a terminal and JSON elsewhere,
a path naming nothing is an error, and `templates` takes the class names as flags."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from driver import __version__
from driver.cli import build_parser, main
from driver.cli_flags import EnvError, env_var
from driver.logs import resolve_format

ROOT = Path(__file__).resolve().parent.parent


def dranet(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DRANET_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "driver", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=environ
    )


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_version_is_the_package_and_chart_version() -> None:
    out = dranet("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"dranet {__version__}"
    chart = yaml.safe_load((ROOT / "charts/dranet/Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert f'version = "{__version__}"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("before", [True, False])
def test_global_flags_before_or_after_the_subcommand(before: bool) -> None:
    argv = ["--log-level", "debug", "--log-format", "text", "discover"]
    if not before:
        argv = ["discover", "--log-level", "debug", "--log-format", "text"]
    args = build_parser({}).parse_args(argv)
    assert (args.log_level, args.log_format) == ("debug", "text")
    # Given before, not reset by the subcommand; not given at all: the defaults.
    assert build_parser({}).parse_args(["--log-level", "error", "topology"]).log_level == "error"
    assert build_parser({}).parse_args(["topology"]).log_format == "auto"


def test_every_flag_has_help_showing_its_default_and_variable() -> None:
    parser = build_parser({})
    missing = []
    for name, sub in subcommands(parser).items():
        text = sub.format_help()
        for action in flags(sub):
            flag = action.option_strings[0]
            if not action.help:
                missing.append(f"{name} {flag}: no help")
                continue
            env = env_var(action)
            if env and env not in " ".join(text.split()):
                missing.append(f"{name} {flag}: {env} not in help")
            switch = isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction)
            if not switch and not action.required and "default:" not in " ".join(action.help.split()):
                formatted = sub._get_formatter()._get_help_string(action)  # what --help prints
                if "default:" not in formatted:
                    missing.append(f"{name} {flag}: default not shown")
    assert not missing, missing
    assert "(default: /run/dranet/claims; env DRANET_STATE_DIR)" in " ".join(
        subcommands(parser)["run"].format_help().split()
    )


def test_every_flag_is_read_from_its_variable() -> None:
    """Each flag of each subcommand takes a value from DRANET_<FLAG>, through the flag's own type."""
    parser = build_parser({})
    values = {"store": "x", "int": "7"}
    for name, sub in subcommands(parser).items():
        for action in flags(sub):
            env = env_var(action)
            if env is None or action.default is argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                raw, want = "true", action.const
            elif action.choices:
                raw = want = list(action.choices)[-1]
            elif action.type is int:
                raw, want = values["int"], 7
            elif action.type is not None and action.type is not str:
                continue  # typed flags: below
            else:
                raw = want = values["store"]
                if isinstance(action, argparse._AppendAction):
                    want = [raw]
            argv = [name] + (["--gpus", "1"] if name == "templates" and action.dest != "gpus" else [])
            argv += ["f.yaml"] if name == "validate" else []
            got = getattr(build_parser({env: raw}).parse_args(argv), action.dest)
            assert got == want, (name, env, got)
    typed = build_parser(
        {
            "DRANET_PUBLISH_INTERVAL": "1m30s",
            "DRANET_CLOUD_PROVIDER": "AZURE",
            "DRANET_FEATURE_GATES": "DRAListTypeAttributes=true",
            "DRANET_NO_NRI": "false",
        }
    ).parse_args(["run", "--no-nri"])
    assert typed.publish_interval == 90.0 and typed.cloud_provider == "azure"
    assert typed.feature_gates["DRAListTypeAttributes"] is True
    assert typed.nri_enabled is False  # the command line wins over DRANET_NO_NRI=false


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DRANET_LOG_LEVEL": "loud"}, "DRANET_LOG_LEVEL='loud': invalid choice"),
        ({"DRANET_PUBLISH_INTERVAL": "soon"}, "DRANET_PUBLISH_INTERVAL='soon': 'soon' is not a duration"),
        ({"DRANET_NO_NRI": "maybe"}, "DRANET_NO_NRI='maybe': expected true or false"),
        ({"DRANET_FEATURE_GATES": "Nope=true"}, "DRANET_FEATURE_GATES='Nope=true': unrecognized feature gate"),
    ],
)
def test_a_bad_variable_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(EnvError, match=message.replace("(", r"\(")):
        build_parser(env)
    out = dranet("topology", env=env)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_the_node_name_variable_beats_node_name() -> None:
    assert build_parser({}).parse_args(["run"]).node_name  # $NODE_NAME or the hostname
    assert build_parser({"DRANET_NODE_NAME": "n7"}).parse_args(["run"]).node_name == "n7"


def test_log_format_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(secondary, "w", closefd=False) as tty:
            assert resolve_format("auto", tty, {}) == "text"
            assert resolve_format("auto", tty, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) == "json"
    finally:
        os.close(primary)
        os.close(secondary)
    with open(os.devnull, "w") as pipe:
        assert resolve_format("auto", pipe, {}) == "json"
        assert resolve_format("text", pipe, {}) == "text"


def test_log_lines_follow_the_terminal(nd_h100_sysfs: Path) -> None:
    """A real `dranet discover` with its stderr on a pseudo-terminal logs text; to a pipe, JSON."""
    argv = [sys.executable, "-m", "driver", "discover", "--log-level", "debug", "--sysfs-root", str(nd_h100_sysfs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRANET_", "KUBERNETES_"))}
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=secondary, env=env, timeout=120)
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
    assert proc.returncode == 0
    tty_lines = [ln for ln in b"".join(chunks).decode().splitlines() if ln.strip()]
    assert tty_lines and not any(ln.lstrip().startswith("{") for ln in tty_lines), tty_lines[:3]
    piped = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    lines = [ln for ln in piped.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith('{"ts"') for ln in lines), lines[:3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topology", "--sysfs-root", "/nonexistent"], "--sysfs-root /nonexistent: no such directory"),
        (["templates", "--gpus", "1", "--sysfs-root", "/nonexistent"], "--sysfs-root /nonexistent: no such directory"),
        (["run", "--sysfs-root", "/nonexistent"], "--sysfs-root /nonexistent: no such directory"),
        (["run", "--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig /nonexistent/kubeconfig: no such file"),
        (["webhook", "--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"], "--tls-cert /no/cert.pem: no such"),
        (["topology", "--sysfs-root", "/tmp"], "not a sysfs tree"),
    ],
)
def test_a_path_naming_nothing_is_an_error(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_templates_take_the_class_names(nd_h100_sysfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["templates", "--gpus", "4", "--sysfs-root", str(nd_h100_sysfs), "--nic-class", "rdma.dranet.net"]
    assert main([*argv, "--gpu-class", "h100.nvidia.com"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    for doc in docs:
        gpu, nic = doc["spec"]["spec"]["devices"]["requests"]
        assert gpu["exactly"]["deviceClassName"] == "h100.nvidia.com"
        assert nic["exactly"]["deviceClassName"] == "rdma.dranet.net"
    assert len(docs) == 2


def test_the_kubectl_plugin_is_a_console_script_of_the_package() -> None:
    """`pip install dranet-py` puts kubectl-dranet on PATH (kubectl finds plugins by that name)."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-dranet"] == "driver.kubectl.main:main"
    from driver.kubectl.main import main as plugin

    assert callable(plugin)
    assert "kubectl-dranet" in (ROOT / "README.md").read_text()
