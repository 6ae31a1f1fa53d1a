"""A real Kubernetes control plane on 127.0.0.1 for tests and the demo.

etcd + kube-apiserver + kube-scheduler + kube-controller-manager (resourceclaim controller and
garbage collector), each in its own process group, with generated certificates, a static admin
token and an admin kubeconfig in one temp directory. ``stop()`` kills every process group and
removes the directory, also after a failed start; use it as a context manager.
Flags follow /work/shared/reference/real-cluster.md §3.2-3.4.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.builders.binaries import ControlPlaneBinaries, ensure_control_plane
from devcluster.cluster import certs
from devcluster.cluster.node_layout import SERVICE_RANGES
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Children get SIGKILL if the forking thread dies (e.g. pytest killed with -9), so no
    # apiserver survives a crashed test run. Only used when forking from the main thread,
    # because the signal fires when the *thread* that forked exits.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class ControlPlaneOptions:
    """Knobs for `ControlPlane`; defaults are what the tests need."""

    feature_gates: dict[str, bool] = field(default_factory=dict)
    runtime_config: dict[str, str] = field(default_factory=dict)
    controllers: tuple[str, ...] = ("resourceclaim-controller", "garbage-collector-controller")
    scheduler: bool = True
    controller_manager: bool = True
    start_timeout: float = 120.0
    keep_dir: bool = False  # keep the temp dir (logs) after stop, for debugging
    # No ServiceAccount admission (KCM's serviceaccount controller is not running) and no
    # node-lifecycle controller to lift the not-ready taint from a kubelet-less Node
    # (real-cluster.md §3.4). A cluster with a real kubelet enables ServiceAccount.
    disable_admission_plugins: tuple[str, ...] = ("ServiceAccount", "TaintNodesByCondition")
    apiserver_args: tuple[str, ...] = ()
    controller_manager_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    # Where the apiserver listens (and its serving certificate's extra SAN). A real node uses
    # its CNI bridge address, so pods reach the apiserver without a service proxy.
    bind_address: str = "127.0.0.1"
    # More names the serving certificate holds: a QEMU guest on the user network reaches this
    # machine's 127.0.0.1 as 10.0.2.2 (devcluster.guest_node).
    serving_hosts: tuple[str, ...] = ()
    # The Services' virtual ranges, the primary first (its family must be the bind address's).
    service_ip_ranges: tuple[str, ...] = (SERVICE_RANGES[4],)
    # Processes outlive the Python process that started them (``devcluster up``).
    detached: bool = False


class ControlPlaneError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on loopback."""

    def __init__(
        self,
        binaries: ControlPlaneBinaries | None = None,
        options: ControlPlaneOptions | None = None,
        base_dir: str | None = None,
    ) -> None:
        self.binaries = binaries
        self.options = options or ControlPlaneOptions()
        self._base_dir = base_dir
        self.dir: Path | None = None
        self.procs: list[_Proc] = []
        self.server = ""
        self.kubeconfig: Path | None = None
        self.creds: certs.ClusterCredentials | None = None
        self.start_seconds: float = 0.0

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start all components and wait until each is healthy; cleans up on failure."""
        t0 = time.monotonic()
        for attempt in range(3):
            try:
                self._start()
                break
            except ControlPlaneError as exc:
                self.stop()
                # free_port() can race with other processes grabbing the same port: retry.
                if "address already in use" not in str(exc) or attempt == 2:
                    raise
                log.warning("port taken while starting, retrying", extra={"kv": {"error": str(exc)[:200]}})
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - t0
        log.info("control plane ready", extra={"kv": {"server": self.server, "seconds": round(self.start_seconds, 2)}})
        return self

    def _start(self) -> None:
        if self.binaries is None:
            self.binaries = ensure_control_plane()
        b = self.binaries
        self.dir = Path(tempfile.mkdtemp(prefix="dranet-cp-", dir=self._base_dir))
        (self.dir / "logs").mkdir()
        bind = self.options.bind_address
        hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", bind, *self.options.serving_hosts)))
        self.creds = c = certs.generate(self.dir / "pki", hosts=hosts)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(b.etcd),
                f"--data-dir={self.dir / 'etcd'}",
                "--name=default",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.server = f"https://{_url_host(bind)}:{api_port}"
        api = [
            str(b.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={bind}",
            f"--advertise-address={bind}",
            f"--secure-port={api_port}",
            f"--tls-cert-file={c.serving_crt}",
            f"--tls-private-key-file={c.serving_key}",
            f"--client-ca-file={c.ca_crt}",
            f"--token-auth-file={c.tokens_csv}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={c.sa_pub}",
            f"--service-account-signing-key-file={c.sa_key}",
            "--service-cluster-ip-range=" + ",".join(self.options.service_ip_ranges),
            "--allow-privileged=true",
            "--disable-admission-plugins=" + ",".join(self.options.disable_admission_plugins),
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.dir / 'pki'}",
        ]
        api += self._gate_args()
        api += self.options.apiserver_args
        if self.options.runtime_config:
            api.append(
                "--runtime-config=" + ",".join(f"{k}={v}" for k, v in sorted(self.options.runtime_config.items()))
            )
        # Started without waiting for etcd: its etcd client retries, and the two start-ups
        # overlap (saves up to ~0.8 s of the ~3 s start).
        self._spawn("kube-apiserver", api)
        self._wait("etcd", f"{etcd_url}/health", None)
        self._wait("kube-apiserver", f"{self.server}/readyz", self._ca_context())
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.kubeconfig.write_text(certs.kubeconfig_yaml(self.server, c.ca_crt, c.admin_token))
        waits = []
        if self.options.scheduler:
            port = free_port()
            self._spawn(
                "kube-scheduler",
                [
                    str(b.kube_scheduler),
                    f"--kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    *self._gate_args(),
                    *self.options.scheduler_args,
                ],
            )
            waits.append(("kube-scheduler", f"https://127.0.0.1:{port}/healthz"))
        if self.options.controller_manager:
            port = free_port()
            self._spawn(
                "kube-controller-manager",
                [
                    str(b.kube_controller_manager),
                    f"--kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--controllers=" + ",".join(self.options.controllers),
                    "--bind-address=127.0.0.1",
                    # The root-ca publisher's CA (kube-root-ca.crt in every namespace, for pods'
                    # service-account volumes): our kubeconfig names a CA file, which KCM does not read.
                    f"--root-ca-file={c.ca_crt}",
                    f"--secure-port={port}",
                    *self._gate_args(),
                    *self.options.controller_manager_args,
                ],
            )
            waits.append(("kube-controller-manager", f"https://127.0.0.1:{port}/healthz"))
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their serving certs are self-signed, loopback only
        for name, url in waits:
            self._wait(name, url, insecure)

    def stop(self) -> None:
        """Terminate every component (process groups), then remove the temp directory."""
        # Reverse order: clients before the apiserver before etcd keeps shutdown logs quiet.
        for p in reversed(self.procs):
            _terminate(p.popen)
        self.procs.clear()
        if self.dir and not self.options.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    # -- helpers ---------------------------------------------------------------------------------

    def _gate_args(self) -> list[str]:
        g = self.options.feature_gates
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(g.items()))] if g else []

    def _ca_context(self) -> ssl.SSLContext:
        assert self.creds is not None
        return ssl.create_default_context(cafile=str(self.creds.ca_crt))

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        assert self.dir is not None
        log_path = self.dir / "logs" / f"{name}.log"
        with open(log_path, "wb") as out:
            popen = subprocess.Popen(
                list(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: stop() kills the whole tree
                preexec_fn=_die_with_parent
                if threading.current_thread() is threading.main_thread() and not self.options.detached
                else None,
            )
        self.procs.append(_Proc(name, popen, log_path))

    def _wait(self, name: str, url: str, ctx: ssl.SSLContext | None) -> None:
        proc = next(p for p in self.procs if p.name == name)
        deadline = time.monotonic() + self.options.start_timeout
        headers = {}
        if self.creds and url.startswith(self.server or "\0"):
            headers["Authorization"] = f"Bearer {self.creds.admin_token}"
        last = ""
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            try:
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise ControlPlaneError(
            f"{name} not healthy at {url} after {self.options.start_timeout}s ({last}):\n{proc.tail()}"
        )

    def pids(self) -> list[int]:
        """PIDs of the running components (for leak checks)."""
        return [p.popen.pid for p in self.procs]

    def kube(self) -> KubeClient:
        """A new admin `KubeClient` for this control plane."""
        assert self.kubeconfig is not None, "control plane not started"
        return KubeClient.from_kubeconfig(str(self.kubeconfig))

    def create_node(
        self, name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Create a schedulable Node (no kubelet behind it); returns the stored object."""
        return create_node(self.kube(), name, labels, allocatable)


def _terminate(popen: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        popen.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(popen.pid, signal.SIGKILL)  # also reaps any leftover group members
    except ProcessLookupError:
        pass
    popen.wait(timeout=grace)


def create_node(
    kube: KubeClient, name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None
) -> dict[str, Any]:
    """Create a Ready, schedulable Node with status capacity/allocatable set.

    ``pods`` must be non-zero or NodeResourcesFit rejects every pod ("Too many pods").
    """
    res = {"pods": "110", "cpu": "96", "memory": "1800Gi", **(allocatable or {})}
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **(labels or {}),
    }
    status = {
        "capacity": res,
        "allocatable": res,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "dranet test node (no kubelet)"}
        ],
    }
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}, "status": status}
    node = kube.request("POST", "/api/v1/nodes", body)
    if not node.get("status", {}).get("allocatable"):
        # Some versions drop status on create; set it through the status subresource.
        node = kube.request(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": status}, content_type="application/merge-patch+json"
        )
    return node


_PLURALS = {
    "DeviceClass": "deviceclasses",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "ResourceSlice": "resourceslices",
    "Pod": "pods",
    "Namespace": "namespaces",
    "Node": "nodes",
    "ConfigMap": "configmaps",
}
_CLUSTER_SCOPED = {"DeviceClass", "ResourceSlice", "Namespace", "Node"}


def object_path(obj: dict[str, Any], namespace: str = "default") -> str:
    """The collection URL for ``obj`` (only the kinds tests and the demo use)."""
    kind, api_version = obj["kind"], obj["apiVersion"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if kind not in _PLURALS:
        raise ValueError(f"kind {kind} not supported by object_path")
    if kind in _CLUSTER_SCOPED:
        return f"{prefix}/{_PLURALS[kind]}"
    ns = obj.get("metadata", {}).get("namespace", namespace)
    return f"{prefix}/namespaces/{ns}/{_PLURALS[kind]}"


def create_objects(kube: KubeClient, docs: list[dict[str, Any]], namespace: str = "default") -> list[dict[str, Any]]:
    """POST each object (like ``kubectl create``); an existing object raises 409 AlreadyExists
    on purpose, so leftovers from an earlier run are noticed instead of silently reused."""
    return [kube.request("POST", object_path(d, namespace), d) for d in docs if d]


def load_yaml_docs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All YAML documents in a file (empty ones skipped)."""
    import yaml

    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll ``predicate()`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = predicate()
            if v:
                return v
        except (KubeError, KeyError, IndexError) as exc:
            last_exc = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else "")
    )


def main() -> int:
    """``python -m devcluster.cluster.controlplane``: start, print the kubeconfig path, run until Ctrl-C."""
    logging.basicConfig(level=logging.INFO)
    # SIGTERM behaves like Ctrl-C, so the context manager stops every process and removes files.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with ControlPlane() as cp:
        print(
            json.dumps(
                {"server": cp.server, "kubeconfig": str(cp.kubeconfig), "start_seconds": round(cp.start_seconds, 2)}
            ),
            flush=True,
        )
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _url_host(host: str) -> str:
    """``host`` as a URL's authority has it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
