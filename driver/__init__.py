"""dranet: a Kubernetes DRA driver for network interfaces and RDMA NICs (driver name ``dra.net``)."""

__version__ = "0.1.0"
