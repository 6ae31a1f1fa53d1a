"""Shared pytest configuration: fixtures live in harness/ (shared with bench/) and tests/plugins/, by area."""

pytest_plugins = [
    "harness.sysfs",  # fixture sysfs trees (ND H100 v5, SR-IOV, ...)
    "harness.netns",  # throwaway network namespaces and veth pairs
    "tests.plugins.cluster",  # real etcd + kube-apiserver + scheduler + controller-manager
    "harness.nri",  # the NRI runtime-side harness
    "tests.plugins.least_privilege",  # the chart's RBAC + node policy, a pod-bound driver token
    "tests.plugins.tmpfs",  # small real tmpfs mounts (full-disk tests)
]
