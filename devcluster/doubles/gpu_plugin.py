"""TEST DOUBLE of the NVIDIA GPU DRA driver as a real kubelet plugin (``gpu.nvidia.com``).

On the real node the kubelet calls NodePrepareResources for every driver a pod's claim
allocated from, so the training example's GPU requests need a plugin that answers. This one is a real
kubelet plugin (plugin registration + ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` over unix
sockets, the driver's own generated stubs) that prepares nothing physical: for each claim it
writes a CDI spec (``<cdi dir>/gpu.nvidia.com-<claim uid>.json``) whose devices set
environment variables in the container (``NVIDIA_VISIBLE_DEVICES`` with the GPUs' UUIDs and
one ``DRA_GPU_<index>`` per GPU with its UUID and PCI address), so a pod shows which GPUs it
got. It also keeps the node's GPU ResourceSlice published (`devcluster.doubles.gpu_double`): the
kubelet wipes a node's slices when it starts. The GPUs are those of the node's fixture sysfs
(``--sysfs-root``, the node's own by default: the layout's topology), so their ``pciBusID`` and
``pcieRoot`` are the machine's.

    python -m devcluster.doubles.gpu_plugin --kubeconfig K --node-name N --kubelet-root R --cdi-dir D
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import uuid
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from devcluster.doubles import gpu_double
from dranet_proto import dra_v1_pb2 as v1_pb
from dranet_proto import dra_v1_pb2_grpc as v1_grpc
from dranet_proto import pluginregistration_pb2 as reg_pb
from dranet_proto import pluginregistration_pb2_grpc as reg_grpc
from driver.kube.client import KubeClient
from driver.kube.errors import KubeError
from driver.logs import setup_logging

log = logging.getLogger(__name__)

DRIVER = gpu_double.GPU_DRIVER
CDI_KIND = "nvidia.com/gpu"
CDI_VERSION = "0.5.0"  # env only: the lowest version that covers what we use
NODE_FIXTURE_SYSFS = "/run/dranet-fixture/sys"
"""Where a dev-cluster node has its fixture sysfs (node_layout's ``InNode.fixture_sysfs``; the doubles
sit below the cluster in the layering, so the path is named here too and a test keeps the two equal)."""


def gpu_uuid(node: str, pci_bus_id: str) -> str:
    """A stable, NVIDIA-shaped UUID for one GPU of one node (``GPU-<uuid>``)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"dranet-gpu-double/{node}/{pci_bus_id}"))


@dataclass(frozen=True)
class GpuPluginConfig:
    """Where the plugin listens and writes."""

    node_name: str
    kubelet_root: Path
    cdi_dir: Path
    gpus: list[gpu_double.FakeGPU] = field(default_factory=gpu_double.nd_h100_v5_gpus)

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_root / "plugins" / DRIVER / "dra.sock"

    def cdi_spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / f"{DRIVER}-{claim_uid}.json"


def cdi_spec(claim_uid: str, gpus: list[gpu_double.FakeGPU], node: str) -> dict[str, Any]:
    """One CDI spec per claim: a device per GPU plus ``<uid>-all`` with NVIDIA_VISIBLE_DEVICES.

    Device names carry the claim UID so a name is never reused (runtimes may cache specs).
    """
    devices = [
        {
            "name": f"{claim_uid}-gpu-{g.index}",
            "containerEdits": {"env": [f"DRA_GPU_{g.index}={gpu_uuid(node, g.pci_bus_id)},{g.pci_bus_id}"]},
        }
        for g in gpus
    ]
    devices.append(
        {
            "name": f"{claim_uid}-all",
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=" + ",".join(gpu_uuid(node, g.pci_bus_id) for g in gpus)]
            },
        }
    )
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, cfg: GpuPluginConfig) -> None:
        self.cfg = cfg

    def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint=str(self.cfg.dra_socket), supported_versions=["v1.DRAPlugin"]
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        log.info("registration status", extra={"kv": {"registered": request.plugin_registered, "error": request.error}})
        return reg_pb.RegistrationStatusResponse()


class _DRA(v1_grpc.DRAPluginServicer):
    def __init__(self, cfg: GpuPluginConfig, kube: KubeClient) -> None:
        self.cfg, self.kube = cfg, kube
        self.by_name = {f"gpu-{g.index}": g for g in cfg.gpus}

    def _prepare_one(self, claim: Any) -> v1_pb.NodePrepareResourceResponse:
        try:
            obj = self.kube.read_namespaced_resource_claim(claim.namespace, claim.name)
        except KubeError as exc:
            return v1_pb.NodePrepareResourceResponse(error=f"GET claim {claim.namespace}/{claim.name}: {exc}")
        if obj["metadata"]["uid"] != claim.uid:
            return v1_pb.NodePrepareResourceResponse(error=f"claim {claim.name} was replaced (uid differs)")
        alloc = (obj.get("status") or {}).get("allocation")
        if not alloc:
            return v1_pb.NodePrepareResourceResponse(error=f"claim {claim.name} is not allocated")
        results = [r for r in alloc["devices"]["results"] if r["driver"] == DRIVER and r["pool"] == self.cfg.node_name]
        gpus = [self.by_name[r["device"]] for r in results if r["device"] in self.by_name]
        spec = cdi_spec(claim.uid, gpus, self.cfg.node_name)
        path = self.cfg.cdi_spec_path(claim.uid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(spec, indent=1))
        os.replace(tmp, path)  # atomic: the runtime never reads half a spec
        devices = [
            v1_pb.Device(
                request_names=[r["request"].split("/")[0]],
                pool_name=r["pool"],
                device_name=r["device"],
                cdi_device_ids=[f"{CDI_KIND}={claim.uid}-{r['device']}", f"{CDI_KIND}={claim.uid}-all"],
            )
            for r in results
        ]
        log.info("prepared", extra={"kv": {"claim": claim.name, "gpus": [g.index for g in gpus]}})
        return v1_pb.NodePrepareResourceResponse(devices=devices)

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        return v1_pb.NodePrepareResourcesResponse(claims={c.uid: self._prepare_one(c) for c in request.claims})

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        for c in request.claims:
            self.cfg.cdi_spec_path(c.uid).unlink(missing_ok=True)
        return v1_pb.NodeUnprepareResourcesResponse(
            claims={c.uid: v1_pb.NodeUnprepareResourceResponse() for c in request.claims}
        )


def _unix_server(path: Path) -> grpc.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_insecure_port(f"unix://{path}")
    return server


def serve(cfg: GpuPluginConfig, kube: KubeClient, stop: threading.Event, republish_every: float = 2.0) -> None:
    """Serve until ``stop`` is set; keeps the GPU slice published; removes both sockets after."""
    cfg.cdi_dir.mkdir(parents=True, exist_ok=True)
    dra = _unix_server(cfg.dra_socket)
    v1_grpc.add_DRAPluginServicer_to_server(_DRA(cfg, kube), dra)
    dra.start()  # DRA first: the kubelet dials it right after registration
    reg = _unix_server(cfg.registration_socket)
    reg_grpc.add_RegistrationServicer_to_server(_Registration(cfg), reg)
    reg.start()
    log.info("gpu plugin serving", extra={"kv": {"registration": str(cfg.registration_socket)}})
    try:
        while not stop.is_set():
            try:
                gpu_double.install(kube, cfg.node_name, cfg.gpus)  # no-op while the slice exists
            except (KubeError, OSError) as exc:
                log.warning("publishing the GPU slice failed", extra={"kv": {"error": str(exc)[:200]}})
            stop.wait(republish_every)
    finally:
        reg.stop(0)
        cfg.registration_socket.unlink(missing_ok=True)  # deregisters from the kubelet
        dra.stop(0)
        cfg.dra_socket.unlink(missing_ok=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The plugin's flags. ``--sysfs-root`` defaults to the node's own fixture (the plugin runs in the
    node's mount namespace, where node_daemons starts it without the flag)."""
    ap = argparse.ArgumentParser(prog="python -m devcluster.doubles.gpu_plugin", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--node-name", required=True)
    ap.add_argument("--kubelet-root", required=True, type=Path)
    ap.add_argument("--cdi-dir", required=True, type=Path)
    ap.add_argument("--sysfs-root", default=NODE_FIXTURE_SYSFS, help="the node's (fixture) sysfs: its GPUs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: serve until SIGTERM/SIGINT."""
    a = parse_args(argv)
    setup_logging("info", "text")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    gpus = gpu_double.fixture_gpus(a.sysfs_root)
    log.info("gpus", extra={"kv": {"sysfs": a.sysfs_root, "gpus": [(g.pci_bus_id, g.pcie_root) for g in gpus]}})
    cfg = GpuPluginConfig(a.node_name, a.kubelet_root, a.cdi_dir, gpus)
    serve(cfg, KubeClient.from_kubeconfig(a.kubeconfig), stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
