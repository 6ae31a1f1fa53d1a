"""A real node (containerd, the kubelet, the driver) on a stock kernel under QEMU, joined to a
control plane on this machine: RDMA between pods where this machine's kernel has none."""
