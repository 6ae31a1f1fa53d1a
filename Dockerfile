# syntax=docker/dockerfile:1
# dranet image: the `dranet` CLI (node driver `dranet run`, webhook `dranet webhook`).
#
# Why Debian's own Python and not python:3.11-slim: pyverbs is a CPython extension built from
# the rdma-core source tree and links libibverbs of that same release; a pyverbs built against
# another rdma-core fails to load (symbol/ABI mismatch). Debian ships both from ONE source
# package (python3-pyverbs and libibverbs1/ibverbs-providers, same version), compiled for
# Debian's python3 - 3.11 on bookworm, the version this project targets. So the final image
# uses Debian's /usr/bin/python3, installs the two from apt pinned to the same version, and
# runs dranet from a venv created with --system-site-packages so `import pyverbs` works.
# pyverbs stays optional in the code (import-guarded): without it discovery uses sysfs only.

ARG DEBIAN_IMAGE=debian:12.12-slim
# rdma-core source version in bookworm; every rdma package below is pinned to it.
ARG RDMA_CORE_VERSION=44.0-2
# Debian python3 in bookworm (3.11): the interpreter python3-pyverbs is compiled for.
ARG PYTHON3_VERSION=3.11.2-1+b1

# ---- builder: build the project wheel and install it with its deps into /opt/dranet ----
FROM ${DEBIAN_IMAGE} AS builder
ARG PYTHON3_VERSION
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      "python3=${PYTHON3_VERSION}" "python3-venv=${PYTHON3_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY driver ./driver
COPY dranet_proto ./dranet_proto
# The venv must sit at the same path in the final image (its scripts hard-code it).
RUN python3 -m venv --system-site-packages /opt/dranet \
 && /opt/dranet/bin/pip install --no-cache-dir --upgrade "pip>=24" "build>=1.2" \
 && /opt/dranet/bin/python -m build --wheel --outdir /wheels . \
 && /opt/dranet/bin/pip install --no-cache-dir /wheels/*.whl \
 && /opt/dranet/bin/pip uninstall -y build \
 && /opt/dranet/bin/dranet --help >/dev/null

# ---- final: Debian python3 + matching rdma-core/pyverbs + the venv ----
FROM ${DEBIAN_IMAGE}
ARG RDMA_CORE_VERSION
ARG PYTHON3_VERSION
LABEL org.opencontainers.image.title="dranet" \
      org.opencontainers.image.description="Kubernetes DRA driver for network interfaces and RDMA NICs (dra.net)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      "python3=${PYTHON3_VERSION}" \
      "libibverbs1=${RDMA_CORE_VERSION}" \
      "ibverbs-providers=${RDMA_CORE_VERSION}" \
      "librdmacm1=${RDMA_CORE_VERSION}" \
      "python3-pyverbs=${RDMA_CORE_VERSION}" \
      # vendor/device names for dra.net/pciVendor and dra.net/pciDevice (else hex IDs)
      "pci.ids=0.0~2023.04.11-1" \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/dranet /opt/dranet
ENV PATH=/opt/dranet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Fail the build, not the node, if pyverbs and libibverbs do not load together.
RUN python3 -c "import pyverbs.device" && dranet --help >/dev/null
# Non-root by default (the webhook, `dranet validate`). The node DaemonSet sets runAsUser: 0
# on purpose: netlink on the host, setns into pod namespaces, the runtime's root-only NRI
# socket and the kubelet's root-owned plugin dirs all need root (with NET_ADMIN + SYS_ADMIN).
USER 65532:65532
ENTRYPOINT ["dranet"]
CMD ["--help"]
