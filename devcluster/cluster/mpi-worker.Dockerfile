# The seed MPIJobs' image for this machine, made from Debian packages: the CPU build of PyTorch
# (python3-torch, with gloo), Open MPI (mpirun, orted) with UCX, mpi4py and the verbs providers
# (rdma_allreduce.py over the pods' RDMA devices, Soft-RoCE's among them), OpenSSH (the workers' sshd, the
# launcher's ssh), numactl/libnuma (placement.py's memory policy) and iproute2 (to look at the
# pod's NICs). No CUDA and no registry: devcluster tags it in every node's containerd under the
# name the seed's manifests use (registry.example.com/dranet/pytorch-mpi:25.09), whose real
# build is examples/distributed_training/Dockerfile (NGC PyTorch, NCCL, GPUs).
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}
# The MPI Operator mounts ~/.ssh from a Secret: a read-only, world-writable tmpfs, so sshd's
# StrictModes would refuse its keys and ssh could not record known hosts (as upstream's base image).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3-torch openmpi-bin python3-mpi4py ibverbs-providers openssh-server openssh-client numactl libnuma1 iproute2 procps \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && mkdir -p /run/sshd \
 && sed -i 's/^#\?PermitRootLogin .*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config \
 && sed -i 's/^#\?StrictModes .*/StrictModes no/' /etc/ssh/sshd_config \
 && printf 'Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n' >> /etc/ssh/ssh_config \
 && python3 -c "import torch, torch.distributed as d; assert d.is_gloo_available(); print('torch', torch.__version__)" \
 && test -x /usr/sbin/sshd && command -v mpirun && test -x /bin/bash
CMD ["/bin/bash"]
