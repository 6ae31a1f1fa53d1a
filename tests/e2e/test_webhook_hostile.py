"""`dranet webhook` (a real subprocess, logged in to a real kube-apiserver) against hostile clients:
one request never stalls the others, and its health endpoint fails while its loop is stuck.

The requests go straight at the webhook's TLS port (any pod could send them: the chart's
NetworkPolicy narrows that where the cluster enforces it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster.controlplane import free_port
from tests.e2e.test_webhook_apiserver import claim, start_webhook, stop
from tests.support.admission import review_of

pytestmark = pytest.mark.slow

HOSTILE = b'{"apiVersion": "' + b'\\"' * 40_000  # 80 KB: '"' then many '\\"', never closed
STALL_BOUND = 2.0
"""Seconds a valid review may take while the hostile one is being handled (the apiserver waits 5)."""


def _insecure() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the webhook's self-signed certificate; 127.0.0.1 only
    return context


def _post(port: int, body: bytes, timeout: float = 60) -> tuple[int, str]:
    request = urllib.request.Request(f"https://127.0.0.1:{port}/validate", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, context=_insecure(), timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _wait_serving(port: int, log: Path, timeout: float = 60) -> None:
    valid = json.dumps(review_of(claim("warm", {"interface": {"name": "net1"}}))).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _post(port, valid, timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"webhook not serving; log:\n{log.read_text()[-3000:]}")


def test_a_quadratic_body_does_not_stall_a_valid_review(control_plane, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "webhook.log"
    proc = start_webhook(str(control_plane.kubeconfig), port, log_path=log)
    try:
        _wait_serving(port, log)
        hostile: dict[str, Any] = {}

        def send_hostile() -> None:
            started = time.monotonic()
            hostile["status"], hostile["text"] = _post(port, HOSTILE)
            hostile["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=send_hostile)
        thread.start()
        time.sleep(0.5)
        started = time.monotonic()
        status, text = _post(port, json.dumps(review_of(claim("valid", {"interface": {"name": "net1"}}))).encode())
        valid_seconds = time.monotonic() - started
        thread.join(120)
        assert status == 200 and json.loads(text)["response"]["allowed"] is True, text
        assert valid_seconds < STALL_BOUND, f"a valid review took {valid_seconds:.1f} s behind an 80 KB body"
        assert hostile["status"] == 400 and "not valid JSON" in hostile["text"], hostile
        assert hostile["seconds"] < STALL_BOUND, hostile
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


def test_the_health_endpoint_fails_while_the_loop_is_stuck(control_plane, tmp_path: Path) -> None:
    """GET /healthz is answered by the serving loop: with the process stopped (a loop that does not
    run), the kernel still completes a TCP connect to the webhook's port (what a tcpSocket probe
    checks), but /healthz does not answer."""
    port, health = free_port(), free_port()
    log = tmp_path / "webhook.log"
    proc = start_webhook(str(control_plane.kubeconfig), port, "--health-port", str(health), log_path=log)

    def healthz(timeout: float = 1.0) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=timeout) as resp:
            return resp.status

    try:
        _wait_serving(port, log)
        assert healthz() == 200
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass  # a TCP probe passes
            with pytest.raises((TimeoutError, urllib.error.URLError)):
                healthz()
        finally:
            os.killpg(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert healthz(2) == 200
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        stop(proc)
