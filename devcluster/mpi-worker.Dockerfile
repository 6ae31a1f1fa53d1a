# The stand-in for the seed MPIJobs' image, registry.example.com/dranet/pytorch-mpi:25.09 (NGC
# PyTorch + Open MPI + sshd, examples/distributed_training/Dockerfile), which cannot be pulled
# here: exactly what the seed's worker.sh runs (bash, OpenSSH's sshd) plus iproute2 to look at
# the pod's NICs. No PyTorch, no Open MPI, no CUDA: the training itself does not run here.
# devcluster/mpijobs.py tags it in the node's containerd under the seed's image name.
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server openssh-client iproute2 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /run/sshd \
 && sed -i 's/^#\?PermitRootLogin .*/PermitRootLogin prohibit-password/' /etc/ssh/sshd_config \
 && test -x /usr/sbin/sshd && test -x /bin/bash
CMD ["/bin/bash"]
