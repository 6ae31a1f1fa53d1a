"""dranet: a Kubernetes DRA driver for network interfaces and RDMA NICs (driver name ``dra.net``).

Packages by concern, each may import only those below it (checked by the import-linter
contracts in pyproject.toml; docs/architecture.md draws the picture):

- ``cli``, ``daemon``, ``webhook``: entry points; only they wire components together.
- ``nri``, ``health``: the node's faces to the container runtime and NIC health. Independent of
  each other.
- ``claims``: a claim's prepare, pod settings, claim status.
- ``dra``: the DRA kubelet-plugin kit (kubelet gRPC, ResourceSlices, the health stream), for any
  driver; the network driver plugs into it (``daemon.lifecycle.NetworkDriver``).
- ``checkpoint``, ``inventory``, ``kube``, ``netlink``: state on disk, what the node has, the API
  client, the kernel's netlink. Independent of each other.
- ``api``: the claim configuration, one package per version (``v1alpha1``), no I/O.
- ``model``, ``metrics``, ``logs``: shared vocabulary and plumbing; ``config`` (every default,
  once) at the bottom.
"""

__version__ = "0.1.0"
