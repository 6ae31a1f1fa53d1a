"""The kernel's netlink: NICs moved between namespaces and back, found by what they are, watched.

All of the driver's netlink is here. ``channel`` is the one socket layer (framing, sequence
numbers, pipelined requests, the rtnetlink vocabulary), with two clients over it: ``rtnl``
(NETLINK_ROUTE, hand-packed: the pod path's requests, measured against pyroute2 in
``bench.bench_hooks``), ``ethtool_genl`` (generic netlink, ethtool family, on pyroute2's message
classes in ``ethtool_messages``) and ``rdma_nldev`` (NETLINK_RDMA: the RDMA netns mode, RDMA
devices moved, soft ones made and deleted, the probe of rxe's namespaces); ``namespaces`` opens
their sockets inside a network namespace;
``bpf_attachments`` lists the eBPF programs attached to a link (for discovery and the NIC
settings); ``link_info`` is the one parser of an ``RTM_NEWLINK`` answer (discovery reads links
through it too), and with ``link_identity`` tells a NIC from every other link;
``nic_moves`` records a NIC's link, moves it in two checked steps and runs the pod's configuration
batch, ``nic_home`` finds it again and brings it home; ``mtu_limits`` is what MTU it can take;
``link_watch`` turns link events into batches of (kind, ifindex, name); ``hook_activity`` is how
the NRI hooks announce the links they change (and that they are running), so their own events cost
nothing. What a claim sets on a NIC (addresses, rules, sysctls, ...) is ``driver.nic_settings``'.

May import: ``driver.config`` and pyroute2's message classes (the socket layer and the
rtnetlink vocabulary are its own ``channel``).
"""
