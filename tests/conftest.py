"""Shared pytest configuration: fixtures live in tests/plugins/, one module per area."""

pytest_plugins = [
    "tests.plugins.sysfs",  # fixture sysfs trees (ND H100 v5, SR-IOV, ...)
    "tests.plugins.netns",  # throwaway network namespaces and veth pairs
    "tests.plugins.cluster",  # real etcd + kube-apiserver + scheduler + controller-manager
    "tests.plugins.nri",  # the NRI runtime-side harness
    "tests.plugins.least_privilege",  # the chart's RBAC + node policy, a pod-bound driver token
    "tests.plugins.tmpfs",  # small real tmpfs mounts (full-disk tests)
]
