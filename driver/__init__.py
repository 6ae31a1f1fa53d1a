"""dranet: a Kubernetes DRA driver for network interfaces and RDMA NICs (driver name ``dra.net``).

Packages by concern, each may import only those below it (checked by the import-linter
contracts in pyproject.toml; docs/architecture.md draws the picture):

- ``cli``, ``daemon``, ``webhook``: entry points; only they wire components together.
- ``kubelet``, ``nri``, ``publish``, ``probe_server``: the node's faces to the kubelet, the
  container runtime, the API server's ResourceSlices and HTTP probes. Independent of each other.
- ``claims``: a claim's config (decode, merge, validate), prepare, pod settings, claim status.
- ``checkpoint``, ``inventory``, ``kube``, ``netlink``: state on disk, what the node has, the API
  client, the kernel's netlink. Independent of each other.
- ``model``, ``metrics``, ``logs``, ``proto``: shared vocabulary and plumbing; ``config`` (every
  default, once) at the bottom.
"""

__version__ = "0.1.0"
