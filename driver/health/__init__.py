"""A NIC's health, the network driver's side of device health: ``links`` (carrier and operstate
of links in the host or a pod's namespace, by netlink), ``monitor`` (every published device
assessed where it is: PCI function, link, RDMA ports, netdev; the reason an unhealthy one is
tainted with; the claims holding a removed one).
The kit (``driver.dra``) runs the check periodically, streams it to the kubelet and taints the slices.

May import: ``driver.dra`` (the health values), ``driver.checkpoint`` (where each NIC is),
``driver.claims`` (the reason a removed device's claim is told with), ``driver.netlink``
(namespaces and the route socket), ``driver.model``.
"""
