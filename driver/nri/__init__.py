"""The container runtime's side: an NRI plugin (``mux`` and ``ttrpc`` framing, ``plugin``
lifecycle) whose ``hooks`` move a pod's NICs in at RunPodSandbox (``nic_attach``) and back at Stop/Remove
(``nic_return``), and
whose ``container_adjustment`` gives each container its RDMA devices, environment and cpuset;
``pod_dhcp`` takes the DHCP leases of ``interface.dhcp`` NICs in the pod and releases them.

May import: ``driver.claims``, ``driver.checkpoint``, ``driver.netlink``, ``driver.dhcp``, ``driver.model``,
``dranet_proto``, ``driver.config``.
"""
