"""``kubectl dranet doctor``: does the installation work, as far as the caller may see?

Each check says ``ok``, ``warn``, ``fail``, ``info`` or ``unknown`` (the caller's RBAC does not
allow the look, and the detail says what it needs), so a namespace user gets the checks they can
make and an admin all of them:

- ``api``: the server serves ``resource.k8s.io/v1`` (Kubernetes >= 1.34);
- ``deviceclass``: a DeviceClass selects the driver's devices (and the one claims name exists);
- ``driver pods``: a Ready driver pod on every Ready node (needs: list pods in the driver's
  namespace; nodes, to find nodes without one);
- ``slices``: every node with a driver pod publishes a complete pool of the newest generation,
  no slice is left of a node that is gone or has no driver, and when the newest was written;
- ``webhook``: a dry-run ResourceClaim with an invalid config for the driver, in the caller's
  namespace, is refused by the webhook (so it is installed and reachable; nothing is stored);
- ``feature gates``: ``DRADeviceTaints`` (device taints for unhealthy NICs) on the API server;
- ``state``: a driver that found its prepared claims damaged at start says so with a Warning
  event on its Node (reason ``DranetStateDamaged``; needs: list events in ``default``): listed,
  with when and what, so a damaged disk is seen before it loses more;
- ``kernels``: each driver node's kernel (``status.nodeInfo.kernelVersion``) against the supported
  floor, and the features its version lacks with what the driver does instead (needs: list nodes;
  the driver's own start check and its ``dranet_driver_kernel_feature`` metric also see modules).
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import asdict, dataclass
from typing import Any

from driver.config import DEVICE_CLASS, DRIVER_NAME, STATE_DAMAGED_EVENT
from driver.kube.client import KubeClient
from driver.kube.errors import Forbidden, KubeError, NotFound
from driver.netlink import kernel_features
from driver.netlink.kernel_features import BY_VERSION, FLOOR

OK, WARN, FAIL, INFO, UNKNOWN = "ok", "warn", "fail", "info", "unknown"
DRIVER_POD_SELECTOR = "app.kubernetes.io/name=dranet,app.kubernetes.io/component=driver"
PROBE_IFNAME = "dranet-doctor-probe"  # 19 characters: any driver webhook refuses it (Linux allows 15)


@dataclass
class Check:
    """One line of the doctor's report."""

    name: str
    status: str
    detail: str


@dataclass
class DoctorOptions:
    """Where the driver is installed and what claims call it."""

    namespace: str  # the caller's: the webhook probe is a dry run there
    driver_name: str = DRIVER_NAME
    device_class: str = DEVICE_CLASS
    driver_namespace: str = "kube-system"
    driver_selector: str = DRIVER_POD_SELECTOR


def _needs(name: str, exc: Forbidden, what: str) -> Check:
    """An ``unknown`` check: the caller may not look (``what`` says at what)."""
    del exc  # the API's message names the ServiceAccount, not what is missing
    return Check(name, UNKNOWN, f"not allowed to {what}")


def check_api(kube: KubeClient) -> Check:
    try:
        version = kube.get_code().get("gitVersion", "?")
    except KubeError:
        version = "?"
    try:
        served = {r.get("name") for r in kube.get_api_resources("resource.k8s.io/v1").get("resources") or []}
    except NotFound:
        return Check("api", FAIL, f"Kubernetes {version} does not serve resource.k8s.io/v1: dranet needs 1.34 or newer")
    missing = {"resourceslices", "resourceclaims", "deviceclasses"} - served
    if missing:
        return Check("api", FAIL, f"resource.k8s.io/v1 lacks {', '.join(sorted(missing))}")
    return Check("api", OK, f"Kubernetes {version} serves resource.k8s.io/v1")


def _selects(device_class: dict[str, Any], driver: str) -> bool:
    for sel in (device_class.get("spec") or {}).get("selectors") or []:
        expression = " ".join(str((sel.get("cel") or {}).get("expression") or "").split())
        if f'device.driver == "{driver}"' in expression or f"device.driver == '{driver}'" in expression:
            return True
    return False


def check_device_class(kube: KubeClient, options: DoctorOptions) -> Check:
    try:
        classes = kube.list_device_class().get("items") or []
    except Forbidden as exc:
        return _needs("deviceclass", exc, "list deviceclasses")
    selecting = sorted(c["metadata"]["name"] for c in classes if _selects(c, options.driver_name))
    names = {c["metadata"]["name"] for c in classes}
    if not selecting:
        return Check("deviceclass", FAIL, f"no DeviceClass selects device.driver == {options.driver_name!r}")
    if options.device_class not in names:
        return Check(
            "deviceclass",
            WARN,
            f"{options.device_class} does not exist (claims naming it stay unallocated); "
            f"classes selecting {options.driver_name}: {', '.join(selecting)}",
        )
    return Check("deviceclass", OK, f"classes selecting {options.driver_name}: {', '.join(selecting)}")


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _node_ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def driver_pods(kube: KubeClient, options: DoctorOptions) -> tuple[dict[str, bool] | None, Check]:
    """node -> a Ready driver pod there (None when pods cannot be listed), and the check."""
    try:
        pods = kube.list_namespaced_pod(options.driver_namespace, options.driver_selector).get("items") or []
    except Forbidden as exc:
        what = f"list pods in {options.driver_namespace} (a cluster admin's check)"
        return None, _needs("driver pods", exc, what)
    by_node: dict[str, bool] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node[node] = by_node.get(node, False) or _ready(pod)
    try:
        nodes = [n for n in kube.list_node().get("items") or [] if _node_ready(n)]
        ready_nodes = sorted(n["metadata"]["name"] for n in nodes)
    except Forbidden:
        ready_nodes = sorted(by_node)
    without = [n for n in ready_nodes if not by_node.get(n)]
    if not pods:
        return by_node, Check(
            "driver pods", FAIL, f"no driver pod in {options.driver_namespace} ({options.driver_selector})"
        )
    if without:
        return by_node, Check(
            "driver pods", FAIL, f"no Ready driver pod on {', '.join(without)} ({len(ready_nodes)} Ready nodes)"
        )
    return by_node, Check("driver pods", OK, f"a Ready driver pod on each of {len(ready_nodes)} Ready nodes")


def _written_at(s: dict[str, Any]) -> datetime.datetime | None:
    times = [m.get("time") for m in (s.get("metadata") or {}).get("managedFields") or [] if m.get("time")]
    times.append((s.get("metadata") or {}).get("creationTimestamp"))
    parsed = [datetime.datetime.fromisoformat(str(t).replace("Z", "+00:00")) for t in times if t]
    return max(parsed) if parsed else None


def check_slices(kube: KubeClient, options: DoctorOptions, pods: dict[str, bool] | None) -> Check:
    slices = kube.list_resource_slice(f"spec.driver={options.driver_name}").get("items") or []
    pools: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        pools.setdefault(str((s["spec"].get("pool") or {}).get("name")), []).append(s)
    problems, warnings = [], []
    for pool, members in sorted(pools.items()):
        newest = max(int(m["spec"]["pool"].get("generation") or 0) for m in members)
        current = [m for m in members if int(m["spec"]["pool"].get("generation") or 0) == newest]
        want = int(current[0]["spec"]["pool"].get("resourceSliceCount") or 1)
        if len(current) != want:
            problems.append(f"pool {pool}: {len(current)} of {want} slices of generation {newest}")
        if len(current) != len(members):
            warnings.append(f"pool {pool}: {len(members) - len(current)} slice(s) of an older generation")
    nodes_with_slices = {str(s["spec"].get("nodeName")) for s in slices if s["spec"].get("nodeName")}
    if pods is not None:
        missing = sorted(n for n, ready in pods.items() if ready and n not in nodes_with_slices)
        problems += [f"node {n}: a Ready driver pod but no ResourceSlice" for n in missing]
        stale = sorted(n for n in nodes_with_slices if n not in pods)
        warnings += [f"node {n}: slices but no driver pod (stale until the driver returns)" for n in stale]
    try:
        existing = {n["metadata"]["name"] for n in kube.list_node().get("items") or []}
        problems += [f"node {n}: slices of a Node that does not exist" for n in sorted(nodes_with_slices - existing)]
    except Forbidden:
        pass
    if not slices:
        return Check("slices", FAIL, f"no ResourceSlice of driver {options.driver_name}")
    written = [t for t in (_written_at(s) for s in slices) if t]
    newest_write = ""
    if written:
        age = datetime.datetime.now(datetime.UTC) - max(written)
        newest_write = f"; newest written {int(age.total_seconds())}s ago (slices change only when devices do)"
    summary = f"{len(slices)} slice(s) from {len(nodes_with_slices)} node(s){newest_write}"
    if problems:
        return Check("slices", FAIL, "; ".join(problems + warnings) + f" ({summary})")
    if warnings:
        return Check("slices", WARN, "; ".join(warnings) + f" ({summary})")
    return Check("slices", OK, summary)


def probe_claim(options: DoctorOptions) -> dict[str, Any]:
    """A ResourceClaim whose config for the driver every webhook of the driver refuses."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "dranet-doctor-", "namespace": options.namespace},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": options.device_class}}],
                "config": [
                    {
                        "requests": ["nic"],
                        "opaque": {"driver": options.driver_name, "parameters": {"interface": {"name": PROBE_IFNAME}}},
                    }
                ],
            }
        },
    }


def check_webhook(kube: KubeClient, options: DoctorOptions) -> Check:
    try:
        kube.create_namespaced_resource_claim(options.namespace, probe_claim(options), dry_run=True)
    except KubeError as exc:
        text = exc.message
        if "failed calling webhook" in text or "failed to call webhook" in text:
            return Check("webhook", FAIL, f"unreachable: {text}")
        if "denied the request" in text:
            return Check("webhook", OK, "reachable: it refused an invalid config (dry run, nothing stored)")
        if isinstance(exc, Forbidden):
            return _needs("webhook", exc, f"create resourceclaims in {options.namespace} (dry run)")
        return Check("webhook", WARN, f"the dry-run claim failed for another reason: {exc}")
    return Check(
        "webhook",
        WARN,
        "no webhook refused an invalid config: not installed (webhook.enabled=false), or unreachable "
        "with failurePolicy Ignore; invalid configs then fail only at pod start",
    )


def check_gates(kube: KubeClient) -> Check:
    try:
        alpha = {r.get("name") for r in kube.get_api_resources("resource.k8s.io/v1alpha3").get("resources") or []}
    except NotFound:
        alpha = set()
    except Forbidden as exc:
        return _needs("feature gates", exc, "read API discovery")
    if "devicetaintrules" in alpha:
        return Check("feature gates", OK, "DRADeviceTaints on: unhealthy NICs are tainted in their ResourceSlice")
    return Check(
        "feature gates",
        INFO,
        "DRADeviceTaints off (alpha; apiserver, scheduler, controller-manager, and resource.k8s.io/v1alpha3 served): "
        "unhealthy NICs are reported to the kubelet but not tainted; ResourceHealthStatus is a kubelet gate, "
        "not visible from the API",
    )


def check_kernels(kube: KubeClient, pods: dict[str, bool] | None) -> Check:
    """Each driver node's kernel against the floor; what its version lacks."""
    try:
        nodes = kube.list_node().get("items") or []
    except Forbidden as exc:
        return _needs("kernels", exc, "list nodes")
    below: list[str] = []
    lacking: list[str] = []
    for node in nodes:
        name = node["metadata"]["name"]
        if pods is not None and name not in pods:
            continue
        release = ((node.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion") or ""
        kernel = kernel_features.detect(release=release, rdma_socket=_no_socket)
        if kernel.below_floor:
            below.append(f"{name} ({release or 'unknown'})")
        missing = [f"{f.name} (needs {f.needs}: {f.without})" for f in kernel.missing() if f.name in BY_VERSION]
        if missing:
            lacking.append(f"{name} {release}: without {'; '.join(missing)}")
    floor = ".".join(map(str, FLOOR))
    if below:
        return Check("kernels", FAIL, f"below the supported floor {floor}: {', '.join(below)}")
    if lacking:
        return Check("kernels", INFO, " | ".join(lacking))
    return Check("kernels", OK, f"every driver node runs Linux {floor} or newer with every feature its version gives")


def check_state(kube: KubeClient) -> Check:
    """Nodes whose driver found its prepared claims damaged (their Warning events)."""
    selector = f"involvedObject.kind=Node,reason={STATE_DAMAGED_EVENT}"
    try:
        events = kube.list_namespaced_event("default", selector).get("items") or []
    except Forbidden as exc:
        return _needs("state", exc, "list events in default")
    if not events:
        return Check("state", OK, "no driver found its prepared claims damaged")
    lines = sorted(
        f"{(e.get('involvedObject') or {}).get('name')} at {e.get('lastTimestamp') or e.get('eventTime')}: "
        f"{e.get('message')}"
        for e in events
    )
    return Check(
        "state",
        WARN,
        f"{len(events)} damaged state file(s), claims rebuilt from the API server; check "
        f"the node's disk: {' | '.join(lines)}",
    )


def _no_socket() -> socket.socket:
    raise OSError("not asked: the node's modules are seen by the driver, not from the API")


def run_checks(kube: KubeClient, options: DoctorOptions) -> list[Check]:
    """Every check, in the order printed."""
    pods, pod_check = driver_pods(kube, options)
    return [
        check_api(kube),
        check_device_class(kube, options),
        pod_check,
        check_slices(kube, options, pods),
        check_webhook(kube, options),
        check_gates(kube),
        check_state(kube),
        check_kernels(kube, pods),
    ]


def to_json(checks: list[Check]) -> dict[str, Any]:
    return {"checks": [asdict(c) for c in checks], "healthy": not any(c.status == FAIL for c in checks)}
