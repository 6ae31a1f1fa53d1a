"""The kubelet's side: plugin registration, the DRA gRPC service (v1, v1beta1) and the
device-health stream, served on unix sockets by ``plugin.KubeletPlugin``.

May import: ``driver.claims`` (the Preparer), ``driver.model``, ``driver.metrics``,
``dranet_proto``, ``driver.config``.
"""
