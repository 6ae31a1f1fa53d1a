"""What a claim sets on a NIC in a pod, one module per setting, each behind one interface.

``setting`` defines the interface (``NicSetting``: check against the NIC, record what the host
had, apply in the pod, undo) and the plan of one NIC the NRI hooks and the settings share (``Nic``);
``registry`` lists the settings in the kernel's order. One module per setting: ``addresses``
(addresses, the link up, routes), ``rules``, ``neighbors``, ``sysctls``, ``ethtool``,
``offload_sizes`` (GSO/GRO), ``vrf``, ``dhcp``, ``ebpf`` (programs detached), ``rdma`` (the RDMA
device following its netdev). Each reads its part of the typed claim config
(``driver.api.v1alpha1``) and owns the rest: its netlink messages, its checks, its record in the
pod state (by its name), its undoing.

May import: ``driver.checkpoint`` (the prepared devices and the pod state's records),
``driver.netlink`` (with its socket layer and the eBPF attachments), ``driver.dhcp``,
``driver.inventory`` (RDMA devices in sysfs), ``driver.api``, ``driver.model``, ``driver.config``.
"""
