"""The kernel's netlink: NICs moved between namespaces, configured, watched.

Two clients on the socket layer of :mod:`driver.netlink_channel`: ``rtnl`` (NETLINK_ROUTE,
hand-packed: the pod path's requests, measured against pyroute2 in ``bench.bench_hooks``) and
``ethtool_genl`` (generic netlink, ethtool family, on pyroute2's message classes in
``ethtool_messages``; ``ethtool`` resolves and applies a claim's ``ethtool`` section with it);
``namespaces`` opens their sockets inside a network namespace; ``nic_moves`` records, moves,
configures and restores NICs; ``link_watch`` turns link events into batches of (kind, ifindex,
name); ``own_changes`` is how the NRI hooks announce the links they change (and that they are
running), so their own events cost nothing.

May import: ``driver.netlink_channel`` (the socket layer and rtnetlink vocabulary), ``driver.config`` and
pyroute2's message classes.
"""
