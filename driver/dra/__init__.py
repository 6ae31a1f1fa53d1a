"""A DRA kubelet-plugin kit, for any DRA driver: what Go's ``k8s.io/dynamic-resource-allocation``
``kubeletplugin.Helper`` and ``resourceslice`` controller are. It knows nothing of NICs.

A driver implements :class:`~driver.dra.protocol.DRADriver` (prepare, unprepare, devices,
health); :class:`~driver.dra.helper.Helper` runs the rest: ``plugin`` (registration and DRA
sockets, rolling-update names, stale socket removal), ``registration``, ``dra_service`` (the DRA
gRPC service, v1 and v1beta1), ``health`` (the periodic check, the ``DRAResourceHealth``
stream), ``slices`` (pool bodies split at the per-slice device limit, the write plan),
``publisher`` (coalesced, only-changed writes, watch, resync), ``taints`` (unhealthy devices'
taints), ``field_support`` (which device fields the apiserver keeps).

May import: ``driver.kube`` (the API client) and ``dranet_proto`` (the kubelet's protos); nothing
else of ``driver`` (a contract in pyproject.toml).
"""
