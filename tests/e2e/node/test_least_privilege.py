"""The driver as the chart deploys it: not privileged, exactly two capabilities, its own RBAC.

Checked on the running DaemonSet pod and on the driver process itself (the kernel's view of
its capabilities), plus no 403 in anything the driver logged this session (the session
fixture checks that again at the very end, after every other test).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster.cluster import lifecycle as cluster
from tests.e2e.node.realnode import E2E_MARKS, RealNode
from tests.plugins.least_privilege import forbidden_lines

pytestmark = E2E_MARKS

CHART_VALUES = Path(cluster.CHART) / "values.yaml"
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def _status_field(pid: int, name: str) -> str:
    return next(
        line.split(":", 1)[1].strip()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(name + ":")
    )


def test_daemonset_runs_with_the_charts_security_context(real_node: RealNode) -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())
    pod = real_node.driver_pod()
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"] == values["securityContext"]
    assert container["securityContext"]["privileged"] is False
    assert pod["spec"]["hostNetwork"] is True and not pod["spec"].get("hostPID")
    assert pod["spec"]["serviceAccountName"] == cluster.RELEASE
    # The kernel's view of the running process: uid 0, NET_ADMIN + SYS_ADMIN and nothing else.
    (pid,) = real_node.driver_pids()
    wanted = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)
    assert int(_status_field(pid, "CapEff"), 16) == wanted
    assert int(_status_field(pid, "CapBnd"), 16) == wanted
    assert _status_field(pid, "Uid").split()[0] == "0"
    # Its API identity is the pod-bound token of the chart's ServiceAccount, not an admin's.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert any("projected" in v for v in volumes.values()), sorted(volumes)


def test_rbac_is_the_charts_and_never_refused(real_node: RealNode) -> None:
    role = real_node.kube.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{cluster.RELEASE}")
    binding = real_node.kube.request("GET", f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{cluster.RELEASE}")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": cluster.RELEASE, "namespace": cluster.NAMESPACE}]
    # Least privilege: no wildcard verbs or resources anywhere.
    for rule in role["rules"]:
        assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", []), rule
    # It did write with these permissions: its slice is there (the kubelet wipes a node's slices
    # when it starts, so after a kubelet restart this is the driver's own re-publication).
    slices = real_node.kube.request(
        "GET",
        "/apis/resource.k8s.io/v1/resourceslices",
        query={"fieldSelector": f"spec.driver=dra.net,spec.nodeName={real_node.node}"},
    )["items"]
    assert sum(len(s["spec"].get("devices") or []) for s in slices) == 8
    assert forbidden_lines(real_node.driver_logs()) == []
